"""Peak memory of each stage at several dataset sizes: what grows with the data, and by how much.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_memory.py --sizes 1000 10000 --out metrics/bench_memory.json

For each size, a throw-away project folder gets the repository's params.yaml with ``scenes.num_images`` set
to the size and one training epoch, and runs the stages of dvc.yaml in order (their own ``cmd``, as
``dvc repro`` would) but ``profile_dataloader``, whose work ``profile.max_images`` bounds. A stage's peak is the
resident set of its largest process (``wait4``'s ``ru_maxrss``: the stage itself or one of its workers or DDP
ranks). ``train`` runs four ways: images held in RAM, read from HDF5, and each with 2 DDP processes
(``train.nproc: 2``; the figure is then the largest rank). It measures the CPU path, the host's memory: a GPU
is hidden from the stages (two DDP processes on a one-GPU machine would not start). Wall seconds are recorded
too: they are this machine's, and only comparable between runs on an otherwise idle machine.

``--extrapolate N`` adds what the largest size's run implies for N images (real BDD100K has 100,000),
linearly: every stage's seconds, the packed and raw bytes, and the training questions per epoch times
N / size, but ``counterfactuals``, whose work is the test scenes it edits, ``counterfactuals.samples`` at most.
Linear holds where a stage's work is per image (rendering or reading, packing, one epoch's steps); a stage's fixed
start-up (imports, a model build) makes it an overestimate.

It also bounds one training epoch on one GPU from below, on paper, with two figures measured at the
largest size: the train stage's input pipeline alone (its loader as ``vlm/train.py`` builds it, reading
HDF5 and building the heads' targets per batch, in one process on this CPU: questions/s) and the model's
FLOPs per question (forward and backward, ``benchmarks/bench_train_step.py``'s count). An epoch takes at
least the longer of the loader's time for the epoch's questions and the FLOPs' time at
``--gpu-peak-tflops`` (989: an H100 SXM's dense bf16 peak, from NVIDIA's datasheet).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_memory.py --sizes 10000 --image-size 224 --variants "train (HDF5)" \
        --extrapolate 100000 --out metrics/bench_memory_224px.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from vlm.io import read_json, write_json

ROOT = Path(__file__).resolve().parents[1]
LOADER_EPOCHS = 2  # timed epochs of the train loader alone, after an untimed one
# profile_dataloader is left out: it reads at most profile.max_images images of a split, whatever the dataset's size
STAGES = ("generate_scenes", "generate_commands", "build_vocab", "pack_hdf5", "train_blind", "train", "evaluate",
          "counterfactuals")
TRAIN_VARIANTS = {  # name: (train params, runtime.train settings)
    "train": ({}, {"in_memory": True}),
    "train (HDF5)": ({}, {"in_memory": False}),
    "train (2 ranks)": ({"nproc": 2}, {"in_memory": True}),
    "train (2 ranks, HDF5)": ({"nproc": 2}, {"in_memory": False}),
}


def stage_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def run_stage(cmd: str, cwd: Path) -> dict:
    """Run ``cmd``; its wall seconds and the peak RSS (MiB) of its largest process."""
    env = stage_env()
    with tempfile.TemporaryFile() as stderr:  # a file, not a pipe: a stage's progress bars would fill a pipe
        start = time.perf_counter()
        process = subprocess.Popen(shlex.split(cmd), cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            stderr.seek(0)
            raise SystemExit(f"{cmd} failed:\n{stderr.read().decode(errors='replace')[-3000:]}")
    return {"peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "seconds": round(seconds, 1)}


def new_project(folder: Path) -> None:
    """A throw-away folder the stages' commands run in: the BDD100K dependency's folder and the data file the code
    reads from the project (the renderer's statistics, a path of generate_scenes' command)."""
    (folder / "data" / "bdd100k").mkdir(parents=True)
    statistics = Path("vlm/scenes/bdd100k_statistics.json")
    (folder / statistics).parent.mkdir(parents=True)
    shutil.copy(ROOT / statistics, folder / statistics)


def write_params(folder: Path, images: int, variant: tuple[dict, dict], epochs: int, image_size: int | None) -> None:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["scenes"]["num_images"] = images
    if image_size is not None:
        params["pack"]["image_size"] = image_size
    train, runtime = variant
    params["train"].update({"epochs": epochs, "blind_epochs": 1, **train})
    params["runtime"]["train"].update(runtime)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def measure(images: int, epochs: int, workdir: Path, variants: list[str], image_size: int | None) -> dict:
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    folder = workdir / f"{images}"
    new_project(folder)
    write_params(folder, images, TRAIN_VARIANTS["train"], epochs, image_size)
    results = {}
    for name in STAGES:
        if name != "train":
            results[name] = run_stage(stages[name]["cmd"], folder)
            print(f"{images:>7} images  {name:<24} {results[name]['peak_rss_mib']:8.1f} MiB "
                  f"{results[name]['seconds']:7.1f} s", flush=True)
            continue
        for variant in variants:
            train = TRAIN_VARIANTS[variant]
            write_params(folder, images, train, epochs, image_size)
            for stale in (folder / "models" / "checkpoints").glob("*"):
                stale.unlink()  # each variant trains from scratch
            results[variant] = run_stage(stages["train"]["cmd"], folder)
            print(f"{images:>7} images  {variant:<24} {results[variant]['peak_rss_mib']:8.1f} MiB "
                  f"{results[variant]['seconds']:7.1f} s", flush=True)
        write_params(folder, images, TRAIN_VARIANTS["train"], epochs, image_size)
    packed = {split: (folder / "data" / "processed" / f"{split}_images.h5").stat().st_size
              for split in ("train", "val", "test")}
    commands = read_json(folder / "metrics" / "commands.json", what="commands metrics")
    pack = read_json(folder / "metrics" / "pack.json", what="pack metrics")
    return {"images": images, "image_size": pack["image_size"], "stages": results, "packed_bytes": packed,
            "training_input": training_input(folder),
            "raw_bytes": sum(f.stat().st_size for f in (folder / "data" / "raw").rglob("*") if f.is_file()),
            "train_questions_per_epoch": commands["train"]["questions"]}


def training_input(folder: Path) -> dict:
    """The train stage's loader alone over LOADER_EPOCHS epochs after a first one, reading HDF5
    (``runtime.train.in_memory: false``) in one process, the model's FLOPs per question and its operators per
    training step, on the project in ``folder``: run in a child process (``--training-input``),
    since Linux carries a parent's peak RSS into the children it forks, and torch would inflate every
    stage measured after it."""
    result = subprocess.run([sys.executable, __file__, "--training-input", str(folder)], env=stage_env(),
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"measuring the training input failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])  # the last line: the child's report


def measure_training_input(folder: Path) -> dict:
    """What :func:`training_input` returns, measured in this process."""
    from benchmarks.bench_train_step import (  # noqa: PLC0415 (torch: child only)
        OPERATOR_STEPS,
        batches,
        build_run,
        count_flops,
        count_operators,
    )
    from vlm.data.loader import set_epoch  # noqa: PLC0415

    (folder / "probe").mkdir()
    # one process, whatever the params' num_workers (a recipe's 12 workers would start up on this machine's cores)
    run = build_run(str(folder / "params.yaml"), folder / "data" / "processed", folder / "probe",
                    {"in_memory": False, "num_workers": 0})
    questions, seconds = 0, 0.0
    for epoch in range(LOADER_EPOCHS + 1):  # the first one untimed: files opened, caches filled
        set_epoch(run.loader, epoch)
        start = time.perf_counter()
        count = sum(len(batch) for batch in run.loader)
        if epoch:
            questions, seconds = questions + count, seconds + time.perf_counter() - start
    flops = count_flops(run, batches(run))
    operators = count_operators(run, batches(run), OPERATOR_STEPS)
    return {"loader_questions_per_s": round(questions / seconds, 1),
            "train_gflops_per_question": round(flops["train_flops_per_question"] / 1e9, 4),
            "operators_per_step": operators["total"]}


def extrapolate(run: dict, images: int, gpu_peak_tflops: float, params: dict) -> dict:
    """``run``'s figures times ``images / run["images"]`` (see the module docstring for when that holds), the
    counterfactuals' seconds times the ratio of the test scenes they edit (``params``: the run's), and the two lower
    bounds of one GPU epoch's seconds."""
    scale = images / run["images"]
    samples, test = params["counterfactuals"]["samples"], params["commands"]["splits"]["test"]
    edited = min(samples, images * test) / min(samples, run["images"] * test)
    questions = round(run["train_questions_per_epoch"] * scale)
    arithmetic = questions * run["training_input"]["train_gflops_per_question"] * 1e9 / (gpu_peak_tflops * 1e12)
    return {"images": images, "from_images": run["images"],
            "stage_seconds": {name: round(r["seconds"] * (edited if name == "counterfactuals" else scale))
                              for name, r in run["stages"].items()},
            "packed_bytes": round(sum(run["packed_bytes"].values()) * scale),
            "raw_bytes": round(run["raw_bytes"] * scale),
            "train_questions_per_epoch": questions,
            "gpu_epoch": {"peak_tflops": gpu_peak_tflops,
                          "loader_seconds": round(questions / run["training_input"]["loader_questions_per_s"], 1),
                          "arithmetic_seconds_at_peak": float(f"{arithmetic:.3g}")}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--variants", nargs="+", choices=list(TRAIN_VARIANTS), default=list(TRAIN_VARIANTS),
                        help="the ways to run train")
    parser.add_argument("--image-size", type=int, default=None, help="pack.image_size (default: params.yaml's)")
    parser.add_argument("--extrapolate", type=int, default=None, metavar="N",
                        help="add the largest run's figures scaled to N images")
    parser.add_argument("--gpu-peak-tflops", type=float, default=989.0,
                        help="the GPU's peak for the on-paper epoch bound (989: H100 SXM, dense bf16)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--training-input", type=Path, default=None, help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args(argv)
    if args.training_input:
        print(json.dumps(measure_training_input(args.training_input)))
        return {}
    with tempfile.TemporaryDirectory() as workdir:
        runs = [measure(size, args.epochs, Path(workdir), args.variants, args.image_size) for size in args.sizes]
    report = {"machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                          "python": sys.version.split()[0]},
              "epochs": args.epochs, "image_size": runs[0]["image_size"], "runs": runs}
    if len(runs) >= 2:
        small, large = runs[0]["stages"], runs[-1]["stages"]  # peak at the largest size / at the smallest
        report["growth"] = {name: round(large[name]["peak_rss_mib"] / small[name]["peak_rss_mib"], 2) for name in small}
    if args.extrapolate:
        params = yaml.safe_load((ROOT / "params.yaml").read_text())  # what write_params gave every run
        report["extrapolated"] = extrapolate(runs[-1], args.extrapolate, args.gpu_peak_tflops, params)
    if args.out:
        write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
