"""Who gets "Is there a <category>?" wrong on real frames, the perception or the decoder: for every presence question
the labels of a folder of real frames (BDD100K's layout) answer, each perception head says "yes" at 0.5 or more (the
counts head: its expected count of the category in the whole image; the grounding head: its highest box probability
of the category over the patches), and the decoder answers (as ``vlm.predict``: the answer set, the mirror image).
Writes per head, category and label the share of questions each gets right, and the decoder's share where the head is
right: where that is low, the decoder does not read what the perception sees.

    PYTHONPATH=. .venv/bin/python benchmarks/real_perception.py --root /path/to/bdd100k_val \
        --out metrics/real_perception.json   # after make repro
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.spatial_errors import summary
from vlm.checkpoint import file_sha256, load_model
from vlm.commands.generate import CommandsConfig
from vlm.commands.templates import TEMPLATES, fitting_answers
from vlm.config import build_config
from vlm.inference import answer_questions, constrain
from vlm.models.perception import image_head_logits
from vlm.models.perception.targets import CHANNELS
from vlm.params import load_params, section
from vlm.real import RealConfig, read_frames, real_questions

TEMPLATE = "detection/present"


def presence(loaded, images: dict[str, torch.Tensor], batch_size: int) -> dict[str, dict[str, dict[str, float]]]:
    """head -> image id -> category -> the head's evidence of the category: the counts head's expected count over the
    whole image, the grounding head's highest box probability over the patches."""
    heads = loaded.model.extension.heads
    counts, grounding = heads["counts"], heads["grounding"]
    density_names = CHANNELS[counts.centres] + CHANNELS[counts.feet]  # the density channels, in order
    box_names = CHANNELS[grounding.patch_channels]
    ids = list(images)
    found: dict[str, dict[str, dict[str, float]]] = {"counts": {}, "grounding": {}}
    for start in range(0, len(ids), batch_size):
        chunk = ids[start:start + batch_size]
        with torch.no_grad():
            logits = image_head_logits(loaded.model, torch.stack([images[i] for i in chunk]))
            sums = counts.region_sums(counts.density(logits["counts"]))[:, :, 0].numpy()  # [N, C]: the whole image
            boxes = logits["grounding"].float().sigmoid().amax(1).numpy()  # [N, C]: the most probable patch
        for row, image_id in enumerate(chunk):
            found["counts"][image_id] = {name.removeprefix("centre/"): float(sums[row, c])
                                         for c, name in enumerate(density_names) if name.startswith("centre/")}
            found["grounding"][image_id] = {name.removeprefix("box/"): float(boxes[row, c])
                                            for c, name in enumerate(box_names) if name.startswith("box/")}
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="a folder of labelled frames in BDD100K's layout")
    parser.add_argument("--model", type=Path, default=Path("models/vlm.pt"))
    parser.add_argument("--vocab", type=Path, default=Path("data/processed/vocab.json"))
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    loaded = load_model(args.model, args.vocab)
    if loaded.model.extension is None or not {"counts", "grounding"} <= set(loaded.model.extension.heads):
        sys.exit(f"error: {args.model}: needs the counts and grounding heads (model.perception.heads)")
    params = load_params(args.params)
    config = build_config(RealConfig, {**section(params, "real"), "root": args.root}, "real")
    asked = build_config(CommandsConfig, section(params, "commands"), "commands", keys=["types"]).asked
    scenes, image_dir, _ = read_frames(config)
    images = {scene.image_id: loaded.processor.image(image_dir / scene.name) for scene in scenes}
    sizes = {}
    for scene in scenes:
        with Image.open(image_dir / scene.name) as image:
            sizes[scene.name] = image.size
    table = real_questions(scenes, sizes, asked, config.seed)
    table = table[table["template"] == TEMPLATE].reset_index(drop=True)
    probs = answer_questions(loaded.model, loaded.processor, images, list(zip(table["image_id"], table["command"])),
                             loaded.candidates(), args.batch_size, torch.device("cpu"))  # [Q, C]
    probs = constrain(probs, fitting_answers(list(table["template"]), loaded.answers))
    table["decoder"] = np.asarray(loaded.answers, dtype=object)[probs.argmax(1)]
    evidence = presence(loaded, images, args.batch_size)
    table["category"] = [TEMPLATES[TEMPLATE].parse(command)["category"] for command in table["command"]]
    table["decoder_right"] = table["decoder"] == table["answer"]
    table["labels"] = table["answer"]
    report = {"command": "PYTHONPATH=. .venv/bin/python benchmarks/real_perception.py --root /path/to/bdd100k_val "
                         f"--out {args.out}", "model_sha256": file_sha256(args.model), "frames": len(scenes),
              "questions": len(table)}
    for head, found in evidence.items():
        says_yes = np.array([found[i][c] >= 0.5 for i, c in zip(table["image_id"], table["category"])])
        table["perception_right"] = says_yes == (table["answer"] == "yes")
        report[head] = summary(table)
        for row in report[head]:
            print(head, json.dumps(row))
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
