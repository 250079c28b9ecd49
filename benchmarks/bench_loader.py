"""Evidence for the packing choices: JPEG decode strategies and packing throughput.

    PYTHONPATH=. python benchmarks/bench_loader.py --images data/raw/images --out metrics/bench_pack.json

At the pack stage's image shapes: each ``--sizes`` high and the frames' aspect wide (``pack.aspect: native``,
rounded as params.yaml's model asks), or square with ``--square``.

1. ``decode``: for each resampling filter, CPU ms per image of a full-resolution decode + resize
   (the baseline of the ratio) and of JPEG draft mode (the decoder's DCT-domain 1/2, 1/4, 1/8
   downscale) + the same resize, and the draft's PSNR against the full decode (what the draft
   costs in quality). CPU time, best of ``--repeats`` runs, in one process: the ratios hold on a
   busy machine.
2. ``pack``: end-to-end ``pack_split`` images/s (decode, stats, HDF5 writes) in the calling process and
   with ``--workers`` processes, and the CPU ms per image of the in-process run, from which the
   throughput on N free cores is about N * 1000 / cpu_ms.

The loader's own numbers come from the ``profile_dataloader`` stage (``metrics/dataloader.json``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image

from vlm.data.image import RESAMPLE, decode_image, native_width
from vlm.data.pack import PackConfig, PackRuntime, SplitImages, pack_split, start_decode_pool
from vlm.io import write_json
from vlm.models.image_size import image_side_multiple
from vlm.params import load_params


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0 ** 2 / mse))


def full_decode(path: Path, size: int, width: int, resample: str) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB").resize((width, size), RESAMPLE[resample]))


def best_cpu_ms(fn, paths: list[Path], repeats: int) -> tuple[float, list[np.ndarray]]:
    best, outputs = float("inf"), []
    for _ in range(repeats):
        start = time.process_time()
        outputs = [fn(p) for p in paths]
        best = min(best, (time.process_time() - start) / len(paths) * 1000)
    return best, outputs


def bench_decode(paths: list[Path], size: int, width: int, repeats: int) -> dict:
    """Per filter: full decode + resize to ``width`` x ``size`` (the baseline) against draft decode + that resize."""
    results = {}
    for resample in RESAMPLE:
        full_ms, full = best_cpu_ms(partial(full_decode, size=size, width=width, resample=resample), paths, repeats)
        draft_ms, draft = best_cpu_ms(partial(decode_image, image_size=size, resample=resample, image_width=width),
                                      paths, repeats)
        results[resample] = {
            "full_decode_cpu_ms_per_image": round(full_ms, 3),
            "draft_cpu_ms_per_image": round(draft_ms, 3),
            "draft_speedup": round(full_ms / draft_ms, 2),
            "draft_psnr_db_vs_full_decode": round(float(np.mean([psnr(d, f) for d, f in zip(draft, full)])), 2),
        }
    return results


def bench_pack(paths: list[Path], size: int, width: int, workers: int) -> dict:
    images = SplitImages("train", [p.stem for p in paths], [str(p) for p in paths], ["{}"] * len(paths))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for count in (1, workers):
            config, runtime = PackConfig(image_size=size), PackRuntime(workers=count)
            pool = start_decode_pool(count) if count > 1 else None
            try:
                cpu, start = time.process_time(), time.perf_counter()
                pack_split(images, Path(tmp) / "train_images.h5", config, pool, runtime=runtime, image_width=width)
                seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            finally:
                if pool is not None:
                    pool.shutdown(cancel_futures=True)
            results[f"workers{count}"] = {"images_per_s": round(len(paths) / seconds, 1),
                                          "main_process_cpu_ms_per_image": round(cpu / len(paths) * 1000, 3)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, default=Path("data/raw/images"))
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 224])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="its model section gives the width rounding of pack.aspect: native")
    parser.add_argument("--square", action="store_true", help="S x S images, as pack.aspect: square")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    paths = sorted(args.images.glob("*.jpg"))[:args.limit]
    if not paths:
        raise SystemExit(f"no .jpg files in {args.images}")
    with Image.open(paths[0]) as first:
        source_size = first.size
    multiple = image_side_multiple(load_params(args.params).get("model") or {})
    widths = {size: size if args.square else native_width(source_size, size, multiple) for size in args.sizes}
    report = {"images": len(paths), "source_size": list(source_size), "aspect": "square" if args.square else "native",
              "image_widths": {f"{size}px": width for size, width in widths.items()}, "decode": {}, "pack": {}}
    for size, width in widths.items():
        report["decode"][f"{size}px"] = bench_decode(paths, size, width, args.repeats)
        report["pack"][f"{size}px"] = bench_pack(paths, size, width, args.workers)
        for name, result in report["decode"][f"{size}px"].items():
            print(f"{size}px decode {name:8s}: full {result['full_decode_cpu_ms_per_image']:6.2f} CPU ms/img, "
                  f"draft {result['draft_cpu_ms_per_image']:6.2f} (x{result['draft_speedup']}), "
                  f"draft vs full PSNR {result['draft_psnr_db_vs_full_decode']} dB")
        for name, result in report["pack"][f"{size}px"].items():
            print(f"{size}px pack {name}: {result['images_per_s']} images/s, main process "
                  f"{result['main_process_cpu_ms_per_image']} CPU ms/img")
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()
