"""What the GPU recipe asks of a GPU, counted on this CPU: its training compute as a multiple of the default run's,
and its loader's rate against the step rate measured on a GPU.

    PYTHONPATH=. .venv/bin/python benchmarks/recipe_compute.py --out metrics/recipe_compute.json

Two throw-away projects of ``--images`` rendered scenes, one with params.yaml's values and one with recipes/gpu.yaml's
over them, run the data stages (their ``cmd`` in dvc.yaml, as ``benchmarks/bench_memory.py`` does). For each, as the
train stage builds its run:

- the model's FLOPs per question, forward and backward (``benchmarks/bench_train_step.py``'s count, on one batch of
  ``--count-batch`` questions: a packed batch's FLOPs per question do not depend on how many it holds);
- the ATen operators of a training step, views excluded (``bench_train_step.py``'s count): on a GPU, the kernels it
  launches;
- the train loader alone, reading HDF5 in one process, in questions/s (``bench_memory.py``'s probe);
- the share of images in the train split.

The planned training is then the train questions at the params' ``scenes.num_images`` (at ``--commands``' questions
per train image, a full run's) times ``train.epochs``, and its FLOPs those questions times the FLOPs per question.
The report gives the recipe's as a multiple of the default's, beside the accuracy-vs-compute curve's points
(``metrics/scaling.json``), each with its series: the default shape's multiples of its training, and the 224 px
series' multiples of its own 1x run. The loader's rate is per process: the
recipe's ``runtime.train.num_workers`` processes deliver up to that many times it, against the questions/s of
``--gpu-steps-per-s`` steps (the rate measured on an H200 at the recipe's shape, docs/experiments.md).

``gpu_launch_estimate`` reads the GPU's step time as a cost per operator: each ``--gpu-run`` (a GPU run's files,
``=`` the ``bench_train_step.py --compare`` tweak whose step is that run's, in ``--operators``' report) gives its
milliseconds per step over its operators per step, and the range of those costs times each run's operators here
predicts its GPU step, for a step bound by its launches (its arithmetic not counted).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks.bench_memory import ROOT, new_project, run_stage, training_input
from vlm.io import read_json, write_json
from vlm.recipe import apply, overrides

DATA_STAGES = ("generate_scenes", "generate_commands", "build_vocab", "pack_hdf5")
# the GPU runs' default pipelines (metrics/gpu/<run>/default) and the --compare tweak whose step each one ran: the
# first (92dabbb) trained with AdamW, the second (f908e5c) with torch.optim.Muon's loop over the matrices
GPU_RUNS = (("h200-2026-11-26", "adamw"), ("h200-2026-11-26b", "per_matrix_muon"))


def measure(name: str, params: dict, images: int, count_batch: int, workdir: Path, per_image: float) -> dict:
    """The data stages on ``images`` scenes of ``params``, then the training input's probe and the planned training
    at ``per_image`` questions per train image."""
    folder = workdir / name
    new_project(folder)
    small = apply(copy.deepcopy(params), {"scenes.num_images": images, "train.batch_size": count_batch},
                  "recipe_compute")
    (folder / "params.yaml").write_text(yaml.safe_dump(small, sort_keys=False))
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in DATA_STAGES:
        run_stage(stages[stage]["cmd"], folder)
    probe = training_input(folder)
    train = read_json(folder / "metrics" / "commands.json", what="commands metrics")["train"]
    train_share = train["images"] / images
    per_epoch = round(params["scenes"]["num_images"] * train_share * per_image)
    epochs, batch_size = params["train"]["epochs"], params["train"]["batch_size"]
    questions = per_epoch * epochs
    return {"images": params["scenes"]["num_images"], "epochs": epochs, "batch_size": batch_size,
            "train_questions_per_image": round(per_image, 3), "train_share": round(train_share, 3),
            # an epoch's last batch is a part one (the questions of an image stay together: a few more)
            "train_questions": questions, "steps": math.ceil(per_epoch / batch_size) * epochs,
            "train_gflops_per_question": probe["train_gflops_per_question"],
            "train_pflops": float(f"{questions * probe['train_gflops_per_question'] / 1e6:.4g}"),
            "operators_per_step": probe["operators_per_step"],
            "loader_questions_per_s_one_process": probe["loader_questions_per_s"],
            "num_workers": params["runtime"]["train"].get("num_workers", 0)}


def gpu_run_inputs(gpu_runs: list[str], operators: Path) -> list[tuple[str, str, dict, int]]:
    """Each ``FOLDER=TWEAK`` of ``gpu_runs`` as (folder, tweak, its training timing, the tweak's operators per step
    in the ``operators`` report), read before any measurement; a missing or mistyped one stops with one line."""
    tweaks = read_json(operators, what="bench_train_step.py --compare's report").get("results", {})
    inputs = []
    for item in gpu_runs:
        folder, _, tweak = item.partition("=")
        if not folder or not tweak:
            raise SystemExit(f"--gpu-run: expected FOLDER=TWEAK, got {item!r}")
        count = tweaks.get(tweak, {}).get("operators_per_step", {}).get("total")
        if count is None:
            raise SystemExit(f"--gpu-run {item}: {operators} has no operators_per_step of a tweak {tweak!r} (it has "
                             f"{', '.join(tweaks) or 'none'}; bench_train_step.py --compare writes them)")
        timing = read_json(ROOT / folder / "train_timing.json", what="a GPU run's training timing")
        inputs.append((folder, tweak, timing, count))
    return inputs


def launch_estimate(inputs: list[tuple[str, str, dict, int]], default: dict, recipe: dict) -> dict:
    """The GPU runs' microseconds per operator (:func:`gpu_run_inputs`), and the default's and the recipe's steps
    predicted from them."""
    runs = []
    for folder, tweak, timing, count in inputs:
        ms = timing["seconds"] / timing["planned_steps"] * 1e3
        runs.append({"run": folder, "step_of": tweak, "operators_per_step": count, "ms_per_step": round(ms, 2),
                     "questions_per_step": round(timing["questions_per_s"] * ms / 1e3, 2),
                     "us_per_operator": round(ms / count * 1e3, 2)})
    costs = sorted(run["us_per_operator"] for run in runs)
    questions = statistics.fmean(run["questions_per_step"] for run in runs)

    def predict(count: float, questions_per_step: float, steps: int) -> dict:  # each range low to high
        ms = [count * cost / 1e3 for cost in costs]
        rates = sorted(1e3 / m for m in ms)
        return {"operators_per_step": count, "ms_per_step": [round(m, 1) for m in ms],
                "steps_per_s": [round(rate, 2) for rate in rates],
                "questions_per_s": [round(questions_per_step * rate) for rate in rates],
                "training_seconds": sorted(round(steps / rate, 1) for rate in rates)}

    return {"runs": runs, "us_per_operator": costs,
            "default": predict(default["operators_per_step"], questions, default["steps"]),
            "recipe": predict(recipe["operators_per_step"], recipe["batch_size"], recipe["steps"])}


def report(params_path: Path, recipe_path: Path, images: int, count_batch: int, gpu_steps_per_s: float,
           scaling: Path, gpu_runs: list[str], operators: Path, commands: Path) -> dict:
    params = yaml.safe_load(params_path.read_text())
    recipe = apply(copy.deepcopy(params),
                   overrides(yaml.safe_load(recipe_path.read_text()), params, str(recipe_path)), str(recipe_path))
    train = read_json(commands, what="a full run's commands metrics")["train"]
    per_image = train["questions"] / train["images"]  # the recipe changes no commands param
    inputs = gpu_run_inputs(gpu_runs, operators)
    with tempfile.TemporaryDirectory() as workdir:
        default = measure("default", params, images, count_batch, Path(workdir), per_image)
        gpu = measure("recipe", recipe, images, count_batch, Path(workdir), per_image)
    loader_bound = gpu["loader_questions_per_s_one_process"] * max(1, gpu["num_workers"])
    curve = read_json(scaling, what="the accuracy-vs-compute curve")["points"] if scaling.exists() else []
    return {
        "images_measured": images, "default": default, "recipe": gpu,
        "compute_multiple": round(gpu["train_pflops"] / default["train_pflops"], 1),
        # each point's series as scaling_curve.py writes it (128px: more epochs; "128px, images": more scenes;
        # 224px: more epochs at 224 px, its multiples of its own 1x run)
        "curve": [{"series": p["series"], "image_size": p["image_size"], "multiple": p["multiple"],
                   "num_images": p.get("num_images"), "accuracy": p["accuracy"]} for p in curve],
        "gpu_step_rate": {"steps_per_s": gpu_steps_per_s,
                          "questions_per_s": round(gpu_steps_per_s * gpu["batch_size"], 1),
                          "loader_questions_per_s_all_workers": round(loader_bound, 1),
                          "training_minutes": round(gpu["steps"] / gpu_steps_per_s / 60, 1)},
        "gpu_launch_estimate": launch_estimate(inputs, default, gpu),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "gpu.yaml")
    parser.add_argument("--images", type=int, default=100, help="rendered scenes of each throw-away project")
    parser.add_argument("--count-batch", type=int, default=64, help="questions of the batch whose FLOPs are counted")
    parser.add_argument("--gpu-steps-per-s", type=float, default=3.4,
                        help="the recipe's step rate measured on a GPU (docs/experiments.md: at least 3.4 on an H200)")
    parser.add_argument("--scaling", type=Path, default=ROOT / "metrics" / "scaling.json")
    parser.add_argument("--gpu-run", dest="gpu_runs", action="append", metavar="FOLDER=TWEAK",
                        help="a GPU run's files (a folder in the project, or absolute) and the --compare tweak whose "
                             "step it ran (default: the two H200 runs)")
    parser.add_argument("--commands", type=Path, default=ROOT / "metrics" / "commands.json",
                        help="a full run's commands metrics: its questions per train image (a split of --images scenes "
                             "has fewer: the question mix is balanced over the split)")
    parser.add_argument("--operators", type=Path, default=ROOT / "metrics" / "bench_train_muon.json",
                        help="bench_train_step.py --compare's report with those tweaks' operators per step")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    gpu_runs = args.gpu_runs or [f"metrics/gpu/{run}/default={tweak}" for run, tweak in GPU_RUNS]
    result = report(args.params, args.recipe, args.images, args.count_batch, args.gpu_steps_per_s, args.scaling,
                    gpu_runs, args.operators, args.commands)
    write_json(args.out, result)
    json.dump(result, sys.stdout, indent=1)
    print()
    return result


if __name__ == "__main__":
    main()
