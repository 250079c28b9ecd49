"""The held-out combination gap (CLEVR-CoGenT style): how much worse the model answers about frames whose
combination of attributes it never saw in training.

    make holdout      # = PATH=.venv/bin:$PATH python benchmarks/holdout_gap.py

Queues (if it has not run yet) one experiment, ``dvc exp run -n holdout-<values> -S 'commands.holdout=...'
evaluate`` (default: rainy nights; the pipeline up to the evaluate stage, the only outputs compared: its
counterfactuals and dataloader profile stay its parent's), whose test split is every frame with that
combination and whose train and val splits hold none; runs the queue (:func:`scaling_curve.run_queue`) and
compares, on the frames of that combination in
the workspace's own (random) test split:

- the workspace's model, which saw the combination in training (its ``metrics/eval/predictions.csv``);
- the held-out experiment's model, which did not (its predictions on the same frames).

Both are also reported per command type, with the held-out model's accuracy on its whole test split. Writes
``--out`` (metrics/holdout.json). The workspace's metrics must be those of its committed default run
(``dvc status evaluate`` clean, checked first), as after ``make repro``.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pandas as pd
import scaling_curve
import yaml

from vlm.io import write_json


def parse_combination(text: str) -> dict[str, str]:
    """``timeofday=night,weather=rainy`` -> {"timeofday": "night", "weather": "rainy"}."""
    pairs = [item.split("=", 1) for item in text.split(",") if item]
    if not pairs or any(len(p) != 2 or not p[0] or not p[1] for p in pairs):
        raise SystemExit(f"--combination: expected attribute=value[,attribute=value...], got {text!r}")
    return dict(pairs)


def experiment_name(combination: dict[str, str]) -> str:
    return "holdout-" + "-".join(v.replace(" ", "_").replace("/", "_") for v in combination.values())


def predictions_at(commit: str) -> pd.DataFrame:
    return pd.read_csv(io.StringIO(scaling_curve.git("show", f"{commit}:metrics/eval/predictions.csv")),
                       dtype={"image_id": str})


def accuracy(table: pd.DataFrame) -> dict:
    return {"questions": len(table), "accuracy": round(float(table["correct"].mean()), 4),
            "per_type": {t: round(float(g["correct"].mean()), 4) for t, g in table.groupby("command_type")}}


def same_mix(seen: pd.DataFrame, held_out: pd.DataFrame) -> dict:
    """Both models' accuracies with each question template weighted as in ``seen``'s questions (post-stratified: the
    two splits ask different questions of the same frames, in another mix of templates), the gap at that mix, and its
    standard error (binomial within each template, the questions taken as independent: those of one frame are not,
    so it is a lower bound). Templates ``held_out`` did not ask are left out of both."""
    by_seen = seen.groupby("template")["correct"].agg(["mean", "count"])
    by_held = held_out.groupby("template")["correct"].agg(["mean", "count"])
    shared = by_seen.index.intersection(by_held.index)
    s, h = by_seen.loc[shared], by_held.loc[shared]
    weight = s["count"] / s["count"].sum()  # [templates]: the seen questions' mix
    seen_accuracy, held_accuracy = float((weight * s["mean"]).sum()), float((weight * h["mean"]).sum())
    variance = float((weight ** 2 * (s["mean"] * (1 - s["mean"]) / s["count"]
                                     + h["mean"] * (1 - h["mean"]) / h["count"])).sum())
    return {"templates": len(shared), "templates_left_out": sorted(set(by_seen.index) - set(shared)),
            "questions": {"seen_in_training": int(s["count"].sum()), "held_out": int(h["count"].sum())},
            "seen_in_training": round(seen_accuracy, 4), "held_out": round(held_accuracy, 4),
            "gap": round(seen_accuracy - held_accuracy, 4), "gap_standard_error": round(variance ** 0.5, 4)}


def compare(seen: pd.DataFrame, unseen: pd.DataFrame, combination: dict[str, str]) -> dict:
    """``seen``: predictions of the model trained with the combination; ``unseen``: of the model trained
    without it. Both are compared on the frames of the combination in ``seen``'s test split: each on its own
    questions about them, and at the same mix of question templates (:func:`same_mix`), the gap to read."""
    mask = pd.Series(True, index=seen.index)
    for attribute, value in combination.items():
        mask &= seen[attribute] == value
    frames = set(seen.loc[mask, "image_id"])
    if not frames:
        raise SystemExit(f"no frame with {combination} in the workspace's test split")
    same_frames = unseen[unseen["image_id"].isin(frames)]
    result = {"combination": combination, "frames": len(frames),
              "seen_in_training": accuracy(seen[mask]), "held_out": accuracy(same_frames),
              "held_out_whole_split": accuracy(unseen)}
    result["gap"] = round(result["seen_in_training"]["accuracy"] - result["held_out"]["accuracy"], 4)
    result["same_mix"] = same_mix(seen[mask], same_frames)
    return result


def check_workspace_run() -> None:
    """Stop unless the workspace's test predictions are its ``dvc.lock``'s run of its code and params."""
    changed = json.loads(scaling_curve.dvc("status", "--json", "evaluate") or "{}")
    if changed:
        raise SystemExit(f"the workspace is not its committed run (dvc status evaluate: {', '.join(changed)} "
                         "changed), so its metrics/eval/predictions.csv is not the model to compare against: run "
                         "`make repro` (or `dvc repro evaluate`) first")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--combination", default="timeofday=night,weather=rainy")
    parser.add_argument("--out", type=Path, default=Path("metrics/holdout.json"))
    parser.add_argument("--poll", type=float, default=30.0)
    args = parser.parse_args(argv)
    combination = parse_combination(args.combination)
    name = experiment_name(combination)
    check_workspace_run()
    if name not in scaling_curve.finished_experiments():
        entries = scaling_curve.queue_entries()
        if entries.get(name) not in ("Queued", "Running"):
            if name in entries:
                scaling_curve.dvc("queue", "remove", name)
            scaling_curve.dvc("exp", "run", "--queue", "-n", name, "-S",
                              "++commands.holdout=" + yaml.safe_dump(combination, default_flow_style=True).strip(),
                              "evaluate")
        scaling_curve.run_queue(args.poll)
    commit = scaling_curve.finished_experiments().get(name)
    if commit is None:
        state = scaling_curve.queue_entries().get(name, "not in the queue")
        raise SystemExit(f"the held-out experiment {name} did not finish ({state}): `dvc queue logs {name}` has its "
                         "output")
    result = compare(pd.read_csv("metrics/eval/predictions.csv", dtype={"image_id": str}), predictions_at(commit),
                     combination)
    result["experiment"] = commit
    write_json(args.out, result)
    mix = result["same_mix"]
    print(f"{combination}: on the same {result['frames']} frames, at the same mix of questions, seen in training "
          f"{mix['seen_in_training']:.3f}, held out {mix['held_out']:.3f} (gap {mix['gap']:+.3f}, standard error "
          f"{mix['gap_standard_error']:.3f}); each on its own questions {result['seen_in_training']['accuracy']:.3f} "
          f"and {result['held_out']['accuracy']:.3f}")


if __name__ == "__main__":
    main()
