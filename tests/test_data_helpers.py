"""Shared builders for the data tests: a tiny scene project (JPEGs, labels, commands) and its pack.

Every image is split vertically: a left colour and a right colour, distinct per image, so tests
can tell images apart and check a mirror. Imported by test_pack*.py, test_data*.py, test_profile*.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from vlm.data.pack import PackConfig, pack_dataset
from vlm.tokenizer import TrafficCommandTokenizer

SPLIT_SIZES = {"train": 6, "val": 2, "test": 2}
IMAGE_WIDTH, IMAGE_HEIGHT = 96, 64
PACK_SIZE = 32

# (command, answer, command_type): one question per template per image.
TEMPLATES = [
    ("Is there a car in the left third of the image?", "yes", "spatial"),
    ("Can the car safely turn left?", "no", "safety"),
    ("Does the pedestrian have the right of way?", "maybe", "safety"),
    ("What color is the traffic light?", "red", "traffic_light"),
    ("How many cars are there?", "2", "counting"),
]


def image_colours(index: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(left, right) colours of image ``index``: saturated, distinct per image and per side."""
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


@dataclass
class SceneProject:
    root: Path
    labels: Path
    source: Path
    commands_dir: Path
    processed: Path
    image_dir: Path
    records: dict[str, list[dict]]

    def commands(self, split: str) -> Path:
        return self.commands_dir / f"{split}.json"

    def h5(self, split: str) -> Path:
        return self.processed / f"{split}_images.h5"

    def tokenizer(self) -> TrafficCommandTokenizer:
        return TrafficCommandTokenizer.build_vocab(self.records["train"])

    def pack(self, **config) -> dict:
        return pack_dataset(self.labels, self.source, self.commands_dir, self.processed,
                            PackConfig(**{"image_size": PACK_SIZE, "workers": 1} | config), root=self.root)


def write_scene_project(root: Path, split_sizes: dict[str, int] = SPLIT_SIZES) -> SceneProject:
    """JPEGs + BDD100K-style labels + source.json + commands for each split, under ``root``."""
    image_dir = root / "data" / "raw" / "images"
    commands_dir = root / "data" / "processed" / "commands"
    image_dir.mkdir(parents=True)
    commands_dir.mkdir(parents=True)
    frames, records = [], {}
    index = 0
    question = 0
    for split, count in split_sizes.items():
        records[split] = []
        for _ in range(count):
            name = f"img{index:04d}"
            write_jpeg(image_dir / f"{name}.jpg", index)
            frames.append({"name": f"{name}.jpg", "attributes": {"weather": "clear", "scene": "city street",
                                                                  "timeofday": "daytime"},
                           "labels": [{"id": str(index), "category": "car", "attributes": {"occluded": False},
                                       "box2d": {"x1": 1.0, "y1": 2.0, "x2": 30.5, "y2": 40.0}}]})
            for command, answer, command_type in TEMPLATES:
                records[split].append({
                    "question_id": f"q{question:06d}", "image_id": name, "command": command, "answer": answer,
                    "command_type": command_type, "template": command_type,
                    "metadata": {"scene_type": "city street", "weather": "clear", "timeofday": "daytime",
                                 "num_objects": 1},
                })
                question += 1
            index += 1
        records[split].sort(key=lambda r: (r["command"], r["image_id"]))  # an image's questions scattered
        (commands_dir / f"{split}.json").write_text(json.dumps(records[split]))
    labels = root / "data" / "raw" / "labels.json"
    labels.write_text(json.dumps(frames))
    source = root / "data" / "raw" / "source.json"
    source.write_text(json.dumps({"source": "synthetic", "image_dir": "data/raw/images"}))
    return SceneProject(root, labels, source, commands_dir, root / "data" / "processed", image_dir, records)
