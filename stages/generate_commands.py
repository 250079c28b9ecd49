"""Stage generate_commands: balanced questions with label-derived answers, split by image."""

import argparse

from vlm.cli import run
from vlm.commands.generate import CommandsConfig, generate_commands
from vlm.config import build_config
from vlm.io import check_writable, write_json
from vlm.params import load_params, section
from vlm.plots import commands_sheet, save_image


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--raw", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--sheet", required=True)
    args = parser.parse_args(argv)
    check_writable(args.out, args.metrics, args.sheet)
    config = build_config(CommandsConfig, section(load_params(args.params), "commands"), "commands")
    stats, shown = generate_commands(config, args.raw, args.out)
    write_json(args.metrics, stats)
    save_image(commands_sheet(shown), args.sheet)
    print(", ".join(f"{split}: {s['questions']} questions on {s['images']} images" for split, s in stats.items()))


if __name__ == "__main__":
    run(main)
