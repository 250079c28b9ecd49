"""The ``profile_dataloader`` stage (docs/architecture.md): samples/s of the naive loader and ours (``ours_hdf5``,
``ours_ram``), interleaved and repeated (``rounds``, the best counts) so that machine noise hits all alike."""

import functools
import itertools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader
from tqdm import tqdm

from vlm.batch import Batch
from vlm.config import check
from vlm.data.collate import collate_questions
from vlm.data.commands import read_commands
from vlm.data.dataset import QATokenizer, TrafficVQADataset
from vlm.data.h5file import PackedImageReader
from vlm.data.naive import NaiveTrafficVQADataset, build_naive_loader
from vlm.data.pack import repack_resized
from vlm.data.sampler import GroupedBatchSampler

LOADERS = ("naive", "ours_hdf5", "ours_ram")
TARGET_SPEEDUP = 10.0
TARGET_SAMPLES_PER_S_224 = 10_000.0


@dataclass
class ProfileConfig:
    split: str = "train"
    workers: list[int] = field(default_factory=lambda: [0, 1, 2])
    batch_sizes: list[int] = field(default_factory=lambda: [32, 128])
    extra_image_sizes: list[int] = field(default_factory=lambda: [224])  # more heights, at the packed aspect
    warmup_batches: int = 2  # per measurement, untimed: worker start-up and the prefetch queue filling
    batches: int = 6  # timed batches per measurement
    rounds: int = 2  # interleaved repetitions; the best round of each configuration counts
    max_images: int = 1500  # profile on the first images of the split (bounds the resized copies)
    seed: int = 0

    def validate(self, prefix: str = "profile") -> None:
        check(self.split in ("train", "val", "test"), f"{prefix}.split",
              f"must be train, val or test, got {self.split!r}")
        check(bool(self.workers) and all(w >= 0 for w in self.workers), f"{prefix}.workers",
              "must be a non-empty list of counts >= 0")
        check(bool(self.batch_sizes) and all(b >= 1 for b in self.batch_sizes), f"{prefix}.batch_sizes",
              "must be a non-empty list of sizes >= 1")
        check(all(16 <= s <= 1024 for s in self.extra_image_sizes), f"{prefix}.extra_image_sizes",
              "sizes must be in [16, 1024]")
        for name, low in (("warmup_batches", 0), ("batches", 1), ("rounds", 1), ("max_images", 1)):
            check(getattr(self, name) >= low, f"{prefix}.{name}", f"must be >= {low}")


def _epoch_cycle(sampler: GroupedBatchSampler, num_batches: int) -> Iterator[list[int]]:
    """Exactly ``num_batches`` batches from ``sampler``, over as many epochs as needed."""
    def epochs() -> Iterator[list[int]]:
        for epoch in itertools.count():
            sampler.set_epoch(epoch)
            yield from sampler
    return itertools.islice(epochs(), num_batches)


def _time_loader(loader: DataLoader, warmup_batches: int, batches: int) -> tuple[float, int]:
    """(seconds, samples) over ``batches`` batches after ``warmup_batches`` untimed ones."""
    iterator = iter(loader)
    for _ in range(warmup_batches):
        next(iterator)
    samples = 0
    start = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)  # ours: a Batch; the naive loader's: a dict of stacked tensors
        samples += len(batch) if isinstance(batch, Batch) else len(batch["question_id"])
    seconds = time.perf_counter() - start
    del iterator  # shuts the workers down
    return seconds, samples


def _make_loader(name: str, dataset: Any, batch_size: int, workers: int, num_batches: int, seed: int) -> DataLoader:
    if name == "naive":
        return build_naive_loader(dataset, batch_size, workers, seed, num_samples=num_batches * batch_size)
    sampler = GroupedBatchSampler(dataset.image_rows, batch_size, shuffle=True, seed=seed)
    return DataLoader(dataset, batch_sampler=_epoch_cycle(sampler, num_batches), num_workers=workers,
                      collate_fn=functools.partial(collate_questions, pad_token_id=dataset.pad_token_id))


def profile_dataloaders(commands_path: str | os.PathLike, h5_path: str | os.PathLike, tokenizer: QATokenizer,
                        config: ProfileConfig, log: Callable[[str], None] = tqdm.write) -> dict[str, Any]:
    """Measure every (loader, image size, workers, batch size); return the ``dataloader.json`` metrics."""
    header = PackedImageReader(h5_path)
    num_images = min(config.max_images, len(header))
    sizes = [header.image_size] + sorted({s for s in config.extra_image_sizes if s != header.image_size})
    num_batches = config.warmup_batches + config.batches
    with tempfile.TemporaryDirectory(prefix="profile_dataloader_") as tmp:
        subset_path = Path(tmp) / "commands.json"
        image_ids = set(header.image_ids[:num_images])
        records = [r for r in read_commands(commands_path, ("image_id",)) if r["image_id"] in image_ids]
        subset_path.write_text(json.dumps(records), encoding="utf-8")
        h5_paths = {header.image_size: Path(h5_path)}
        for size in sizes[1:]:
            log(f"profile: resizing {num_images} images to {size} px")
            h5_paths[size] = Path(tmp) / f"images_{size}.h5"
            repack_resized(h5_path, h5_paths[size], size, max_images=num_images)

        samples_per_s: dict[str, dict[str, dict[str, float]]] = {}
        plan = list(itertools.product(config.workers, config.batch_sizes))
        progress = tqdm(total=config.rounds * len(sizes) * len(plan) * len(LOADERS), desc="profile", unit="run")
        for round_index in range(config.rounds):
            order = LOADERS if round_index % 2 == 0 else LOADERS[::-1]  # so that drift hits all loaders alike
            for size in sizes:
                datasets = {
                    "naive": NaiveTrafficVQADataset(subset_path, h5_paths[size], tokenizer),
                    "ours_hdf5": TrafficVQADataset(subset_path, h5_paths[size], tokenizer, seed=config.seed),
                    "ours_ram": TrafficVQADataset(subset_path, h5_paths[size], tokenizer, in_memory=True,
                                                  seed=config.seed),
                }
                for workers, batch_size in plan:
                    for name in order:
                        loader = _make_loader(name, datasets[name], batch_size, workers, num_batches, config.seed)
                        seconds, samples = _time_loader(loader, config.warmup_batches, config.batches)
                        key = f"workers{workers}_batch{batch_size}"
                        table = samples_per_s.setdefault(f"{size}px", {}).setdefault(name, {})
                        table[key] = max(table.get(key, 0.0), samples / seconds)
                        progress.update()
        progress.close()
    return _summarise(samples_per_s, sizes, header.image_size, num_images, len(records), config)


def _best(table: dict[str, float]) -> dict[str, Any]:
    key = max(table, key=table.get)
    workers, batch = key.removeprefix("workers").split("_batch")
    return {"samples_per_s": round(table[key], 1), "workers": int(workers), "batch_size": int(batch)}


def _summarise(samples_per_s: dict, sizes: list[int], packed_size: int, num_images: int, num_questions: int,
               config: ProfileConfig) -> dict[str, Any]:
    best: dict[str, Any] = {}
    speedup: dict[str, float] = {}
    for size in sizes:
        tables = samples_per_s[f"{size}px"]
        naive = _best(tables["naive"])
        ours = max((_best(tables[name]) | {"loader": name} for name in LOADERS[1:]), key=lambda b: b["samples_per_s"])
        best[f"{size}px"] = {"naive": naive, "ours": ours}
        speedup[f"{size}px"] = round(ours["samples_per_s"] / naive["samples_per_s"], 2)
    metrics: dict[str, Any] = {
        "split": config.split, "images": num_images, "questions": num_questions,
        "questions_per_image": round(num_questions / num_images, 2), "packed_image_size": packed_size,
        "timed_batches": config.batches, "rounds": config.rounds,
        "samples_per_s": {size: {name: {k: round(v, 1) for k, v in table.items()} for name, table in tables.items()}
                          for size, tables in samples_per_s.items()},
        "best": best, "speedup": speedup,
        "targets": {"speedup_min": TARGET_SPEEDUP, "speedup_met": all(s >= TARGET_SPEEDUP for s in speedup.values())},
    }
    if "224px" in best:
        metrics["targets"]["samples_per_s_224px_min"] = TARGET_SAMPLES_PER_S_224
        met = best["224px"]["ours"]["samples_per_s"] >= TARGET_SAMPLES_PER_S_224
        metrics["targets"]["samples_per_s_224px_met"] = met
    return metrics

