"""The ``pack_hdf5`` stage (docs/architecture.md): each split's JPEGs decoded and resized into one HDF5 file, in a
process pool whose results come back in order, a bounded number in flight, streamed to disk (memory stays flat)."""

import json
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import numpy as np
from PIL import Image
from tqdm import tqdm

from vlm.config import check
from vlm.data.commands import SPLITS, read_commands
from vlm.data.h5file import PackedImageReader, PackedImageWriter
from vlm.data.image import RESAMPLE, CorruptImageError, decode_image, native_width
from vlm.io import atomic_path, read_json
from vlm.params import available_cpus


@dataclass
class PackConfig:
    image_size: int = 128  # S: images are stored S x S (squashed), or S high with aspect native
    skip_corrupt: bool = False  # skip (and count) undecodable images instead of failing
    resample: Literal["bilinear", "bicubic", "lanczos"] = "bicubic"  # filter after the JPEG draft downscale
    aspect: Literal["square", "native"] = "native"  # native: S high, the frames' aspect wide (image_width)

    def validate(self, prefix: str = "pack") -> None:
        check(16 <= self.image_size <= 1024, f"{prefix}.image_size", f"must be in [16, 1024], got {self.image_size}")

    def image_width(self, source_path: str | os.PathLike, multiple: int) -> int:
        """The packed images' width: S, or with aspect native the frames' (``source_path``'s) at S high, rounded."""
        if self.aspect == "square":
            return self.image_size
        source = read_json(source_path, "source file")
        frame = (source.get("width"), source.get("height")) if isinstance(source, dict) else (None, None)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in frame):
            raise ValueError(f"{source_path}: pack.aspect native needs the frames' positive 'width' and 'height', "
                             f"got {frame}")
        return native_width(frame, self.image_size, multiple)


@dataclass
class PackRuntime:
    """How fast ``pack_hdf5`` decodes, never what it writes (``runtime.pack``: docs/architecture.md, Speed settings)."""

    workers: int = 2  # decoding processes; 0: one per CPU core, 1: in the calling process
    chunksize: int = 16  # images per task sent to a worker

    def validate(self, prefix: str = "runtime.pack") -> None:
        check(self.workers >= 0, f"{prefix}.workers", f"must be >= 0 (0 = one per CPU core), got {self.workers}")
        check(self.chunksize >= 1, f"{prefix}.chunksize", f"must be >= 1, got {self.chunksize}")

    @property
    def num_workers(self) -> int:
        return self.workers or available_cpus()


@dataclass
class DecodedImage:
    image: np.ndarray | None  # uint8 [S, W, 3], None when decoding failed
    error: str | None
    histogram: np.ndarray | None = None  # int64 [3, 256]: pixel count per channel and value


def _decode_chunk(paths: list[str], image_size: int, resample: str, image_width: int) -> list[DecodedImage]:
    """Worker task: decode a chunk of images; errors are returned, not raised, so the parent decides."""
    decoded = []
    for path in paths:
        try:
            image = decode_image(path, image_size, resample, image_width)
        except CorruptImageError as e:
            decoded.append(DecodedImage(None, str(e)))
            continue
        # Histograms are exact integers (order-independent stats) and cheaper than int64 sums of squares.
        histogram = np.stack([np.bincount(image[..., c].ravel(), minlength=256) for c in range(3)])
        decoded.append(DecodedImage(image, None, histogram.astype(np.int64)))
    return decoded


def _decode_in_order(paths: list[str], config: PackConfig, pool: ProcessPoolExecutor | None,
                     runtime: PackRuntime | None = None, image_width: int | None = None) -> Iterator[DecodedImage]:
    """Decoded images ``image_width`` wide (None: square) in the order of ``paths``, <= 2 chunks a worker in flight."""
    runtime = runtime or PackRuntime()
    chunks = (paths[i:i + runtime.chunksize] for i in range(0, len(paths), runtime.chunksize))
    args = (config.image_size, config.resample, image_width or config.image_size)
    if pool is None:
        for chunk in chunks:
            yield from _decode_chunk(chunk, *args)
        return
    in_flight = 2 * runtime.num_workers
    try:
        pending = deque(pool.submit(_decode_chunk, chunk, *args) for chunk in islice(chunks, in_flight))
        while pending:
            decoded = pending.popleft().result()
            for chunk in islice(chunks, 1):
                pending.append(pool.submit(_decode_chunk, chunk, *args))
            yield from decoded
    except BrokenProcessPool as error:  # a worker killed (out of memory?): an error, not a wait for its result
        raise ChildProcessError("a decoding process died (killed, or out of memory?); lower runtime.pack.workers "
                                "or free memory, and run the stage again") from error


def _mean_std(histogram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``[3]`` mean and population std (0..1 scale) of int64 ``[3, 256]`` value counts: exact in any order."""
    mean, std = [], []
    for counts in histogram.tolist():  # Python ints: exact sums
        n = sum(counts)
        total = sum(v * c for v, c in enumerate(counts))
        total_sq = sum(v * v * c for v, c in enumerate(counts))
        mean.append(total / n / 255.0)
        # Var = (n * sum(x^2) - sum(x)^2) / n^2, exact in integers before the one division.
        std.append(((n * total_sq - total * total) / (n * n)) ** 0.5 / 255.0)
    return np.array(mean, dtype=np.float32), np.array(std, dtype=np.float32)


@dataclass
class SplitImages:
    """What one split's HDF5 file will hold: its image ids (sorted), their files and label frames."""

    split: str
    image_ids: list[str]
    paths: list[str]
    annotations: list[str]  # compact, key-sorted JSON of each image's label frame


def collect_split_images(labels_path: str | os.PathLike, source_path: str | os.PathLike,
                         commands_dir: str | os.PathLike, splits: tuple[str, ...] = SPLITS,
                         root: str | os.PathLike = ".") -> list[SplitImages]:
    """Every split's images, resolved before decoding: a frame, a file, and no image in two splits (else one error)."""
    frames = read_json(labels_path, "labels file")
    if not isinstance(frames, list):
        raise ValueError(f"{labels_path}: expected a list of frames, got {type(frames).__name__}")
    frame_by_id: dict[str, dict] = {}
    for index, frame in enumerate(frames):
        if not isinstance(frame, dict) or not isinstance(frame.get("name"), str):
            raise ValueError(f"{labels_path}: frame {index} must be an object with a string 'name'")
        image_id = os.path.splitext(frame["name"])[0]
        if image_id in frame_by_id:
            raise ValueError(f"{labels_path}: frame {index}: duplicate image '{frame['name']}'")
        frame_by_id[image_id] = frame

    source = read_json(source_path, "source file")
    if not isinstance(source, dict) or not isinstance(source.get("image_dir"), str):
        raise ValueError(f"{source_path}: must be an object with a string 'image_dir'")
    image_dir = Path(root) / source["image_dir"]  # an absolute image_dir stays absolute
    if not image_dir.is_dir():
        raise FileNotFoundError(f"{source_path}: image_dir {image_dir} is not a directory")

    split_of: dict[str, str] = {}
    result = []
    for split in splits:
        commands_path = Path(commands_dir) / f"{split}.json"
        image_ids = sorted({record["image_id"] for record in read_commands(commands_path, ("image_id",))})
        for image_id in image_ids:
            if image_id in split_of:
                raise ValueError(f"image '{image_id}' is used by both the {split_of[image_id]} and the "
                                 f"{split} commands: splits must not share images")
            split_of[image_id] = split
            if image_id not in frame_by_id:
                raise ValueError(f"{commands_path}: image '{image_id}' has no frame in {labels_path}")
        paths = [str(image_dir / frame_by_id[i]["name"]) for i in image_ids]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"{len(missing)} image file(s) of the {split} split missing under "
                                    f"{image_dir} (image_dir from {source_path}), first: {missing[0]}")
        annotations = [json.dumps(frame_by_id[i], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                       for i in image_ids]
        result.append(SplitImages(split, image_ids, paths, annotations))
    return result


@dataclass
class PackedSplit:
    split: str
    images: int
    skipped_image_ids: list[str]
    bytes: int
    mean: np.ndarray  # float32 [3], the normalisation stats written into the file (the train split's)
    std: np.ndarray


def pack_split(images: SplitImages, out_path: str | os.PathLike, config: PackConfig,
               pool: ProcessPoolExecutor | None = None, train_stats: tuple[np.ndarray, np.ndarray] | None = None,
               runtime: PackRuntime | None = None, image_width: int | None = None) -> PackedSplit:
    """Write ``out_path`` atomically, images ``image_width`` (None: S) wide, mean/std ``train_stats`` or its own."""
    histogram = np.zeros((3, 256), dtype=np.int64)  # [C, value]: the split's pixel counts
    skipped: list[str] = []
    width = image_width or config.image_size
    with atomic_path(out_path) as tmp, PackedImageWriter(tmp, config.image_size, len(images.image_ids),
                                                         split=images.split, resample=config.resample,
                                                         image_width=width) as writer:
        progress = tqdm(_decode_in_order(images.paths, config, pool, runtime, width), total=len(images.paths),
                        desc=f"pack {images.split}", unit="img", mininterval=1.0)
        for image_id, annotation, decoded in zip(images.image_ids, images.annotations, progress):
            if decoded.error is not None:
                if not config.skip_corrupt:
                    raise CorruptImageError(f"{decoded.error} (set pack.skip_corrupt: true to skip it)")
                tqdm.write(f"skipping corrupt image: {decoded.error}")
                skipped.append(image_id)
                continue
            histogram += decoded.histogram
            writer.append(image_id, decoded.image, annotation)
        if train_stats is None:
            if len(writer) == 0:
                raise ValueError(f"{images.split} split: no decodable images to compute mean/std from")
            train_stats = _mean_std(histogram)
        writer.finish(*train_stats, skipped)
    return PackedSplit(images.split, len(images.image_ids) - len(skipped), skipped, os.path.getsize(out_path),
                       *train_stats)


def start_decode_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool whose workers never inherit the parent's threads (tqdm's monitor, pytest-xdist's); with
    forkserver, each worker forks from a server that imported this module once (no ``__main__`` re-import). Unlike
    ``multiprocessing.Pool``, a worker that dies fails the tasks it leaves (``BrokenProcessPool``) instead of a wait."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
    else:
        context = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(workers, mp_context=context)


def pack_dataset(labels_path: str | os.PathLike, source_path: str | os.PathLike, commands_dir: str | os.PathLike,
                 output_dir: str | os.PathLike, config: PackConfig, *, splits: tuple[str, ...] = SPLITS,
                 root: str | os.PathLike = ".", runtime: PackRuntime | None = None,
                 side_multiple: int = 1) -> dict[str, Any]:
    """Pack ``{output_dir}/{split}_images.h5`` for each split (train first) with ``runtime``'s decoding processes;
    return the pack metrics. ``side_multiple``: what ``pack.aspect: native`` rounds the width to."""
    runtime = runtime or PackRuntime()
    if splits[0] != "train":
        raise ValueError(f"splits must start with 'train' (its mean/std goes into every file), got {splits}")
    split_images = collect_split_images(labels_path, source_path, commands_dir, splits, root)
    image_width = config.image_width(source_path, side_multiple)
    start = time.perf_counter()
    pool = start_decode_pool(runtime.num_workers) if runtime.num_workers > 1 else None
    try:
        packed: list[PackedSplit] = []
        train_stats = None
        for images in split_images:
            result = pack_split(images, Path(output_dir) / f"{images.split}_images.h5", config, pool, train_stats,
                                runtime, image_width)
            train_stats = (result.mean, result.std)
            packed.append(result)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    seconds = time.perf_counter() - start
    num_images = sum(p.images + len(p.skipped_image_ids) for p in packed)
    return {
        "image_size": config.image_size, **({"image_width": image_width} if config.aspect == "native" else {}),
        "resample": config.resample, "workers": runtime.num_workers, "images": sum(p.images for p in packed),
        "skipped": sum(len(p.skipped_image_ids) for p in packed), "bytes": sum(p.bytes for p in packed),
        "seconds": round(seconds, 3), "images_per_s": round(num_images / seconds, 1),
        "splits": {p.split: {"images": p.images, "skipped": len(p.skipped_image_ids), "bytes": p.bytes}
                   for p in packed},
        "train_mean": [round(float(v), 6) for v in packed[0].mean],
        "train_std": [round(float(v), 6) for v in packed[0].std],
    }


def repack_resized(src_path: str | os.PathLike, dst_path: str | os.PathLike, image_size: int,
                   max_images: int | None = None, resample: str = "bicubic") -> None:
    """Copy a packed file (its first ``max_images``) at ``image_size`` high, its aspect kept: the profile's 2nd size."""
    reader = PackedImageReader(src_path)
    count = len(reader) if max_images is None else min(max_images, len(reader))
    annotations = reader.read_annotations()
    buffer = np.empty((1, reader.image_size, reader.image_width, 3), dtype=np.uint8)
    width = round(image_size * reader.image_width / reader.image_size)
    try:
        with atomic_path(dst_path) as tmp, PackedImageWriter(tmp, image_size, count, split=reader.split,
                                                             resample=resample, image_width=width) as writer:
            for row in range(count):
                reader.read_into([row], buffer)
                resized = Image.fromarray(buffer[0]).resize((width, image_size), RESAMPLE[resample])
                writer.append(reader.image_ids[row], np.asarray(resized), annotations[row])
            writer.finish(reader.mean, reader.std, reader.skipped_image_ids)
    finally:
        reader.close()
