"""How the grounding head sees traffic lights, the decoder left out: on every frame whose governing light has a colour
(a split's rendered frames, the test split's by default, and a folder of real frames in BDD100K's layout), the head's
highest light probability over the patches per colour (what its light tokens give the decoder). Per true colour: the
median of each colour's, the share of lights found (the true colour's at 0.5 or more) and read (the most probable
colour is the true one). Writes aggregates only.

    PYTHONPATH=. .venv/bin/python benchmarks/light_probe.py --root /path/to/bdd100k_val \
        --out metrics/light_probe.json   # after make repro; --split train: the frames it trained on
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from vlm.checkpoint import file_sha256, load_model
from vlm.commands.rules import governing_light, light_colors_labelled
from vlm.config import build_config
from vlm.io import read_json
from vlm.models.perception import image_head_logits
from vlm.real import RealConfig, read_frames
from vlm.scenes.schema import LIGHT_COLORS, scene_from_frame


def highest_light_probabilities(loaded, images: list[torch.Tensor], batch_size: int = 64) -> np.ndarray:
    """``[N, 3]``: per image, the grounding head's highest probability over the patches of each light colour."""
    grounding = loaded.model.extension.heads["grounding"]
    rows = []
    for start in range(0, len(images), batch_size):
        logits = image_head_logits(loaded.model, torch.stack(images[start:start + batch_size]))["grounding"]
        rows.append(grounding.tokens(logits)[..., 0].numpy())  # [n, 3]: the highest probability of each colour
    return np.concatenate(rows) if rows else np.zeros((0, len(LIGHT_COLORS)))


def summary(colors: list[str], probabilities: np.ndarray) -> dict[str, dict]:
    """Per true colour: lights, the median highest probability of each colour, found and read shares."""
    colors, probabilities = np.asarray(colors), np.asarray(probabilities, dtype=np.float64)
    report = {}
    for k, color in enumerate(LIGHT_COLORS):
        mine = probabilities[colors == color]
        if len(mine):
            report[color] = {"lights": len(mine),
                             "median_highest": dict(zip(LIGHT_COLORS, np.median(mine, axis=0).round(3).tolist())),
                             "found": round(float((mine[:, k] >= 0.5).mean()), 3),
                             "read": round(float((mine.argmax(axis=1) == k).mean()), 3)}
    return report


def probe(loaded, scenes, image_of) -> dict[str, dict]:
    """The summary over ``scenes`` whose governing light has a colour; ``image_of(scene)``: its image file."""
    lit = [s for s in scenes if light_colors_labelled(s) and governing_light(s) is not None]
    images = [loaded.processor.image(image_of(s)) for s in lit]
    return summary([governing_light(s).light_color for s in lit], highest_light_probabilities(loaded, images))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=None, help="a folder of labelled frames in BDD100K's layout")
    parser.add_argument("--model", type=Path, default=Path("models/vlm.pt"))
    parser.add_argument("--vocab", type=Path, default=Path("data/processed/vocab.json"))
    parser.add_argument("--raw", type=Path, default=Path("data/raw"), help="the rendered frames (generate_scenes)")
    parser.add_argument("--commands", type=Path, default=Path("data/processed/commands"))
    parser.add_argument("--split", default="test", choices=("train", "val", "test"), help="the rendered frames' split")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    loaded = load_model(args.model, args.vocab)
    split = {q["image_id"] for q in read_json(args.commands / f"{args.split}.json")}
    rendered = [scene_from_frame(f) for f in read_json(args.raw / "labels.json") if Path(f["name"]).stem in split]
    report = {"command": "PYTHONPATH=. .venv/bin/python benchmarks/light_probe.py --root /path/to/bdd100k_val "
                         f"--split {args.split} --out {args.out}", "model_sha256": file_sha256(args.model),
              f"synthetic_{args.split}": probe(loaded, rendered, lambda s: args.raw / "images" / s.name)}
    if args.root:
        scenes, image_dir, _ = read_frames(build_config(RealConfig, {"root": args.root}, "real"))
        report["real"] = probe(loaded, scenes, lambda s: image_dir / s.name)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
