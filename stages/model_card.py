"""Stage model_card: the model card beside the model (models/README.md), written from the run's params and metrics."""

import argparse
from pathlib import Path

from vlm.cli import run
from vlm.io import atomic_path, check_writable
from vlm.model_card import CardInputs, model_card
from vlm.params import load_params


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--model", required=True)
    parser.add_argument("--metrics", required=True, help="the folder of eval.json, train.json, ...")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    check_writable(args.out)
    metrics = Path(args.metrics)
    inputs = CardInputs(model=Path(args.model), eval=metrics / "eval.json", train=metrics / "train.json",
                        scenes=metrics / "scenes.json", commands=metrics / "commands.json",
                        real=metrics / "real" / "details.json", real_frames=metrics / "real_frames.json")
    card = model_card(inputs, load_params(args.params))
    with atomic_path(args.out) as tmp:
        tmp.write_text(card, encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run(main)
