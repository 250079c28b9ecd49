"""BDD100K's label statistics, which the renderer draws its world from (docs/architecture.md, generate_scenes).

``python -m vlm.scenes.statistics LABELS.json [--occlusion FRAMES.csv] --out vlm/scenes/bdd100k_statistics.json``
derives them from a BDD100K labels file (either dialect) into a small JSON file: the frame-attribute mix, the
objects per frame of each category by scene type, the quantiles of each category's box sizes and positions, and the
share of occluded objects. Statistics only: no frame, name or box of the labels file is kept."""

import argparse
import csv
import functools
import hashlib
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from vlm.io import read_json, write_json
from vlm.scenes.schema import CATEGORIES, UNDEFINED, LabelError, Scene, scene_from_frame

PACKAGED = Path(__file__).with_name("bdd100k_statistics.json")  # the committed statistics the renderer reads
QUANTILES = tuple(np.linspace(0.0, 1.0, 21).round(2))  # 0, 0.05, ..., 1
SCENE_TYPES = ("city street", "highway", "residential")  # the scene types the renderer draws
FRAME_SIZE = (1280, 720)  # BDD100K's frames: box sizes are in these pixels


def _shares(values: list[str]) -> dict[str, float]:
    """Each defined value's share of the defined values, most common first."""
    counts = Counter(v for v in values if v != UNDEFINED)
    total = sum(counts.values())
    return {value: round(n / total, 4) for value, n in counts.most_common()}


def _quantiles(values: list[float]) -> list[float]:
    return [round(float(q), 2) for q in np.quantile(np.asarray(values, dtype=np.float64), QUANTILES)] if values \
        else []


def derive(scenes: list[Scene], occlusion_rows: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """The statistics of ``scenes`` (1280 x 720 frames); ``occlusion_rows``: BDD100K's per-frame occluded share
    (``object_count``, ``occluded_ratio``), for the share of occluded objects."""
    per_frame: dict[str, dict[str, Counter]] = {s: {c: Counter() for c in CATEGORIES} for s in SCENE_TYPES}
    heights: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    widths: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    centres: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    bottoms: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    width, height = FRAME_SIZE
    for scene in scenes:
        counts = Counter(o.category for o in scene.objects)
        if scene.scene in per_frame:
            for category in CATEGORIES:
                per_frame[scene.scene][category][counts[category]] += 1
        for o in scene.objects:
            x1, y1, x2, y2 = o.box
            heights[o.category].append(y2 - y1)
            widths[o.category].append(x2 - x1)
            centres[o.category].append((x1 + x2) / 2 / width)
            bottoms[o.category].append(y2 / height)
    stats: dict[str, Any] = {
        "frames": len(scenes),
        "frame_size": list(FRAME_SIZE),
        "attributes": {key: _shares([getattr(s, key) for s in scenes]) for key in ("timeofday", "weather", "scene")},
        # per scene type and category: the share of frames with n objects, n = 0, 1, ... (the last the most seen)
        "objects_per_frame": {
            scene_type: {category: [round(hist[n] / max(1, sum(hist.values())), 5)
                                    for n in range(max(hist, default=0) + 1)]
                         for category, hist in by_category.items()}
            for scene_type, by_category in per_frame.items()},
        "quantiles": list(QUANTILES),
        "box_height": {c: _quantiles(v) for c, v in heights.items()},  # pixels
        "box_width": {c: _quantiles(v) for c, v in widths.items()},  # pixels
        "centre_x": {c: _quantiles(v) for c, v in centres.items()},  # fraction of the width
        "bottom_y": {c: _quantiles(v) for c, v in bottoms.items()},  # fraction of the height
    }
    if occlusion_rows:
        objects = sum(int(r["object_count"]) for r in occlusion_rows)
        occluded = sum(int(r["object_count"]) * float(r["occluded_ratio"]) for r in occlusion_rows)
        stats["occluded_share"] = round(occluded / objects, 4)
    return stats


def read_scenes(path: Path) -> list[Scene]:
    """Every frame of a BDD100K labels file, as scenes (frames of ``labels: null`` as empty)."""
    frames = read_json(path, what="BDD100K labels file")
    if isinstance(frames, dict) and "frames" in frames:
        frames = frames["frames"]
    if not isinstance(frames, list):
        raise LabelError(f"{path}: expected a JSON list of frames, got {type(frames).__name__}")
    try:
        return [scene_from_frame(frame, f"frame[{i}]") for i, frame in enumerate(frames)]
    except LabelError as e:
        raise LabelError(f"{path}: {e}") from None


def read_occlusion(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    missing = {"object_count", "occluded_ratio"} - set(rows[0] if rows else {})
    if missing:
        raise ValueError(f"{path}: no column {', '.join(sorted(missing))} (one row per frame expected)")
    return [r for r in rows if r["occluded_ratio"] and math.isfinite(float(r["occluded_ratio"]))]


@functools.lru_cache(maxsize=4)
def load(path: Path = PACKAGED) -> dict[str, Any]:
    """The statistics at ``path`` (read once per process; not to be modified)."""
    return read_json(path, what="BDD100K statistics file")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vlm.scenes.statistics", description=__doc__.splitlines()[0])
    parser.add_argument("labels", type=Path, help="a BDD100K labels JSON (2018 or det_20)")
    parser.add_argument("--occlusion", type=Path, help="a CSV of frames with object_count and occluded_ratio")
    parser.add_argument("--out", type=Path, default=PACKAGED)
    args = parser.parse_args(argv)
    stats = derive(read_scenes(args.labels), read_occlusion(args.occlusion) if args.occlusion else None)
    with open(args.labels, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    stats = {"source": {"labels": args.labels.name, "labels_sha256": digest,
                        "occlusion": args.occlusion.name if args.occlusion else None,
                        "command": f"python -m vlm.scenes.statistics /path/to/{args.labels.name}"
                                   + (f" --occlusion /path/to/{args.occlusion.name}" if args.occlusion else "")},
             **stats}
    write_json(args.out, stats)
    print(f"{stats['frames']} frames -> {args.out}")


if __name__ == "__main__":
    main()
