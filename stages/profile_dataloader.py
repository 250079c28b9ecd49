"""DVC stage ``profile_dataloader``: samples/s of the naive loader and ours -> metrics and a plot."""

from __future__ import annotations

import argparse

from vlm.cli import run
from vlm.config import build_config
from vlm.data.profile import ProfileConfig, profile_dataloaders
from vlm.io import check_writable, write_json
from vlm.params import load_params, section
from vlm.plots import dataloader_figure, save_figure
from vlm.tokenizer import TrafficCommandTokenizer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--data", required=True, help="folder with commands/, vocab.json, *_images.h5")
    parser.add_argument("--metrics", required=True)
    parser.add_argument("--plot", required=True)
    args = parser.parse_args(argv)
    check_writable(args.metrics, args.plot)
    config = build_config(ProfileConfig, section(load_params(args.params), "profile"), "profile")
    tokenizer = TrafficCommandTokenizer.from_file(f"{args.data}/vocab.json")
    metrics = profile_dataloaders(
        commands_path=f"{args.data}/commands/{config.split}.json",
        h5_path=f"{args.data}/{config.split}_images.h5",
        tokenizer=tokenizer,
        config=config,
    )
    write_json(args.metrics, metrics)
    save_figure(dataloader_figure(metrics), args.plot, dpi=100)
    for size, best in metrics["best"].items():
        print(f"{size}: ours {best['ours']['samples_per_s']:.0f} samples/s ({best['ours']['loader']}), "
              f"naive {best['naive']['samples_per_s']:.0f} samples/s, speed-up {metrics['speedup'][size]}x")


if __name__ == "__main__":
    run(main)
