"""One pipeline run's GPU numbers, from the run's own files and measured in the same process: the stages' wall
time, training questions/s, FLOPs per question, the matmul peak of this device (bf16 on CUDA, fp32 on a CPU)
and the training's MFU against it, the test accuracy overall and per type.

    PYTHONPATH=. python benchmarks/gpu_report.py --name default --wall-s 212.4 --log repro.log \
        --out metrics/gpu/default.json

Run in the project after ``dvc repro evaluate`` (the stages whose files it reads), and again with
``--pipeline-wall-s`` once the whole ``dvc repro`` has run: that adds the pipeline's wall time and its stages'
times to the report without measuring anything again (``benchmarks/gpu_session.sh`` does all of it on a GPU
machine). ``--log`` is the run's ``dvc repro`` output, each line stamped ``[HH:MM:SS]``; a stage's seconds are
from its "Running stage" line to DVC's lock-file line after it, or its own last line (:func:`stage_seconds`). The MFU is
the training's whole-run rate (``metrics/train_timing.json``: every step, the data, the per-epoch validation
and the checkpoints) times the FLOPs of one forward and backward pass per question (counted on a batch of the
run's own data, as ``bench_train_step.py`` counts them), over the peak of one large square matmul.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from vlm.io import write_json
from vlm.params import load_params

if TYPE_CHECKING:
    import torch


def driver() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def peak(device: torch.device) -> dict[str, float]:
    """bf16 (CUDA, what training's autocast runs in) or fp32 (CPU) matmul FLOP/s, the best of several sizes."""
    import torch

    from benchmarks.bench_train_step import matmul_peak

    if device.type == "cuda":
        return {**matmul_peak(device, sizes=(4096, 8192), repeats=10, dtype=torch.bfloat16), "dtype": "bfloat16"}
    return {**matmul_peak(device), "dtype": "float32"}


# DVC's own lines between stages: a stage ends at its lock-file line (printed only when its dvc.lock entry changed), or
# else before DVC's next line of its own (a stage skipped, a run-cache restore, the end of the call)
LOCK_LINE = re.compile(r"(Generating|Updating) lock file")
DVC_LINE = re.compile(r"Stage '[^']+' (didn't change, skipping|is cached)|To track the changes with git|"
                      r"To enable auto staging|Use `dvc push`")


def stage_seconds(log: str) -> dict[str, float]:
    """Each stage's seconds in a stamped ``dvc repro`` log: from its "Running stage" line to DVC's lock-file line after
    it (its outputs hashed), else to its own last line: what runs between two ``dvc repro`` calls, and the second
    call's "didn't change, skipping" lines stamped after it, count for no stage (a stamp earlier than the one before it
    is a day later)."""
    stage, start, seconds, day, now = None, 0, {}, 0, None
    for line in log.splitlines():
        match = re.match(r"\[(\d\d):(\d\d):(\d\d)\] ?(.*)", line)
        if not match:
            continue
        previous, now = now, int(match[1]) * 3600 + int(match[2]) * 60 + int(match[3]) + day
        if previous is not None and now < previous:
            day, now = day + 86400, now + 86400
        running = re.match(r"Running stage '([\w@.-]+)'", match[4])
        if stage and (running or DVC_LINE.match(match[4])):
            seconds[stage], stage = previous - start, None
        elif stage and LOCK_LINE.match(match[4]):
            seconds[stage], stage = now - start, None
        if running:
            stage, start = running[1], now
    if stage:
        seconds[stage] = now - start
    return {name: float(value) for name, value in seconds.items()}


def report(name: str, wall_s: float, params_path: str, data: Path, metrics: Path) -> dict[str, object]:
    # torch here, not at the top: the --pipeline-wall-s call after the whole pipeline measures nothing, and starts
    # in a tenth of a second instead of about three (on a GPU lease, its time)
    import torch

    from benchmarks.bench_train_step import batches, build_run, count_flops, machine

    timing = json.loads((metrics / "train_timing.json").read_text())
    evaluation = json.loads((metrics / "eval.json").read_text())
    # FLOPs are counted eagerly (compiling changes no FLOP) on one batch read from HDF5: holding the whole train and
    # val split in RAM, as the recipe's budget lets training do, would spend minutes of the lease building targets
    with tempfile.TemporaryDirectory() as workdir:
        run = build_run(params_path, data, Path(workdir), {"compile": False, "num_workers": 0, "in_memory": False})
        run.model.train()
        flops = count_flops(run, batches(run))["train_flops_per_question"]
    best = peak(run.device)
    achieved = flops * timing["questions_per_s"]
    params = load_params(params_path)
    return {
        "name": name,
        "machine": {**machine(), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "",
                    "driver": driver(), "cuda": torch.version.cuda or "", "cpu_cores": len(os.sched_getaffinity(0))},
        "wall_s_through_evaluate": round(wall_s, 1),
        "pipeline_wall_s": None,  # set by --pipeline-wall-s once every stage has run
        "images": params["scenes"]["num_images"],
        "train": {"seconds": timing["seconds"], "questions_per_s": timing["questions_per_s"],
                  "steps": timing["planned_steps"], "epochs": params["train"]["epochs"],
                  "batch_size": params["train"]["batch_size"]},
        "train_gflops_per_question": round(flops / 1e9, 4),
        "matmul_peak_tflops_per_s": round(best["flops_per_s"] / 1e12, 1),
        "matmul_peak_dtype": best["dtype"],
        "mfu": round(achieved / best["flops_per_s"], 5),
        "test": evaluation["vlm"],
        "blind_accuracy": evaluation["blind"]["accuracy"],
    }


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, help="the run's name in the report (default, recipe, ...)")
    parser.add_argument("--wall-s", type=float, help="the wall time of dvc repro evaluate")
    parser.add_argument("--pipeline-wall-s", type=float,
                        help="the whole dvc repro's wall time: added to the report at --out, nothing measured")
    parser.add_argument("--log", type=Path, help="the stamped dvc repro output: each stage's seconds")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--data", type=Path, default=Path("data/processed"))
    parser.add_argument("--metrics", type=Path, default=Path("metrics"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.pipeline_wall_s is not None:
        result = json.loads(args.out.read_text()) | {"pipeline_wall_s": round(args.pipeline_wall_s, 1)}
    elif args.wall_s is not None:
        result = report(args.name, args.wall_s, args.params, args.data, args.metrics)
    else:
        parser.error("--wall-s or --pipeline-wall-s is required")
    if args.log:
        result["stage_seconds"] = stage_seconds(args.log.read_text(errors="replace"))
    write_json(args.out, result)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
