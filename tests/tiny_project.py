"""A complete, tiny project built with the real stage logic: scenes, commands, vocab, packed HDF5.

Small enough that a model trains on it in seconds: 40 synthetic scenes packed at 32 px, and a
model of a few thousand parameters.
"""

from __future__ import annotations

from pathlib import Path

from vlm.commands.generate import BalancedCommands, CommandsConfig
from vlm.data.pack import PackConfig, pack_dataset
from vlm.io import read_json
from vlm.scenes.generate import ScenesConfig, generate_synthetic, load_raw
from vlm.tokenizer import TrafficCommandTokenizer
from vlm.train import TrainConfig, TrainPaths

TINY_MODEL = {
    "perception": {"stem_channels": [4, 8, 8], "heads": {"grounding": 1.0, "centres": 0.1}, "to_decoder": True},
    "siglip": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
               "patch_size": 8},
    "gemma": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1},
    "qformer": {"num_query_tokens": 4, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 64},
}


# params.yaml overrides for a whole `dvc repro` in well under a minute (tests/pipeline.py's DvcProject)
TINY_PIPELINE_PARAMS = {
    "scenes": {"num_images": 48, "workers": 2},
    "commands": {"questions_per_image": 6},
    "pack": {"image_size": 32, "workers": 1},
    "model": TINY_MODEL,
    "train": {"epochs": 1, "batch_size": 16, "lr": 0.003, "warmup_steps": 2, "threads": 1},
    "evaluate": {"attention_examples": 2, "failure_examples": 2},
    "counterfactuals": {"samples": 4, "sheet_examples": 2},
    "profile": {"workers": [0], "batch_sizes": [32], "extra_image_sizes": [48], "warmup_batches": 1, "batches": 2,
                "rounds": 1, "max_images": 16},
}


FRAME_SIZE = (ScenesConfig().width, ScenesConfig().height)  # the frames build_project renders


def build_project(root: Path, num_images: int = 40) -> Path:
    """Write ``root/data/{raw,processed}``; return the processed folder."""
    raw = root / "data" / "raw"
    processed = root / "data" / "processed"
    generate_synthetic(ScenesConfig(num_images=num_images, workers=1), raw, progress=False)
    data = load_raw(raw)
    BalancedCommands(data.iter_scenes, data.width, data.height, CommandsConfig(questions_per_image=6)).write(
        processed / "commands")
    TrafficCommandTokenizer.build_vocab(read_json(processed / "commands" / "train.json")).save_vocab(
        processed / "vocab.json")
    pack_dataset(raw / "labels.json", raw / "source.json", processed / "commands", processed,
                 PackConfig(image_size=32, workers=1))
    return processed


def tiny_train_config(**overrides) -> TrainConfig:
    values = {"epochs": 2, "batch_size": 16, "lr": 3e-3, "warmup_steps": 2, "checkpoint_every": 3,
              "eval_batch_size": 64, "threads": 1} | overrides
    return TrainConfig(**values)


def paths_for(processed: Path, out: Path, name: str = "vlm") -> TrainPaths:
    return TrainPaths(data=processed, model=out / f"{name}.pt", checkpoints=out / "checkpoints",
                      metrics=out / f"train_{name}.json",
                      timing=out / f"train_{name}_timing.json", live=out / "dvclive" / name)
