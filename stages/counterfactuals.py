"""Stage counterfactuals: edit rendered test scenes one thing at a time; does the model's answer follow?"""

import argparse
from pathlib import Path

from vlm.cli import run
from vlm.commands.generate import CommandsConfig
from vlm.config import build_config
from vlm.counterfactuals import SCENES_KEYS, CounterfactualsConfig, CounterfactualsPaths
from vlm.counterfactuals import run as run_counterfactuals
from vlm.io import check_writable
from vlm.params import load_params, section
from vlm.scenes.generate import ScenesConfig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--raw", required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--details", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--plot", required=True)
    parser.add_argument("--sheet", required=True)
    parser.add_argument("--statistics", required=True)
    args = parser.parse_args(argv)
    check_writable(args.metrics, args.details, args.table, args.plot, args.sheet)
    params = load_params(args.params)
    config = build_config(CounterfactualsConfig, section(params, "counterfactuals"), "counterfactuals")
    scenes = build_config(ScenesConfig, section(params, "scenes"), "scenes", keys=SCENES_KEYS)
    commands = build_config(CommandsConfig, section(params, "commands"), "commands", keys=["types"])
    paths = CounterfactualsPaths(model=Path(args.model), data=Path(args.data), raw=Path(args.raw),
                                 metrics=Path(args.metrics), details=Path(args.details), table=Path(args.table),
                                 plot=Path(args.plot), sheet=Path(args.sheet),
                                 statistics=Path(args.statistics))
    summary = run_counterfactuals(config, scenes, commands, paths)

    def rate(value: float | None) -> str:  # None: the edit had no such question
        return "n/a" if value is None else f"{value:.1%}"

    for edit, m in summary.items():
        print(f"{edit:>18}: {m['pairs']} pairs, consistency {m['consistency']:.1%}, "
              f"changed when it must {rate(m['changed_when_it_must'])}, "
              f"stayed when it must {rate(m['stayed_when_it_must'])}")


if __name__ == "__main__":
    run(main)
