"""The workspace's models zero-shot on a folder of real labelled frames (BDD100K's layout), after ``make repro``:
the committed measurement the README's real-frames column reads.

    make real ROOT=/path/to/bdd100k_val   # = python benchmarks/real_frames.py --root /path/to/bdd100k_val

The evaluate_real stage's measurement (``vlm.real.evaluate_real``: every question the frames' labels can answer,
per type beside each type's most common answer) with ``real.root`` set to ``--root`` and params.yaml's other
values. Writes ``--out`` (metrics/real_frames.json): the headline and the per-question accuracies, with the command
and the models' sha256. Only aggregates are written there: the predictions per frame and the failure sheet (real
frames, which BDD100K's licence keeps out of the repository) go to ``--sheets`` (a temporary folder by default).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from vlm.checkpoint import file_sha256
from vlm.commands.generate import CommandsConfig
from vlm.config import build_config
from vlm.io import write_json
from vlm.params import load_params, section
from vlm.real import MODELS, RealConfig, RealPaths, evaluate_real

QUESTIONS = ("scene/night", "scene/rain", "scene/highway", "detection/present|car", "detection/present|pedestrian",
             "detection/present|traffic light", "counting/how_many|car", "traffic_light/color")


def measure(root: str, params_path: Path, models: Path, vocab: Path, sheets: Path) -> dict:
    params = load_params(params_path)
    config = build_config(RealConfig, {**section(params, "real"), "root": root}, "real")
    commands = build_config(CommandsConfig, section(params, "commands"), "commands", keys=["types"])
    paths = RealPaths(model=models / "vlm.pt", blind=models / "blind.pt", vocab=vocab,
                      metrics=sheets / "real.json", tables=sheets, plots=sheets)
    details = evaluate_real(config, commands.asked, paths)
    if not details["measured"]:
        raise SystemExit(details["note"])
    return {"command": "python benchmarks/real_frames.py --root /path/to/bdd100k_val",
            "models_sha256": {name: file_sha256(models / f"{name}.pt") for name in ("vlm", "blind")},
            **{key: details[key] for key in ("frames", "questions", "frames_left_out", "questions_per_type")},
            **{model: {"accuracy": details[model]["accuracy"], "per_type": details[model]["per_type"],
                       "per_question": {q: details[model]["per_question"].get(q) for q in QUESTIONS},
                       **({"ece": details[model]["ece"]} if "ece" in details[model] else {})}
               for model in MODELS}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="a folder of labelled frames in BDD100K's layout")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--models", type=Path, default=Path("models"))
    parser.add_argument("--vocab", type=Path, default=Path("data/processed/vocab.json"))
    parser.add_argument("--out", type=Path, default=Path("metrics/real_frames.json"))
    parser.add_argument("--sheets", type=Path, help="where the predictions and the failure sheet go (not committed)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="real_frames_") as scratch:
        result = measure(args.root, args.params, args.models, args.vocab, args.sheets or Path(scratch))
    write_json(args.out, result)
    print(f"{result['frames']} frames, {result['questions']} questions: "
          + ", ".join(f"{model} {result[model]['accuracy']:.3f}" for model in MODELS) + f" -> {args.out}")


if __name__ == "__main__":
    main()
