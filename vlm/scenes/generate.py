"""The ``generate_scenes`` stage (docs/architecture.md): synthetic scenes rendered in parallel, or a BDD100K folder
read (its images in place, their content digest in ``source.json``), into one folder replaced atomically."""

import dataclasses
import functools
import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image
from tqdm import tqdm

from vlm.config import check
from vlm.io import atomic_path, existing_file, iter_json_list, read_json, write_json_list
from vlm.params import available_cpus
from vlm.scenes.bdd100k import match_images, read_labels
from vlm.scenes.render import RenderConfig, render_scene
from vlm.scenes.schema import Scene, scene_from_frame, scene_to_frame
from vlm.scenes.statistics import PACKAGED
from vlm.scenes.statistics import load as load_statistics


@dataclass
class BDD100KConfig:
    root: str = "data/bdd100k"  # the dataset folder, a dvc.yaml dependency: images and labels are paths inside it
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
    max_count: int = 40
    bdd100k: BDD100KConfig = field(default_factory=BDD100KConfig)

    def validate(self, prefix: str = "scenes") -> None:
        check(self.num_images >= 1, f"{prefix}.num_images", f"must be at least 1, got {self.num_images}")
        check(self.width >= 64 and self.height >= 64, f"{prefix}.width/height",
              f"must be at least 64 pixels, got {self.width}x{self.height}")
        check(1 <= self.jpeg_quality <= 100, f"{prefix}.jpeg_quality", f"must be in 1..100, got {self.jpeg_quality}")
        check(1 <= self.max_count <= 60, f"{prefix}.max_count", f"must be in 1..60, got {self.max_count}")
        check(self.bdd100k.max_images is None or self.bdd100k.max_images >= 1, f"{prefix}.bdd100k.max_images",
              f"must be at least 1 or null, got {self.bdd100k.max_images}")
        for key in ("images", "labels"):
            value = getattr(self.bdd100k, key)
            check(not Path(value).is_absolute() and ".." not in Path(value).parts, f"{prefix}.bdd100k.{key}",
                  f"must be a path inside {prefix}.bdd100k.root (the folder DVC tracks), relative to it, "
                  f"got {value!r}; set {prefix}.bdd100k.root instead")

    @property
    def render_config(self) -> RenderConfig:
        return RenderConfig(width=self.width, height=self.height, max_count=self.max_count)


@dataclass
class ScenesRuntime:
    """How fast ``generate_scenes`` renders, never what (``runtime.scenes``; docs/architecture.md, "Speed settings")."""

    workers: int = 0  # render processes; 0: one per CPU core

    def validate(self, prefix: str = "runtime.scenes") -> None:
        check(self.workers >= 0, f"{prefix}.workers", f"must be >= 0 (0 = one per core), got {self.workers}")

    @property
    def num_workers(self) -> int:
        return self.workers or available_cpus()


@dataclass(frozen=True)
class RawData:
    """What the downstream stages read from the ``generate_scenes`` output folder."""

    labels: Path  # labels.json, one frame per line
    image_dir: Path
    width: int
    height: int
    source: str

    def iter_scenes(self) -> Iterator[Scene]:
        """The scenes in the order of ``labels.json``, read and validated one frame at a time (none is held)."""
        for i, frame in enumerate(iter_json_list(self.labels, what="scene labels")):
            yield scene_from_frame(frame, where=f"{self.labels}: frame[{i}]")

    @functools.cached_property
    def scenes(self) -> list[Scene]:
        """Every scene, read once (:meth:`iter_scenes` streams them instead)."""
        return list(self.iter_scenes())


def image_name(index: int) -> str:
    return f"{index:06d}.jpg"


def _render_one(args: tuple[int, int, RenderConfig, int, str]) -> dict:
    index, seed, render_config, quality, image_dir = args
    name = image_name(index)
    image, scene = render_scene(np.random.SeedSequence([seed, index]), name, render_config)
    image.save(os.path.join(image_dir, name), format="JPEG", quality=quality)
    return scene_to_frame(scene)


def generate_synthetic(config: ScenesConfig, out_dir: str | os.PathLike, progress: bool = True,
                       runtime: ScenesRuntime | None = None, statistics: Path = PACKAGED) -> dict:
    """Render ``config.num_images`` scenes drawn from BDD100K's ``statistics`` into ``out_dir`` (replaced
    atomically) with ``runtime.workers`` processes; return speed stats."""
    out_dir, runtime = Path(out_dir), runtime or ScenesRuntime()
    render_config = dataclasses.replace(config.render_config, statistics=Path(statistics))
    load_statistics(render_config.statistics)  # a missing or damaged file is named before any work
    with atomic_path(out_dir) as tmp:
        (tmp / "images").mkdir(parents=True)
        jobs = [(i, config.seed, render_config, config.jpeg_quality, str(tmp / "images"))
                for i in range(config.num_images)]
        workers = min(runtime.num_workers, config.num_images)
        start = time.perf_counter()
        # Each label frame is written as its image is done: none is held. A worker that dies (the OOM killer) fails
        # the tasks it leaves (BrokenProcessPool), where multiprocessing.Pool would wait for them forever.
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) if workers > 1 else None
        try:
            frames = pool.map(_render_one, jobs, chunksize=8) if pool is not None else map(_render_one, jobs)
            images = write_json_list(tmp / "labels.json", tqdm(frames, total=len(jobs), desc="render scenes",
                                                                unit="img", disable=not progress))
        except BrokenProcessPool as error:
            raise ChildProcessError("a render process died (killed, or out of memory?); lower runtime.scenes.workers "
                                    "or free memory, and run the stage again") from error
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)
        seconds = time.perf_counter() - start
        _write_source(tmp, "synthetic", out_dir / "images", config.width, config.height, images)
    return {"source": "synthetic", "images": images, "workers": workers, "seconds": round(seconds, 3),
            "images_per_s": round(images / seconds, 1)}


def bdd100k_paths(bdd: BDD100KConfig) -> tuple[Path, Path]:
    """The images folder and labels file under ``bdd.root``, checked to be what DVC tracks there: DVC does not look
    inside a linked folder of the root it hashes, so a link on the way to them is an error."""
    root = Path(bdd.root)
    hint = ("put BDD100K there in its official layout (data/bdd100k/README.md) or set scenes.bdd100k.root to "
            "where it is; a queued or --temp experiment needs an absolute root")
    if not root.is_dir():
        raise FileNotFoundError(f"BDD100K folder not found: {root} (scenes.bdd100k.root): {hint}")
    images, labels = root / bdd.images, root / bdd.labels
    for path, what, exists in ((labels, "labels file", labels.is_file()), (images, "images folder", images.is_dir())):
        if exists:
            continue
        key = f"scenes.bdd100k.{what.split()[0]}"
        if path.exists():
            kind = "a folder" if path.is_dir() else "not a folder"
            raise FileNotFoundError(f"BDD100K {what} expected at {path} (scenes.bdd100k.root + {key}), "
                                    f"but it is {kind}")
        unzipped = root / "bdd100k" / path.relative_to(root)  # BDD100K's zip files hold a bdd100k/ folder of their own
        if unzipped.exists():
            raise FileNotFoundError(f"BDD100K {what} not found: {path} ({key}), but it is at {unzipped}: the zip files "
                                    f"unpack into a bdd100k/ folder of their own; set scenes.bdd100k.root to "
                                    f"{root / 'bdd100k'} or move that folder's content up into {root}")
        raise FileNotFoundError(f"BDD100K {what} not found: {path} (scenes.bdd100k.root + {key}): {hint}")
    for path in (images, labels.parent):
        for folder in [*reversed(path.relative_to(root).parents), path.relative_to(root)][1:]:
            if (root / folder).is_symlink():
                raise ValueError(
                    f"{root / folder} is a symbolic link inside scenes.bdd100k.root: DVC does not look inside linked "
                    f"folders of a dependency, so a changed label or image would not re-run generate_scenes; set "
                    f"scenes.bdd100k.root to the dataset's own folder instead (e.g. dvc exp run -S "
                    f"scenes.bdd100k.root=/datasets/bdd100k)")
    return images, labels


def images_digest(image_dir: Path, names: list[str]) -> str:
    """The MD5 of the images ``names`` (in that order) with their names: it changes when one of them does."""
    digest = hashlib.md5()
    for name in names:
        with open(image_dir / name, "rb") as f:
            digest.update(f"{name}\0{hashlib.file_digest(f, 'md5').hexdigest()}\n".encode())
    return digest.hexdigest()


def pick_frames(scenes: list[Scene], present: set[str], max_images: int | None, seed: int) -> list[Scene]:
    """Up to ``max_images`` of ``scenes`` whose image is ``present``, in the labels' order: the first of a seeded
    shuffle of all the labelled frames that are present, so that the choice follows the labels and the seed, and a
    missing image changes only its own place in it."""
    order = range(len(scenes)) if max_images is None else np.random.default_rng(seed).permutation(len(scenes))
    picked = [i for i in order if scenes[i].name in present][:max_images]
    return [scenes[i] for i in sorted(picked)]


def check_frame_size(image_dir: Path, names: list[str], width: int, height: int) -> None:
    """Stop naming the first image whose size is not the frame size the labels' boxes are read in."""
    for name in names:
        with Image.open(image_dir / name) as image:  # the header only
            if image.size != (width, height):
                raise ValueError(f"{image_dir / name}: {image.size[0]}x{image.size[1]} pixels, but scenes.width x "
                                 f"scenes.height is {width}x{height}, the frame the boxes are read in (BDD100K's: "
                                 f"1280x720); set them to the images' size")


def import_bdd100k(config: ScenesConfig, out_dir: str | os.PathLike) -> dict:
    """Read a BDD100K labels file, keep frames whose images exist and whose labels decide every answer
    (:func:`~vlm.scenes.bdd100k.read_labels`), write normalised det_20 labels."""
    bdd = config.bdd100k
    images, labels = bdd100k_paths(bdd)
    labelled, skipped = read_labels(labels)
    kept, report = match_images(labelled, images, bdd.on_missing)
    scenes = pick_frames(labelled, {s.name for s in kept}, bdd.max_images, config.seed)
    if not scenes:
        raise ValueError(f"{labels}: no labelled frame has its image in {images}")
    check_frame_size(images, [s.name for s in scenes], config.width, config.height)
    digest = images_digest(images, [s.name for s in scenes])
    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir(parents=True)
        write_json_list(tmp / "labels.json", [scene_to_frame(s) for s in scenes])
        _write_source(tmp, "bdd100k", images, config.width, config.height, len(scenes),
                      labels=str(labels), missing_images=report.missing_images, images_md5=digest)
    return {"source": "bdd100k", "images": len(scenes), "frames_in_labels": report.frames + sum(skipped.values()),
            "missing_images": report.missing_images, "unlabelled_frames": skipped["unlabelled"],
            "frames_with_ignored_regions": skipped["ignored_regions"], "frames_with_crowd_boxes": skipped["crowd"]}


def _write_source(folder: Path, source: str, image_dir: Path, width: int, height: int, images: int, **extra) -> None:
    meta = {"source": source, "image_dir": str(image_dir), "width": width, "height": height, "images": images, **extra}
    (folder / "source.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def generate_scenes(config: ScenesConfig, out_dir: str | os.PathLike, progress: bool = True,
                    runtime: ScenesRuntime | None = None, statistics: Path = PACKAGED) -> dict:
    if config.source == "synthetic":
        return generate_synthetic(config, out_dir, progress, runtime, statistics)
    return import_bdd100k(config, out_dir)


def load_raw(raw_dir: str | os.PathLike) -> RawData:
    """The ``generate_scenes`` output folder: its source description, checked now, its labels read when asked for."""
    raw_dir = Path(raw_dir)
    source = read_json(raw_dir / "source.json", what="scenes source description")
    for key in ("source", "image_dir", "width", "height"):
        if key not in source:
            raise ValueError(f"{raw_dir / 'source.json'}: missing key {key!r}")
    labels = existing_file(raw_dir / "labels.json", "scene labels")
    return RawData(labels, Path(source["image_dir"]), int(source["width"]), int(source["height"]), source["source"])
