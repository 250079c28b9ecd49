"""The accuracy-vs-compute curve: the default design trained at 1x, 2x, 4x and 8x the default training compute
(epochs), at a larger image size (224 px) for 1x and 2x, and, with ``--image-multiples``, with the compute spent on
more rendered scenes at the default epochs instead (the images series: 2x = twice ``scenes.num_images``; its 1x is
the epochs series'), each a queued ``dvc exp run``; test accuracy overall and per command type against the training
seconds each run took.

    make scaling      # = PATH=.venv/bin:$PATH python benchmarks/scaling_curve.py

1. Queues the points that have no experiment yet, each as ``dvc exp run --queue -n scale-<size>px-<epochs>ep[-<n>img]
   -S train.epochs=<epochs> [-S pack.image_size=<size>] [-S scenes.num_images=<n>]`` on top of the workspace's
   params.yaml.
2. Runs the queue with one worker (``dvc queue start --jobs 1``: the seconds are only worth plotting when each
   run has the machine to itself) and waits for it; the worker holds no lock on the workspace.
3. Collects every finished point from its experiment's commit (params.yaml, metrics/eval.json,
   metrics/train.json, metrics/train_timing.json, and where the counterfactuals ran, each edit's share of answers
   changed when they must, metrics/counterfactuals/summary.json) into ``--out`` (metrics/scaling.json) and ``--plot``
   (metrics/plots/scaling.png). Each point is placed at its training steps times the seconds per step of its
   series' 1x run (:func:`at_reference_rate`: runs of hours share the machine with whatever else it does; their
   own wall clocks are kept beside). It says where each ``--targets`` accuracy is first reached, or, where not,
   the trend: accuracy gained per doubling of compute (a least-squares line in log2 of the multiple) and the
   multiple that line would need.

Interrupted (a killed worker, an ended session), it picks up where it stopped: finished experiments are kept,
unfinished ones are queued again, and their training resumes from its last checkpoint (kept in the repository's
models/checkpoints, not in the temporary copy DVC deleted; docs/architecture.md). ``--collect-only`` just
rewrites the JSON and the plot from the experiments that exist. Points whose name exists from an older baseline
are reused: remove them (``dvc exp remove``) after a change to the code that should change the curve. The file is
the curve's record: a point of ``--out`` whose experiment this repository does not hold (experiments live in the
clone that ran them) is kept as it is there; delete the file to start a curve over.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from vlm.io import atomic_path, write_json

COUNTERFACTUALS = "metrics/counterfactuals/summary.json"


@dataclass(frozen=True)
class Point:
    image_size: int
    epochs: int
    multiple: int  # training compute in units of the default run's (epochs x scenes / the default's)
    num_images: int | None = None  # scenes.num_images of the images series; None = params.yaml's (the epochs series)

    @property
    def name(self) -> str:
        return f"scale-{self.image_size}px-{self.epochs}ep" + (f"-{self.num_images}img" if self.num_images else "")

    @property
    def series(self) -> str:
        return series_name(self.image_size, self.num_images is not None)

    def set_params(self, default_size: int) -> list[str]:
        sets = [f"train.epochs={self.epochs}"]
        if self.image_size != default_size:
            sets.append(f"pack.image_size={self.image_size}")
        if self.num_images:
            sets.append(f"scenes.num_images={self.num_images}")
        return sets


def series_name(image_size: int, images: bool) -> str:
    """A series of the curve: ``128px`` (epochs grow), ``128px, images`` (scenes grow)."""
    return f"{image_size}px" + (", images" if images else "")


def plan(params: dict, multiples: list[int], large_size: int | None, large_multiples: list[int],
         base_epochs: int | None = None, image_multiples: list[int] = ()) -> list[Point]:
    """The curve's points, in the order they run: cheapest first, the default image size first. 1x is
    ``base_epochs`` (None: params.yaml's ``train.epochs``) of params.yaml's scenes; the images series' points above 1x
    keep those epochs and multiply the scenes."""
    epochs, size = int(base_epochs or params["train"]["epochs"]), int(params["pack"]["image_size"])
    points = [Point(size, epochs * m, m) for m in multiples]
    if large_size and large_size != size:
        points += [Point(large_size, epochs * m, m) for m in large_multiples]
    scenes = int(params["scenes"]["num_images"]) if image_multiples else 0
    points += [Point(size, epochs, m, scenes * m) for m in image_multiples if m > 1]
    return sorted(points, key=lambda p: (p.multiple * (p.image_size / size) ** 2, p.image_size, p.num_images or 0))


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def dvc(*args: str) -> str:
    result = subprocess.run(["dvc", *args], check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"dvc {' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def finished_experiments() -> dict[str, str]:
    """Experiment name -> commit, over every baseline (the newest commit where a name repeats)."""
    found = {}
    refs = git("for-each-ref", "--sort=committerdate", "--format=%(refname) %(objectname)", "refs/exps")
    for line in refs.splitlines():
        ref, commit = line.split()
        if ref.count("/") >= 4 and not ref.startswith("refs/exps/celery"):  # refs/exps/ab/cdef.../<name>
            found[ref.rsplit("/", 1)[1]] = commit
    return found


def queue_entries() -> dict[str, str]:
    """Name -> state (Queued, Running, Failed, Success) of the entries in DVC's experiment queue."""
    entries = {}
    for line in dvc("queue", "status").splitlines()[1:]:
        words = line.split()
        for state in ("Queued", "Running", "Failed", "Success"):
            if state in words and len(words) >= 2:
                entries[words[1]] = state
    return entries


def queue_missing(points: list[Point], default_size: int) -> list[Point]:
    """Queue every point without a finished experiment; an unfinished entry of the same name is replaced."""
    done, entries = finished_experiments(), queue_entries()
    queued = []
    for point in points:
        if point.name in done:
            continue
        if point.name in entries and entries[point.name] in ("Queued", "Running"):
            queued.append(point)  # still waiting from an earlier call in this session
            continue
        if point.name in entries:
            dvc("queue", "remove", point.name)
        sets = [arg for value in point.set_params(default_size) for arg in ("-S", value)]
        dvc("exp", "run", "--queue", "-n", point.name, *sets)
        queued.append(point)
    return queued


def run_queue(poll: float) -> None:
    """Start one queue worker and wait until nothing is queued or running. The worker runs detached and holds
    no lock on the workspace: ``dvc repro`` and ``dvc exp show`` keep working there meanwhile."""
    dvc("queue", "start", "--jobs", "1")
    last = None
    while True:
        states = queue_entries()
        running = sorted(name for name, state in states.items() if state == "Running")
        waiting = sum(state == "Queued" for state in states.values())
        if not running and not waiting:
            return
        if (running, waiting) != last:
            print(f"running {', '.join(running) or 'nothing'}; {waiting} queued", flush=True)
            last = (running, waiting)
        time.sleep(poll)


def read_at(commit: str, path: str):
    text = git("show", f"{commit}:{path}")
    return yaml.safe_load(text) if path.endswith(".yaml") else json.loads(text)


def changed_when_they_must(commit: str) -> dict[str, float] | None:
    """Each counterfactual edit's share of the answers that changed where they must, or None where the stage did
    not run (BDD100K data has no scenes to edit)."""
    if COUNTERFACTUALS not in git("ls-tree", "-r", "--name-only", commit, "metrics/counterfactuals").split():
        return None
    edits = read_at(commit, COUNTERFACTUALS)["counterfactuals"]
    return {edit: values["changed_when_it_must"] for edit, values in edits.items()}


def collect_point(point: Point, commit: str) -> dict:
    params = read_at(commit, "params.yaml")
    evaluation = read_at(commit, "metrics/eval.json")
    train = read_at(commit, "metrics/train.json")
    timing = read_at(commit, "metrics/train_timing.json")
    ran = (int(params["train"]["epochs"]), int(params["pack"]["image_size"]), int(params["scenes"]["num_images"]))
    if ran[:2] != (point.epochs, point.image_size) or point.num_images not in (None, ran[2]):
        raise SystemExit(f"experiment {point.name} ({commit[:7]}) ran train.epochs={ran[0]}, pack.image_size={ran[1]}, "
                         f"scenes.num_images={ran[2]}: not the point its name says")
    return {"name": point.name, "series": point.series, "image_size": point.image_size, "epochs": point.epochs,
            "num_images": ran[2], "multiple": point.multiple,
            "train_seconds": timing["seconds"], "questions_per_s": timing["questions_per_s"],
            "steps": train["steps"], "accuracy": evaluation["vlm"]["accuracy"],
            "per_type": evaluation["vlm"]["per_type"], "val_accuracy": train["val_accuracy"],
            "blind_accuracy": evaluation["blind"]["accuracy"],
            "counterfactuals_changed_when_they_must": changed_when_they_must(commit), "experiment": commit,
            "baseline": git("rev-parse", f"{commit}^").strip()}


def series_rows(rows: list[dict]) -> dict[str, list[dict]]:
    """Each series' rows by multiple; a series without a 1x run of its own (the images series) starts at its image
    size's 1x run, which is the same run."""
    series: dict[str, list[dict]] = {}
    for row in rows:
        series.setdefault(row["series"], []).append(row)
    for members in series.values():
        if all(r["multiple"] != 1 for r in members):
            members += [r for r in rows if r["image_size"] == members[0]["image_size"] and r["multiple"] == 1]
    return {name: sorted(members, key=lambda r: r["multiple"]) for name, members in sorted(series.items())}


def target_summary(rows: list[dict], target: float) -> dict:
    """Where ``target`` test accuracy is first reached, per series; else the log-linear trend."""
    summary = {}
    for name, series in series_rows(rows).items():
        reached = next((r for r in series if r["accuracy"] >= target), None)
        entry: dict = {"reached_at_multiple": reached["multiple"] if reached else None,
                       "seconds": reached["seconds"] if reached else None}
        if reached is None and len(series) >= 2:
            x = [math.log2(r["multiple"]) for r in series]
            y = [r["accuracy"] for r in series]
            mx, my = sum(x) / len(x), sum(y) / len(y)
            sxx = sum((a - mx) ** 2 for a in x)
            slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx if sxx else 0.0
            entry["gain_per_doubling"] = round(slope, 4)
            doublings = mx + (target - my) / slope if slope > 0 else math.inf
            # None: the line never gets there within 2^20 (a million) times the default compute
            entry["multiple_needed_by_trend"] = round(2**doublings, 1) if doublings <= 20 else None
        summary[name] = entry
    return summary


def plot(rows: list[dict], targets: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (overall, per_type) = plt.subplots(1, 2, figsize=(13, 5))
    all_series = series_rows(rows)
    for name, series in all_series.items():
        seconds = [r["seconds"] for r in series]
        overall.plot(seconds, [r["accuracy"] for r in series], "o-", label=f"VLM, {name.replace('px', ' px')}")
        for r in series:
            overall.annotate(f"{r['multiple']}x", (r["seconds"], r["accuracy"]), textcoords="offset points",
                             xytext=(4, -12), fontsize=8)
    base = series_name(min(r["image_size"] for r in rows), False)
    shown = all_series.get(base) or next(iter(all_series.values()))
    overall.plot([r["seconds"] for r in shown], [r["blind_accuracy"] for r in shown], "x:", color="grey",
                 label="blind baseline")
    for target in targets:
        overall.axhline(target, color="black", linewidth=0.6, linestyle="--")
    images = all_series.get(f"{base}, images", [])
    for index, command_type in enumerate(sorted(shown[0]["per_type"])):
        colour = f"C{index}"
        per_type.plot([r["seconds"] for r in shown], [r["per_type"][command_type] for r in shown], "o-",
                      color=colour, label=command_type)
        if len(images) > 1:  # the same type where the scenes grow: dashed
            per_type.plot([r["seconds"] for r in images], [r["per_type"][command_type] for r in images], "s--",
                          color=colour, alpha=0.7)
    type_title = f"Per command type, {base.replace('px', ' px')}" + (" (dashed: images series)" if len(images) > 1
                                                                    else "")
    for axes, title in ((overall, "Test accuracy vs training time"), (per_type, type_title)):
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axes.set_xlabel("training seconds (this machine, at the 1x run's rate)")
        axes.set_ylabel("test accuracy")
        axes.set_title(title)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def at_reference_rate(rows: list[dict]) -> None:
    """Add ``seconds``: the point's steps at the seconds per step of its series' 1x run (the run with the machine
    to itself); a series without its 1x point keeps its measured seconds. Longer runs shared the machine with
    other work, so their own wall clocks (``train_seconds``) are upper bounds."""
    for series in series_rows(rows).values():
        reference = next((r for r in series if r["multiple"] == 1), None)
        for row in series:
            rate = reference or row
            row["seconds"] = round(row["steps"] * rate["train_seconds"] / rate["steps"], 1)


def recorded(points: list[Point], found: dict[str, dict], previous: Path) -> list[dict]:
    """The rows of ``points``: those collected here (``found``, by name), else the row ``previous`` (an earlier
    ``--out``) holds for the point, from an experiment of another clone or session."""
    earlier = {}
    if previous.exists():
        for row in json.loads(previous.read_text(encoding="utf-8"))["points"]:
            row.setdefault("series", series_name(row["image_size"], False))  # files from before the images series
            earlier[row["name"]] = row
    return [found[p.name] if p.name in found else earlier[p.name] for p in points
            if p.name in found or p.name in earlier]


def collect(points: list[Point], targets: list[float], out: Path, plot_path: Path) -> dict:
    done = finished_experiments()
    rows = recorded(points, {p.name: collect_point(p, done[p.name]) for p in points if p.name in done}, out)
    if not rows:
        raise SystemExit("no point of the curve has a finished experiment yet")
    at_reference_rate(rows)
    names = {r["name"] for r in rows}
    result = {"machine": {"processor": platform.processor() or platform.machine(),
                          "threads": torch.get_num_threads(), "gpu": torch.cuda.is_available()},
              "points": rows, "missing": [p.name for p in points if p.name not in names],
              "targets": {f"{t:.2f}": target_summary(rows, t) for t in targets}}
    write_json(out, result)
    plot(rows, targets, plot_path)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--base-epochs", type=int, default=None, help="the epochs of 1x (default: train.epochs)")
    parser.add_argument("--large-size", type=int, default=224, help="image size of the second series (0: none)")
    parser.add_argument("--large-multiples", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--image-multiples", type=int, nargs="*", default=[],
                        help="the images series: these multiples of scenes.num_images at the 1x epochs")
    parser.add_argument("--targets", type=float, nargs="*", default=[0.90, 0.95])
    parser.add_argument("--out", type=Path, default=Path("metrics/scaling.json"))
    parser.add_argument("--plot", type=Path, default=Path("metrics/plots/scaling.png"))
    parser.add_argument("--collect-only", action="store_true", help="only rewrite --out and --plot")
    parser.add_argument("--poll", type=float, default=30.0, help="seconds between looks at the queue")
    args = parser.parse_args(argv)

    params = yaml.safe_load(args.params.read_text())
    points = plan(params, args.multiples, args.large_size, args.large_multiples, args.base_epochs,
                  args.image_multiples)
    if not args.collect_only:
        queued = queue_missing(points, int(params["pack"]["image_size"]))
        print(f"{len(points) - len(queued)} of {len(points)} points done; running "
              f"{', '.join(p.name for p in queued) or 'nothing'}", flush=True)
        if queued:
            run_queue(args.poll)
    result = collect(points, args.targets, args.out, args.plot)
    for row in result["points"]:
        print(f"{row['name']:>30}  {row['seconds']:7.0f} s  test {row['accuracy']:.3f}  "
              f"(blind {row['blind_accuracy']:.3f})")
    if result["missing"]:
        print(f"missing: {', '.join(result['missing'])}", file=sys.stderr)
        if not args.collect_only:  # they ran and did not finish: `dvc queue logs <name>` says why
            sys.exit(f"{len(result['missing'])} point(s) did not finish: `dvc queue logs <name>` has their output")


if __name__ == "__main__":
    main()
