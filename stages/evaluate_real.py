"""Stage evaluate_real: the VLM and the blind baseline zero-shot on real labelled frames (BDD100K's layout), or a note
that nothing was measured when real.root is null."""

import argparse
from pathlib import Path

from vlm.cli import run
from vlm.commands.generate import CommandsConfig
from vlm.config import build_config
from vlm.io import check_writable
from vlm.params import load_params, section
from vlm.real import MODELS, RealConfig, RealPaths, evaluate_real


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--models", required=True)
    parser.add_argument("--vocab", required=True)
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args(argv)
    metrics_dir = Path(args.metrics)
    check_writable(metrics_dir / "real.json", metrics_dir / "real" / "details.json", metrics_dir / "plots" / "x.png")
    params = load_params(args.params)
    config = build_config(RealConfig, section(params, "real"), "real")
    commands = build_config(CommandsConfig, section(params, "commands"), "commands", keys=["types"])
    paths = RealPaths(model=Path(args.models) / "vlm.pt", blind=Path(args.models) / "blind.pt",
                      vocab=Path(args.vocab), metrics=metrics_dir / "real.json", tables=metrics_dir / "real",
                      plots=metrics_dir / "plots")
    details = evaluate_real(config, commands.asked, paths)
    if not details["measured"]:
        print(details["note"])
        return
    print(f"{details['frames']} real frames, {details['questions']} questions: "
          + ", ".join(f"{model} {details[model]['accuracy']:.1%}" for model in MODELS))
    for t in details["vlm"]["per_type"]:
        print(f"  {t:14s} " + "  ".join(f"{model} {details[model]['per_type'][t]:.1%}" for model in MODELS))


if __name__ == "__main__":
    run(main)
