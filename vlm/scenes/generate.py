"""The ``generate_scenes`` stage: synthetic scenes rendered in parallel, or a BDD100K folder read.

Either way the stage writes one folder (``data/raw`` by default), replaced atomically:
``labels.json`` (BDD100K det_20 format, one frame per line), ``source.json`` (where the images are and
their size) and, for the synthetic source, ``images/*.jpg``.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm import tqdm

from vlm.io import atomic_path, read_json, write_json_list
from vlm.params import ParamError
from vlm.scenes.bdd100k import match_images, read_labels
from vlm.scenes.render import RenderConfig, render_scene
from vlm.scenes.schema import Scene, scene_from_frame, scene_to_frame


@dataclass
class BDD100KConfig:
    # The dataset folder, a dependency of generate_scenes in dvc.yaml: a changed label or image under it
    # re-runs the pipeline. images and labels are relative to it (BDD100K's own layout by default).
    root: str = "data/bdd100k"
    images: str = "images/100k/train"
    labels: str = "labels/det_20/det_train.json"
    on_missing: Literal["error", "skip"] = "error"
    max_images: int | None = None  # a seeded random subset of this many frames; null for all


@dataclass
class ScenesConfig:
    source: Literal["synthetic", "bdd100k"] = "synthetic"
    num_images: int = 4000
    seed: int = 0
    width: int = 1280
    height: int = 720
    jpeg_quality: int = 90
    workers: int = 0  # 0: one per CPU core
    max_count: int = 6
    bdd100k: BDD100KConfig = field(default_factory=BDD100KConfig)

    def validate(self, prefix: str = "scenes") -> None:
        if self.num_images < 1:
            raise ParamError(f"{prefix}.num_images: must be at least 1, got {self.num_images}")
        if self.width < 64 or self.height < 64:
            raise ParamError(f"{prefix}.width/height: must be at least 64 pixels, got {self.width}x{self.height}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ParamError(f"{prefix}.jpeg_quality: must be in 1..100, got {self.jpeg_quality}")
        if self.workers < 0:
            raise ParamError(f"{prefix}.workers: must be >= 0 (0 = one per core), got {self.workers}")
        if not 1 <= self.max_count <= 9:
            raise ParamError(f"{prefix}.max_count: must be in 1..9, got {self.max_count}")
        if self.bdd100k.max_images is not None and self.bdd100k.max_images < 1:
            raise ParamError(f"{prefix}.bdd100k.max_images: must be at least 1 or null, got {self.bdd100k.max_images}")

    @property
    def num_workers(self) -> int:
        return self.workers or os.cpu_count() or 1

    @property
    def render_config(self) -> RenderConfig:
        return RenderConfig(width=self.width, height=self.height, max_count=self.max_count)


@dataclass(frozen=True)
class RawData:
    """What the downstream stages read from the ``generate_scenes`` output folder."""

    scenes: list[Scene]
    image_dir: Path
    width: int
    height: int
    source: str


def image_name(index: int) -> str:
    return f"{index:06d}.jpg"


def _render_one(args: tuple[int, int, RenderConfig, int, str]) -> dict:
    index, seed, render_config, quality, image_dir = args
    name = image_name(index)
    image, scene = render_scene(np.random.SeedSequence([seed, index]), name, render_config)
    image.save(os.path.join(image_dir, name), format="JPEG", quality=quality)
    return scene_to_frame(scene)


def generate_synthetic(config: ScenesConfig, out_dir: str | os.PathLike, progress: bool = True) -> dict:
    """Render ``config.num_images`` scenes into ``out_dir`` (replaced atomically); return speed stats."""
    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        (tmp / "images").mkdir(parents=True)
        jobs = [(i, config.seed, config.render_config, config.jpeg_quality, str(tmp / "images"))
                for i in range(config.num_images)]
        workers = min(config.num_workers, config.num_images)
        start = time.perf_counter()
        if workers > 1:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                frames = list(tqdm(pool.imap(_render_one, jobs, chunksize=8), total=len(jobs),
                                   desc="render scenes", unit="img", disable=not progress))
        else:
            frames = [_render_one(j) for j in tqdm(jobs, desc="render scenes", unit="img", disable=not progress)]
        seconds = time.perf_counter() - start
        write_json_list(tmp / "labels.json", frames)
        _write_source(tmp, "synthetic", out_dir / "images", config.width, config.height, len(frames))
    return {"source": "synthetic", "images": len(frames), "workers": workers, "seconds": round(seconds, 3),
            "images_per_s": round(len(frames) / seconds, 1)}


def import_bdd100k(config: ScenesConfig, out_dir: str | os.PathLike) -> dict:
    """Read a BDD100K labels file, keep frames whose images exist, write normalised det_20 labels."""
    bdd = config.bdd100k
    images, labels = Path(bdd.root) / bdd.images, Path(bdd.root) / bdd.labels
    scenes = read_labels(labels)
    scenes, report = match_images(scenes, images, bdd.on_missing)
    if bdd.max_images is not None and bdd.max_images < len(scenes):
        keep = np.sort(np.random.default_rng(config.seed).choice(len(scenes), bdd.max_images, replace=False))
        scenes = [scenes[i] for i in keep]
    if not scenes:
        raise ValueError(f"{labels}: no labelled frame has its image in {images}")
    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        write_json_list(tmp / "labels.json", [scene_to_frame(s) for s in scenes])
        _write_source(tmp, "bdd100k", images, config.width, config.height, len(scenes),
                      labels=str(labels), missing_images=report.missing_images)
    return {"source": "bdd100k", "images": len(scenes), "frames_in_labels": report.frames,
            "missing_images": report.missing_images}


def _write_source(folder: Path, source: str, image_dir: Path, width: int, height: int, images: int, **extra) -> None:
    meta = {"source": source, "image_dir": str(image_dir), "width": width, "height": height, "images": images, **extra}
    (folder / "source.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def generate_scenes(config: ScenesConfig, out_dir: str | os.PathLike, progress: bool = True) -> dict:
    if config.source == "synthetic":
        return generate_synthetic(config, out_dir, progress)
    return import_bdd100k(config, out_dir)


def load_raw(raw_dir: str | os.PathLike) -> RawData:
    """Read the ``generate_scenes`` output folder (labels are re-validated with the det_20 reader)."""
    raw_dir = Path(raw_dir)
    source = read_json(raw_dir / "source.json", what="scenes source description")
    for key in ("source", "image_dir", "width", "height"):
        if key not in source:
            raise ValueError(f"{raw_dir / 'source.json'}: missing key {key!r}")
    frames = read_json(raw_dir / "labels.json", what="scene labels")
    scenes = [scene_from_frame(f, where=f"{raw_dir / 'labels.json'}: frame[{i}]") for i, f in enumerate(frames)]
    return RawData(scenes, Path(source["image_dir"]), int(source["width"]), int(source["height"]), source["source"])
