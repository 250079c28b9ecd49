"""Stage generate_scenes: render synthetic traffic scenes, or read BDD100K, into data/raw."""

import argparse
from pathlib import Path

from vlm.cli import run
from vlm.config import build_config
from vlm.io import check_writable, write_json
from vlm.params import load_params, runtime_section, section
from vlm.scenes.generate import ScenesConfig, ScenesRuntime, generate_scenes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", required=True)
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--statistics", required=True, help="BDD100K's statistics, which synthetic scenes follow")
    args = parser.parse_args(argv)
    check_writable(args.out, args.metrics)
    params = load_params(args.params)
    config = build_config(ScenesConfig, section(params, "scenes"), "scenes")
    runtime = build_config(ScenesRuntime, runtime_section(params, "scenes"), "runtime.scenes")
    stats = generate_scenes(config, args.out, runtime=runtime, statistics=Path(args.statistics))
    write_json(args.metrics, stats)
    print(", ".join(f"{k}: {v}" for k, v in stats.items()))


if __name__ == "__main__":
    run(main)
