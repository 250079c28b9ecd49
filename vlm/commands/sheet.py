"""A contact sheet of scenes with some of their questions and answers, to check them by eye."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vlm.viz import contact_sheet

TYPE_COLORS = {"detection": (20, 90, 170), "counting": (150, 60, 10), "traffic_light": (180, 20, 20),
               "spatial": (20, 120, 60), "safety": (120, 20, 140), "scene": (60, 60, 60)}


def pick_images(image_ids: list[str], n: int = 16, seed: int = 0) -> list[str]:
    """``n`` of the sorted ``image_ids`` picked at random (seeded), in id order: the images of the sheet."""
    ids = sorted(image_ids)
    return [ids[i] for i in sorted(np.random.default_rng(seed).choice(len(ids), size=min(n, len(ids)),
                                                                      replace=False))]


def commands_sheet(images: list[tuple[Path, list[dict]]], per_image: int = 4) -> Image.Image:
    """One tile per ``(image file, its question records)``, with up to ``per_image`` Q/A lines."""
    tiles = []
    for path, records in images:
        questions = sorted(records, key=lambda r: r["command_type"])[:per_image]
        with Image.open(path) as image:
            image.draft("RGB", (image.width // 4, image.height // 4))
            lines = [(f"{r['command']} {r['answer'].upper()}", TYPE_COLORS[r["command_type"]]) for r in questions]
            tiles.append((image.convert("RGB"), lines))
    return contact_sheet(tiles, columns=4, max_lines=per_image)
