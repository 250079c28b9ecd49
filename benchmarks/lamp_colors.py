"""What colour a lit traffic-light lamp is in a dashcam's frame: for every traffic light whose labels give its colour,
the median RGB of the brightest tenth of its box's pixels (the lamp) and of the whole box (the lamp, its glare and the
housing), per colour and by night or not, in a folder of real frames in BDD100K's layout beside the default run's
rendered frames (``generate_scenes``' output, as stored). Writes aggregates only (no pixel or box of a frame).

    PYTHONPATH=. .venv/bin/python benchmarks/lamp_colors.py --root /path/to/bdd100k_val --out metrics/lamp_colors.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from PIL import Image

from vlm.config import build_config
from vlm.io import read_json
from vlm.real import RealConfig, read_frames
from vlm.scenes.schema import scene_from_frame

BRIGHTEST = 0.9  # the lamp: the box's pixels at or above this quantile of brightness


def lamp_pixels(image: np.ndarray, scene) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(colour, the lamp's mean RGB, the box's mean RGB) of each light in ``scene`` whose colour is labelled."""
    found = []
    for obj in scene.objects:
        if obj.category != "traffic light" or obj.light_color is None:
            continue
        x1, y1, x2, y2 = (int(round(v)) for v in obj.box)
        box = image[y1:y2 + 1, x1:x2 + 1].reshape(-1, 3).astype(np.float32)
        if len(box) < 4:
            continue
        brightness = box.mean(axis=1)
        found.append((obj.light_color, box[brightness >= np.quantile(brightness, BRIGHTEST)].mean(axis=0),
                      box.mean(axis=0)))
    return found


def summarise(samples: dict[tuple[str, bool], list[tuple[np.ndarray, np.ndarray]]]) -> dict[str, dict]:
    return {f"{color}/{'night' if night else 'day'}": {
        "lights": len(values), "lamp_rgb": np.median([lamp for lamp, _ in values], axis=0).round().tolist(),
        "box_rgb": np.median([box for _, box in values], axis=0).round().tolist()}
        for (color, night), values in sorted(samples.items())}


def measure(frames) -> dict[str, dict]:
    """``frames``: (RGB array, scene) pairs."""
    samples = defaultdict(list)
    for image, scene in frames:
        for color, lamp, box in lamp_pixels(image, scene):
            samples[(color, scene.timeofday == "night")].append((lamp, box))
    return summarise(samples)


def frames(scenes, image_dir: Path):
    """(RGB array, scene) of each of ``scenes``, its image read from ``image_dir``."""
    for scene in scenes:
        with Image.open(image_dir / scene.name) as image:
            yield np.asarray(image.convert("RGB")), scene


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="a folder of labelled frames in BDD100K's layout")
    parser.add_argument("--raw", type=Path, default=Path("data/raw"), help="the rendered frames (generate_scenes)")
    parser.add_argument("--renders", type=int, default=300, help="rendered frames to measure beside them")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    scenes, image_dir, _ = read_frames(build_config(RealConfig, {"root": args.root}, "real"))

    rendered = [scene_from_frame(f) for f in read_json(args.raw / "labels.json")[:args.renders]]
    report = {"command": "PYTHONPATH=. .venv/bin/python benchmarks/lamp_colors.py --root /path/to/bdd100k_val "
                         f"--renders {args.renders} --out {args.out}",
              "real": measure(frames(scenes, image_dir)), "rendered": measure(frames(rendered, args.raw / "images"))}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
