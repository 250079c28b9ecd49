"""The result tables of the README and docs/experiments.md, written from the committed metrics (``make readme``): the
synthetic test split's accuracy per type (``metrics/eval.json``) and its weakest condition and calibration, the real
frames' accuracy (``metrics/real_frames.json``, `make real`), the speeds (the stages' and the training-time
benchmark's) and the counterfactuals' consistency per edit. Each table sits between ``<!-- make readme: NAME -->``
and ``<!-- /make readme -->``; the rest is prose. ``--check`` writes nothing and fails naming the tables that differ
(the test suite runs it)."""

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vlm.cli import run
from vlm.io import atomic_path, read_json

BLOCK = re.compile(r"(<!-- make readme: (\w+) -->\n)(.*?)(<!-- /make readme -->)", re.S)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def results_table(metrics: Path) -> str:
    """Test accuracy per command type, the VLM beside the blind baseline (``metrics/eval.json``)."""
    headline, details = read_json(metrics / "eval.json"), read_json(metrics / "eval" / "details.json")
    vlm, blind = headline["vlm"], headline["blind"]
    rows = [[t, str(details["questions_per_type"][t]), f"{vlm['per_type'][t]:.3f}", f"{blind['per_type'][t]:.3f}",
             f"{vlm['per_type'][t] - blind['per_type'][t]:+.3f}"] for t in vlm["per_type"]]
    rows.append(["**overall**", str(details["questions"]), f"**{vlm['accuracy']:.3f}**", f"**{blind['accuracy']:.3f}**",
                 f"{headline['gain_from_vision']['accuracy']:+.3f}"])
    return _table(["command type", "questions", "VLM", "blind", "gain"], rows)


def real_table(metrics: Path) -> str:
    """Real frames, zero-shot: the VLM, the blind baseline and each type's most common answer
    (``metrics/real_frames.json``, written by `make real`)."""
    real = read_json(metrics / "real_frames.json")

    def row(name: str, questions: int, scores: Callable[[str], float]) -> list[str]:
        return [name, f"{questions:,}", *(f"{scores(m):.3f}" for m in ("vlm", "blind", "most_common")),
                f"{scores('vlm') - scores('most_common'):+.3f}"]

    rows = [row(t, real["questions_per_type"][t], lambda m, t=t: real[m]["per_type"][t])
            for t in real["vlm"]["per_type"]]
    overall = row("**overall**", real["questions"], lambda m: real[m]["accuracy"])
    overall[2] = f"**{overall[2]}**"
    rows.append(overall)
    return (f"{real['frames']} frames, {real['questions']:,} questions (`metrics/real_frames.json`):\n\n"
            + _table(["command type", "questions", "VLM", "blind", "most common answer", "VLM against it"], rows))


def evaluation_summary(metrics: Path) -> str:
    """The weakest condition of the test split (``metrics/eval/slices.json``) and both models' calibration."""
    headline, slices = read_json(metrics / "eval.json"), read_json(metrics / "eval" / "slices.json")
    accuracy, dimension, value = min(((acc, d, v) for d, values in slices["vlm"].items() for v, acc in values.items()),
                                     key=lambda item: item[0])
    return (f"By condition (`metrics/eval/slices.json`) the weakest slice is `{dimension}` = `{value}`, "
            f"{accuracy:.3f}.\n"
            f"The expected calibration error is ECE {headline['vlm']['ece']:.3f} for the VLM and "
            f"{headline['blind']['ece']:.3f} for the blind baseline (`metrics/eval.json`).\n")


def speed_table(metrics: Path) -> str:
    """The committed run's stage speeds (`make repro`) and the training-time benchmark against the old defaults."""
    scenes, pack = read_json(metrics / "scenes.json"), read_json(metrics / "pack.json")
    loader, vlm = read_json(metrics / "dataloader.json"), read_json(metrics / "train_timing.json")
    blind, against = read_json(metrics / "train_blind_timing.json"), read_json(metrics / "bench_train_against.json")
    best = loader["best"]["128px"]
    new, old = against["results"]["params"], against["results"]["baseline"]
    rows = [
        [f"rendering 1280x720 scenes, {scenes['workers']} processes",
         f"{scenes['images_per_s']:.1f} images/s ({scenes['images']} in {scenes['seconds']:.1f} s)",
         "`metrics/scenes.json` (`make repro`)"],
        [f"packing to {pack['image_size']} px HDF5, {pack['workers']} processes",
         f"{pack['images_per_s']:.1f} images/s",
         "`metrics/pack.json` (`make repro`)"],
        ["dataloader, best setting of each, images and questions only (neither loader augments nor builds the heads' "
         "targets; the train loader with both: [memory per stage](docs/experiments.md#memory-per-stage))",
         f"{loader['speedup']['128px']:.2f}x the textbook loader at 128 px ({best['ours']['samples_per_s']:,.0f} vs "
         f"{best['naive']['samples_per_s']:,.0f} samples/s), {loader['speedup']['224px']:.2f}x at 224 px",
         "`metrics/dataloader.json` (`make repro`)"],
        ["training at the defaults", f"{vlm['questions_per_s']:.0f} questions/s (VLM, {vlm['seconds']:.0f} s), "
         f"{blind['questions_per_s']:.0f} questions/s (blind, {blind['seconds']:.0f} s)",
         "`metrics/train_timing.json`, `metrics/train_blind_timing.json` (`make repro`)"],
        ["training time against the square, row-per-question AdamW defaults this work started from",
         f"{new['training_time_ratio']:.3f}x ({new['training_steps']:,} steps against {old['training_steps']:,}, "
         f"each step at {new['speedup']:.3f} times the old one's speed: the median of the paired rounds' ratios, "
         f"interleaved in one process; the median steps took {new['ms_per_step']:.0f} and {old['ms_per_step']:.0f} "
         "ms)", "`metrics/bench_train_against.json` (command in "
         "[docs/experiments.md](docs/experiments.md#where-a-training-steps-time-goes))"],
    ]
    return "| what | result | file (command) |\n|---|---|---|\n" + "".join("| " + " | ".join(r) + " |\n" for r in rows)


def counterfactuals_table(metrics: Path) -> str:
    """Per edit of the ``counterfactuals`` stage, how often the answers follow it
    (``metrics/counterfactuals/summary.json``)."""
    edits = read_json(metrics / "counterfactuals" / "summary.json")["counterfactuals"]
    return _table(["edit", "pairs", "right on both", "changed when it must", "stayed when it must"],
                  [[edit, str(r["pairs"]), f"{r['consistency']:.3f}", f"{r['changed_when_it_must']:.3f}",
                    f"{r['stayed_when_it_must']:.3f}"] for edit, r in edits.items()])


TABLES: dict[str, Callable[[Path], str]] = {"results": results_table, "summary": evaluation_summary,
                                            "real": real_table, "speed": speed_table,
                                            "counterfactuals": counterfactuals_table}
DOCUMENTS = ("README.md", "docs/experiments.md")  # the files whose tables make readme writes


def rewrite(text: str, metrics: Path) -> str:
    """``text`` with every marked table written anew from ``metrics``."""
    def fill(match: re.Match) -> str:
        name = match[2]
        if name not in TABLES:
            raise ValueError(f"no table named {name!r} (make readme writes {', '.join(TABLES)})")
        return match[1] + TABLES[name](metrics) + match[4]
    return BLOCK.sub(fill, text)


def differing(text: str, metrics: Path) -> list[str]:
    """The marked tables of ``text`` that are not what ``metrics`` gives."""
    ours: dict[str, Any] = {m[2]: m[3] for m in BLOCK.finditer(text)}
    theirs = {m[2]: m[3] for m in BLOCK.finditer(rewrite(text, metrics))}
    return [name for name in ours if ours[name] != theirs[name]]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("documents", nargs="*", default=DOCUMENTS, help="the files to write the tables of")
    parser.add_argument("--metrics", default="metrics")
    parser.add_argument("--check", action="store_true", help="write nothing; fail if a table differs")
    args = parser.parse_args(argv)
    metrics = Path(args.metrics)
    for document in map(Path, args.documents):
        text = document.read_text(encoding="utf-8")
        if args.check:
            stale = differing(text, metrics)
            if stale:
                raise SystemExit(f"{document}: the tables {', '.join(stale)} are not {metrics}'s: run make readme")
            continue
        with atomic_path(document) as tmp:
            tmp.write_text(rewrite(text, metrics), encoding="utf-8")


if __name__ == "__main__":
    run(main)
