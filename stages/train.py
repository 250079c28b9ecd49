"""Stage train (and train_blind with --blind): the VLM on the train split, best model on val.

Runs the same under torchrun for DDP: `torchrun --nproc_per_node=2 stages/train.py`.
"""

import argparse
from pathlib import Path

from vlm.cli import run
from vlm.params import build_config, load_params, section
from vlm.scenes.generate import ScenesConfig
from vlm.train import TrainConfig, TrainPaths, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--blind", action="store_true", help="train the text-only baseline (no image)")
    parser.add_argument("--data", default="data/processed", help="folder with commands/, vocab.json, *_images.h5")
    parser.add_argument("--models", default="models")
    parser.add_argument("--metrics", default="metrics")
    parser.add_argument("--live", default="dvclive")
    args = parser.parse_args()
    params = load_params(args.params)
    config = build_config(TrainConfig, section(params, "train"), "train")
    name = "blind" if args.blind else "vlm"
    data = Path(args.data)
    paths = TrainPaths(commands_dir=data / "commands", vocab=data / "vocab.json", images_dir=data,
                       model=Path(args.models) / f"{name}.pt", checkpoint_dir=Path(args.models) / "checkpoints",
                       metrics=Path(args.metrics) / ("train_blind.json" if args.blind else "train.json"),
                       live_dir=Path(args.live) / name)
    scenes = build_config(ScenesConfig, section(params, "scenes"), "scenes")  # frame size of the label boxes
    frame_size = (scenes.width, scenes.height)
    metrics = train(section(params, "model"), config, paths, blind=args.blind, frame_size=frame_size)
    if metrics:
        print(", ".join(f"{k}: {v}" for k, v in metrics.items()))


if __name__ == "__main__":
    run(main)
