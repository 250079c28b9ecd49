"""Stage generate_scenes: render synthetic traffic scenes, or read BDD100K, into data/raw."""

import argparse

from vlm.cli import run
from vlm.io import check_writable, write_json
from vlm.params import build_config, load_params, section
from vlm.scenes.generate import ScenesConfig, generate_scenes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", required=True)
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args(argv)
    check_writable(args.out, args.metrics)
    config = build_config(ScenesConfig, section(load_params(args.params), "scenes"), "scenes")
    stats = generate_scenes(config, args.out)
    write_json(args.metrics, stats)
    print(", ".join(f"{k}: {v}" for k, v in stats.items()))


if __name__ == "__main__":
    run(main)
