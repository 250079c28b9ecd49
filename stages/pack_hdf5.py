"""DVC stage ``pack_hdf5``: the JPEGs of each split -> ``data/processed/{split}_images.h5``.

Reads ``{raw}/labels.json``, ``{raw}/source.json`` (``image_dir``) and ``{commands_dir}/{split}.json``;
writes the HDF5 files and the metrics (paths from dvc.yaml's cmd).
"""

from __future__ import annotations

import argparse

from vlm.cli import run
from vlm.config import build_config
from vlm.data.pack import PackConfig, PackRuntime, pack_dataset
from vlm.io import check_writable, write_json
from vlm.models.image_size import check_image_size, check_side_multiple, image_side_multiple
from vlm.params import load_params, runtime_section, section


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--raw", required=True, help="folder with labels.json and source.json")
    parser.add_argument("--commands-dir", required=True, help="folder with {split}.json")
    parser.add_argument("--out", required=True, help="folder of the {split}_images.h5 files")
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args(argv)
    params = load_params(args.params)
    config = build_config(PackConfig, section(params, "pack"), "pack")
    runtime = build_config(PackRuntime, runtime_section(params, "pack"), "runtime.pack")
    model = section(params, "model")
    check_image_size(model, config.image_size, "pack.image_size")  # before packing anything
    check_side_multiple(model, config.image_size, "pack.image_size")  # and the model keys the size rules read
    check_writable(args.out + "/train_images.h5", args.metrics)
    metrics = pack_dataset(
        labels_path=f"{args.raw}/labels.json",
        source_path=f"{args.raw}/source.json",
        commands_dir=args.commands_dir,
        output_dir=args.out,
        config=config,
        runtime=runtime,
        side_multiple=image_side_multiple(model),
    )
    write_json(args.metrics, metrics)
    print(f"packed {metrics['images']} images ({metrics['skipped']} skipped) at "
          f"{metrics['images_per_s']} images/s")


if __name__ == "__main__":
    run(main)
