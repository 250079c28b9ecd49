"""Stage evaluate: the VLM and the blind baseline on the test split; metrics, tables and pictures."""

import argparse
from pathlib import Path

from vlm.cli import run
from vlm.config import build_config
from vlm.evaluate import EvaluateConfig, EvaluatePaths, evaluate
from vlm.io import check_writable
from vlm.params import load_params, section


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--models", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--raw", required=True)
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args(argv)
    check_writable(f"{args.metrics}/eval.json", f"{args.metrics}/eval/table.csv", f"{args.metrics}/plots/x.png")
    config = build_config(EvaluateConfig, section(load_params(args.params), "evaluate"), "evaluate")
    metrics_dir = Path(args.metrics)
    paths = EvaluatePaths(model=Path(args.models) / "vlm.pt", blind=Path(args.models) / "blind.pt",
                          data=Path(args.data), raw=Path(args.raw), metrics=metrics_dir / "eval.json",
                          tables=metrics_dir / "eval", plots=metrics_dir / "plots")
    metrics = evaluate(config, paths)
    print(f"{config.split}: VLM {metrics['vlm']['accuracy']:.1%}, blind {metrics['blind']['accuracy']:.1%}")
    for t, acc in metrics["vlm"]["per_type"].items():
        print(f"  {t:14s} VLM {acc:.1%}  blind {metrics['blind']['per_type'].get(t, 0):.1%}")


if __name__ == "__main__":
    run(main)
