"""A contact sheet of scenes with some of their questions and answers, to check them by eye."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vlm.viz import contact_sheet

TYPE_COLORS = {"detection": (20, 90, 170), "counting": (150, 60, 10), "traffic_light": (180, 20, 20),
               "spatial": (20, 120, 60), "safety": (120, 20, 140), "scene": (60, 60, 60)}


def commands_sheet(records: list[dict], image_paths: dict[str, Path], n: int = 16, per_image: int = 4,
                   seed: int = 0) -> Image.Image:
    """``n`` images picked at random (seeded) from ``records``, each with up to ``per_image`` Q/A lines.

    ``image_paths`` maps an image id to its file.
    """
    by_image: dict[str, list[dict]] = {}
    for r in records:
        by_image.setdefault(r["image_id"], []).append(r)
    ids = sorted(by_image)
    pick = sorted(np.random.default_rng(seed).choice(len(ids), size=min(n, len(ids)), replace=False))
    tiles = []
    for i in pick:
        image_id = ids[i]
        questions = sorted(by_image[image_id], key=lambda r: r["command_type"])[:per_image]
        with Image.open(image_paths[image_id]) as image:
            image.draft("RGB", (image.width // 4, image.height // 4))
            lines = [(f"{r['command']} {r['answer'].upper()}", TYPE_COLORS[r["command_type"]]) for r in questions]
            tiles.append((image.convert("RGB"), lines))
    return contact_sheet(tiles, columns=4, max_lines=per_image)
