"""Who gets "is there a <category> on the <side>?" wrong, the perception or the decoder: for each spatial question of
a split, the counts head's expected count of the category in the asked third (mirror-averaged when the model is; what
the decoder's counts tokens carry) says "yes" at 0.5 or more, and the decoder answers (twice, over the mirror image,
when the model does). Grouped by category and by what the labels say: "yes"; "no", the category absent; "no", the
category elsewhere in the image (a hard negative: only the side tells it from a "yes"). Writes per group the share of
questions the perception and the decoder get right, and the decoder's share where the perception is right.

    PYTHONPATH=. .venv/bin/python benchmarks/spatial_errors.py --out metrics/spatial_errors.json   # after make repro
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from benchmarks.count_errors import head_counts, region_counts
from vlm.checkpoint import load_model
from vlm.commands import rules
from vlm.commands.templates import TEMPLATES
from vlm.data.dataset import TrafficVQADataset
from vlm.evaluate import predictions_table
from vlm.io import read_json
from vlm.models.perception.targets import CENTRE_REGIONS
from vlm.scenes.generate import load_raw

# each side's place among the counts head's regions (region_counts' last axis)
SIDE_REGIONS = {side: CENTRE_REGIONS.index((lo, hi, 0.0)) for side, (lo, hi) in rules.SIDES.items()}


def spatial_questions(loaded, data: Path, split: str) -> tuple[list[dict], TrafficVQADataset]:
    """The split's spatial questions and a dataset of them alone (read from a copy of their records)."""
    records = [r for r in read_json(data / "commands" / f"{split}.json") if r["template"] == "spatial/on_side"]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{split}.json"
        path.write_text(json.dumps(records))
        dataset = TrafficVQADataset(path, data / f"{split}_images.h5", loaded.tokenizer, in_memory=True)
    return records, dataset


def question_rows(records: list[dict], table: pd.DataFrame, counts, scenes: dict) -> pd.DataFrame:
    rows = []
    for record, correct in zip(records, table["correct"], strict=True):
        params = TEMPLATES["spatial/on_side"].parse(record["command"])
        category, side = params["category"], params["side"]
        present = rules.count(scenes[record["image_id"]], category) > 0
        kind = "yes" if record["answer"] == rules.YES else "no, elsewhere" if present else "no, absent"
        says_yes = bool(counts[record["image_id"]][category][SIDE_REGIONS[side]] >= 0.5)
        rows.append({"category": category, "labels": kind, "perception_right": says_yes == (kind == "yes"),
                     "decoder_right": bool(correct)})
    return pd.DataFrame(rows)


def summary(rows: pd.DataFrame) -> list[dict]:
    out = []
    for (category, kind), group in rows.groupby(["category", "labels"]):
        seen = group[group.perception_right]
        out.append({"category": category, "labels": kind, "questions": len(group),
                    "perception_right": round(float(group.perception_right.mean()), 4),
                    "decoder_right": round(float(group.decoder_right.mean()), 4),
                    "decoder_right_where_perception_right": round(float(seen.decoder_right.mean()), 4)
                    if len(seen) else None})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/vlm.pt")
    parser.add_argument("--data", default="data/processed")
    parser.add_argument("--raw", default="data/raw")
    parser.add_argument("--splits", nargs="+", default=["train", "test"])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    data = Path(args.data)
    loaded = load_model(args.model, data / "vocab.json")
    model = loaded.model.eval()
    if model.extension is None or "counts" not in model.extension.heads:
        sys.exit(f"error: {args.model}: has no counts head (model.perception.heads.counts)")
    scenes = {scene.image_id: scene for scene in load_raw(args.raw).iter_scenes()}
    report = {"model": args.model}
    for split in args.splits:
        records, dataset = spatial_questions(loaded, data, split)
        categories = sorted({TEMPLATES["spatial/on_side"].parse(r["command"])["category"] for r in records})
        ids, sums, _ = head_counts(model, dataset)
        counts = region_counts(model, ids, sums, categories)
        table = predictions_table(loaded, dataset, args.batch_size, torch.device("cpu"))
        report[split] = summary(question_rows(records, table, counts, scenes))
        for row in report[split]:
            print(split, json.dumps(row))
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
