"""Stage train (and train_blind with --blind): the VLM on the train split, best model on val.

With train.nproc > 1 it relaunches itself under torchrun (that many DDP processes on this machine); it runs
the same under a torchrun started by hand (several machines: `torchrun --nnodes ... -m stages.train ...`).
"""

import argparse
import sys
from pathlib import Path

import torch

from vlm.cli import in_repository, relaunch_distributed, run, under_torchrun
from vlm.config import build_config, check
from vlm.params import load_params, runtime_section, section
from vlm.scenes.generate import ScenesConfig
from vlm.train import BLIND_TRAIN_KEYS, VLM_TRAIN_KEYS, TrainConfig, TrainPaths, TrainRuntime, check_inputs, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--blind", action="store_true", help="train the text-only baseline (no image)")
    parser.add_argument("--data", type=Path, required=True, help="folder with commands/, vocab.json, *_images.h5")
    parser.add_argument("--model", type=Path, required=True, help="the best model's file")
    parser.add_argument("--checkpoints", type=Path, required=True,
                        help="folder of the resume checkpoints (in the repository DVC runs the stage for, DVC_ROOT)")
    parser.add_argument("--metrics", type=Path, required=True, help="JSON file of the run's headline metrics")
    parser.add_argument("--timing", type=Path, required=True, help="JSON file of the run's seconds and questions/s")
    parser.add_argument("--live", type=Path, required=True, help="dvclive folder of the training curves")
    args = parser.parse_args()
    params = load_params(args.params)
    config = build_config(TrainConfig, section(params, "train"), "train",
                          keys=BLIND_TRAIN_KEYS if args.blind else VLM_TRAIN_KEYS)
    runtime = build_config(TrainRuntime, runtime_section(params, "train"), "runtime.train")  # speed only
    gpus = torch.cuda.device_count()
    check(gpus == 0 or config.nproc <= gpus, "train.nproc",
          f"{config.nproc} processes, {gpus} GPU(s) here: one process per GPU "
          "(CUDA_VISIBLE_DEVICES= trains on the CPU)")
    # the checkpoints in the repository itself when DVC runs a queued experiment in a temporary copy: a killed one
    # resumes when it is queued again
    paths = TrainPaths(data=args.data, model=args.model, checkpoints=in_repository(args.checkpoints),
                       metrics=args.metrics, timing=args.timing, live=args.live)
    if config.nproc > 1 and not under_torchrun():
        check_inputs(section(params, "model"), config, paths, blind=args.blind)  # one line, not one per process
    relaunch_distributed(config.nproc, "stages.train", sys.argv[1:])  # train.nproc > 1: under torchrun
    if args.blind:  # the text-only decoder reads no image: no frame size, no vision params
        metrics = train(section(params, "model"), config, paths, blind=True, runtime=runtime)
    else:  # of scenes, the frame size the label boxes are given in, and nothing else
        frame = build_config(ScenesConfig, section(params, "scenes"), "scenes", keys=("width", "height"))
        metrics = train(section(params, "model"), config, paths, frame_size=(frame.width, frame.height),
                        runtime=runtime)
    if metrics:
        print(", ".join(f"{k}: {v}" for k, v in metrics.items()))


if __name__ == "__main__":
    run(main)
