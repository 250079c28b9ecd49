"""The tests' tiny project: the one params dict of a tiny run, and the one builder of a tiny data project.

``build_project`` writes ``root/data/{raw,processed}`` as the pipeline lays them out, from one of two kinds
of frames:

- ``frames="rendered"``: synthetic scenes rendered, questioned, tokenised and packed by the real stage logic
  (40 scenes at 32 px by default). Small enough that a model trains on it in seconds with ``TINY_MODEL``.
- ``frames="colours"``: hand-made frames of known pixels with one question per template (``TEMPLATES``) each:
  every image is split vertically into a left colour and a right colour, distinct per image
  (``image_colours``), so the data tests can tell images apart and check a mirror.

``TINY_PIPELINE_PARAMS`` is the one tiny params dict (``TINY_MODEL`` its model section): the params.yaml
overrides of a whole tiny `dvc repro`, of each stage run on its own (test_stage_params.py) and, with a few
train overrides, of the train stage run by hand (test_ddp.py, test_benchmarks.py); the conftest's
``tiny_params`` fixture hands out copies. ``tiny_train_config`` and ``TINY_RUNTIME`` are the train settings of
the runs in-process (test_train.py and others).

tests/conftest.py builds each kind once per test session (``tiny_project``, ``colour_project``) for the tests
that only read it; a test that writes into a project builds its own, or copies one (``TinyProject.copy_to``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from vlm.commands.generate import BalancedCommands, CommandsConfig
from vlm.data.pack import PackConfig, PackRuntime, pack_dataset
from vlm.io import read_json
from vlm.scenes.generate import ScenesConfig, ScenesRuntime, generate_synthetic, load_raw
from vlm.tokenizer import TrafficCommandTokenizer
from vlm.train import TrainConfig, TrainPaths, TrainRuntime

TINY_MODEL = {
    "perception": {"stem_channels": [4, 8, 8], "heads": {"grounding": 1.0, "centres": 0.1, "counts": 0.1},
                   "to_decoder": True},
    "siglip": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
               "patch_size": 8},
    "gemma": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1},
    "qformer": {"num_query_tokens": 4, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 64},
}


# params.yaml overrides for a whole `dvc repro` in well under a minute (tests/pipeline.py's DvcProject)
TINY_PIPELINE_PARAMS = {
    "scenes": {"num_images": 48},
    "commands": {"questions_per_image": 6},
    "pack": {"image_size": 32},
    "model": TINY_MODEL,
    "train": {"epochs": 1, "batch_size": 16, "lr": 0.003, "warmup_steps": 2},
    "evaluate": {"attention_examples": 2, "failure_examples": 2},
    "counterfactuals": {"samples": 4, "sheet_examples": 2},
    "profile": {"workers": [0], "batch_sizes": [32], "extra_image_sizes": [48], "warmup_batches": 1, "batches": 2,
                "rounds": 1, "max_images": 16},
    "runtime": {"scenes": {"workers": 2}, "pack": {"workers": 1}, "train": {"threads": 1}},
}


FRAME_SIZE = (ScenesConfig().width, ScenesConfig().height)  # the frames build_project renders

PACK_SIZE = 32  # pixels a side of the packed images, either kind of frames

# frames="colours": images per split, their size, and (command, answer, command_type): one question per
# template per image.
SPLIT_SIZES = {"train": 6, "val": 2, "test": 2}
IMAGE_WIDTH, IMAGE_HEIGHT = 96, 64
TEMPLATES = [
    ("Is there a car in the left third of the image?", "yes", "spatial"),
    ("Can the car safely turn left?", "no", "safety"),
    ("Does the pedestrian have the right of way?", "maybe", "safety"),
    ("What color is the traffic light?", "red", "traffic_light"),
    ("How many cars are there?", "2", "counting"),
]


@dataclass
class TinyProject:
    root: Path
    records: dict[str, list[dict]]  # the questions of each split, as in data/processed/commands/{split}.json

    @property
    def raw(self) -> Path:
        return self.root / "data" / "raw"

    @property
    def labels(self) -> Path:
        return self.raw / "labels.json"

    @property
    def source(self) -> Path:
        return self.raw / "source.json"

    @property
    def image_dir(self) -> Path:
        return self.raw / "images"

    @property
    def processed(self) -> Path:
        return self.root / "data" / "processed"

    @property
    def commands_dir(self) -> Path:
        return self.processed / "commands"

    def commands(self, split: str) -> Path:
        return self.commands_dir / f"{split}.json"

    def h5(self, split: str) -> Path:
        return self.processed / f"{split}_images.h5"

    def tokenizer(self) -> TrafficCommandTokenizer:
        return TrafficCommandTokenizer.build_vocab(self.records["train"])

    def pack(self, *, workers: int = 1, chunksize: int = 16, side_multiple: int = 1, **config) -> dict:
        return pack_dataset(self.labels, self.source, self.commands_dir, self.processed,
                            PackConfig(**{"image_size": PACK_SIZE, "aspect": "square"} | config), root=self.root,
                            runtime=PackRuntime(workers=workers, chunksize=chunksize), side_multiple=side_multiple)

    def pack_native(self) -> dict:
        """Repack at the frames' aspect (``pack.aspect: native``), the width a multiple of 16 (patch 8, pixel
        shuffle 2: TINY_MODEL's): colour frames (96 x 64) become 48 x 32, rendered ones (1280 x 720) 64 x 32."""
        source = read_json(self.source)
        if "width" not in source:  # colour frames: source.json names no size
            self.source.write_text(json.dumps(source | {"width": IMAGE_WIDTH, "height": IMAGE_HEIGHT}))
        return self.pack(aspect="native", side_multiple=16)

    def copy_to(self, root: Path) -> TinyProject:
        """A copy to write into (``frames="colours"``: its source.json names its images relative to the root)."""
        shutil.copytree(self.root, root)
        return replace(self, root=root)


def build_project(root: Path, num_images: int = 40, *, frames: Literal["rendered", "colours"] = "rendered",
                  split_sizes: dict[str, int] = SPLIT_SIZES, pack: bool = True) -> TinyProject:
    """Write ``root/data/{raw,processed}``: the frames, their labels and questions, for ``frames="rendered"`` the
    vocabulary, and the packed splits (unless ``pack=False``). ``num_images`` counts rendered frames;
    ``split_sizes`` the colour frames of each split."""
    if frames == "rendered":
        project = _rendered(root, num_images)
    else:
        project = _colours(root, split_sizes)
    if pack:
        project.pack()
    return project


def _rendered(root: Path, num_images: int) -> TinyProject:
    project = TinyProject(root, {})
    generate_synthetic(ScenesConfig(num_images=num_images), project.raw, progress=False,
                       runtime=ScenesRuntime(workers=1))
    data = load_raw(project.raw)
    BalancedCommands(data.iter_scenes, data.width, data.height, CommandsConfig(questions_per_image=6)).write(
        project.commands_dir)
    project.records.update((split, read_json(project.commands(split))) for split in SPLIT_SIZES)
    project.tokenizer().save_vocab(project.processed / "vocab.json")
    return project


def image_colours(index: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(left, right) colours of colour frame ``index``: saturated, distinct per image and per side."""
    left = (200, 40 + 20 * index, 40)
    right = (40, 40 + 20 * index, 200)
    return left, right


def write_jpeg(path: Path, index: int, size: tuple[int, int] = (IMAGE_WIDTH, IMAGE_HEIGHT)) -> None:
    width, height = size
    pixels = np.empty((height, width, 3), dtype=np.uint8)
    left, right = image_colours(index)
    pixels[:, : width // 2] = left
    pixels[:, width // 2:] = right
    Image.fromarray(pixels).save(path, quality=95)


def _colours(root: Path, split_sizes: dict[str, int]) -> TinyProject:
    """JPEGs + BDD100K-style labels + source.json + commands for each split."""
    project = TinyProject(root, {})
    project.image_dir.mkdir(parents=True)
    project.commands_dir.mkdir(parents=True)
    frames = []
    index = 0
    question = 0
    for split, count in split_sizes.items():
        records = project.records[split] = []
        for _ in range(count):
            name = f"img{index:04d}"
            write_jpeg(project.image_dir / f"{name}.jpg", index)
            frames.append({"name": f"{name}.jpg", "attributes": {"weather": "clear", "scene": "city street",
                                                                  "timeofday": "daytime"},
                           "labels": [{"id": str(index), "category": "car", "attributes": {"occluded": False},
                                       "box2d": {"x1": 1.0, "y1": 2.0, "x2": 30.5, "y2": 40.0}}]})
            for command, answer, command_type in TEMPLATES:
                records.append({
                    "question_id": f"q{question:06d}", "image_id": name, "command": command, "answer": answer,
                    "command_type": command_type, "template": command_type,
                    "metadata": {"scene_type": "city street", "weather": "clear", "timeofday": "daytime",
                                 "num_objects": 1},
                })
                question += 1
            index += 1
        records.sort(key=lambda r: (r["command"], r["image_id"]))  # an image's questions scattered
        project.commands(split).write_text(json.dumps(records))
    project.labels.write_text(json.dumps(frames))
    project.source.write_text(json.dumps({"source": "synthetic", "image_dir": "data/raw/images"}))
    return project


def tiny_train_config(**overrides) -> TrainConfig:
    values = {"epochs": 2, "batch_size": 16, "lr": 3e-3, "warmup_steps": 2} | overrides
    return TrainConfig(**values)


# one thread (the tests share the machine's cores), a resume checkpoint every 3 steps
TINY_RUNTIME = TrainRuntime(threads=1, checkpoint_every=3, eval_batch_size=64)


def paths_for(processed: Path, out: Path, name: str = "vlm") -> TrainPaths:
    return TrainPaths(data=processed, model=out / f"{name}.pt", checkpoints=out / "checkpoints",
                      metrics=out / f"train_{name}.json",
                      timing=out / f"train_{name}_timing.json", live=out / "dvclive" / name)
