"""DVC stage ``pack_hdf5``: the JPEGs of each split -> ``data/processed/{split}_images.h5``.

Reads ``data/raw/labels.json``, ``data/raw/source.json`` (``image_dir``) and
``data/processed/commands/{split}.json``; writes the HDF5 files and ``metrics/pack.json``.
"""

from __future__ import annotations

import argparse

from vlm.cli import run
from vlm.data.pack import PackConfig, pack_dataset
from vlm.io import write_json
from vlm.params import build_config, load_params, section


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)
    config = build_config(PackConfig, section(load_params(args.params), "pack"), "pack")
    metrics = pack_dataset(
        labels_path="data/raw/labels.json",
        source_path="data/raw/source.json",
        commands_dir="data/processed/commands",
        output_dir="data/processed",
        config=config,
    )
    write_json("metrics/pack.json", metrics)
    print(f"packed {metrics['images']} images ({metrics['skipped']} skipped) at "
          f"{metrics['images_per_s']} images/s")


if __name__ == "__main__":
    run(main)
