"""Where the perception's counts go wrong: for each image of a split and each counted category, the counts head's
whole-image count (its density summed over the image and rounded, as the decoder's tokens read it; mirror-averaged
when the model is) against the labels' count, grouped by what the labels say about the image's objects of that
category: the true count, whether one of them is occluded, and whether two of their box centres are close (within
``--close`` frame pixels). Writes exact shares and mean signed errors (rounded count minus true count) per group.
With ``--predictions`` (evaluate's answers, ``metrics/eval/predictions.csv``, of the same split) it also sets the
decoder's "how many" answers beside the counts head's rounded count, by how far the head's count is from a whole
number: where the perception is unsure, and what the decoder makes of it.

    PYTHONPATH=. .venv/bin/python benchmarks/count_errors.py --out metrics/count_errors.json   # after make repro
    PYTHONPATH=. .venv/bin/python benchmarks/count_errors.py --split test --predictions metrics/eval/predictions.csv \
        --out /tmp/count_errors_test.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from vlm.checkpoint import load_model
from vlm.data.collate import collate_questions
from vlm.data.dataset import TrafficVQADataset
from vlm.data.sampler import GroupedBatchSampler
from vlm.models.perception import image_head_logits
from vlm.models.perception.targets import CHANNELS
from vlm.scenes.generate import load_raw


def region_counts(model, dataset: TrafficVQADataset, categories: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """image id -> category -> the counts head's expected counts over its regions ``[R]``: the whole image, its left
    third, its right third (``CENTRE_REGIONS``)."""
    head = model.extension.heads["counts"]
    names = CHANNELS[head.centres] + CHANNELS[head.feet]  # the density channels, in order
    channels = {category: names.index(f"centre/{category}") for category in categories}
    counts: dict[str, dict[str, np.ndarray]] = {}
    for indices in GroupedBatchSampler(dataset.image_rows, 256, shuffle=False):
        batch = collate_questions(dataset.__getitems__(indices), dataset.pad_token_id)
        logits = image_head_logits(model, batch.images)["counts"]
        sums = head.region_sums(head.density(logits)).numpy()  # [N, C, R]
        for row, image_id in enumerate(dict.fromkeys(batch.image_id)):
            counts[image_id] = {category: sums[row, c] for category, c in channels.items()}
    return counts


def image_rows(scenes, counts: dict[str, dict[str, np.ndarray]], categories: list[str], close: float) -> pd.DataFrame:
    rows = []
    for scene in scenes:
        if scene.image_id not in counts:
            continue
        for category in categories:
            objects = [o for o in scene.objects if o.category == category]
            centres = np.array([[(o.box[0] + o.box[2]) / 2, (o.box[1] + o.box[3]) / 2] for o in objects]).reshape(-1, 2)
            distances = np.hypot(*(centres[:, None] - centres[None]).transpose(2, 0, 1)) + np.eye(len(objects)) * 1e9
            rows.append({"image_id": scene.image_id, "category": category, "true": len(objects),
                         "predicted": round(float(counts[scene.image_id][category][0])),  # the whole image's
                         "occluded": any(o.occluded for o in objects),
                         "close": bool(len(objects) > 1 and distances.min() < close)})
    table = pd.DataFrame(rows)
    table["error"] = table.predicted - table.true
    table["exact"] = table.error == 0
    return table


def how_many_rows(predictions: pd.DataFrame, counts: dict[str, dict[str, np.ndarray]], categories: list[str]
                  ) -> pd.DataFrame:
    """The "how many" questions of ``predictions`` (evaluate's table) about a counted category: the decoder's answer and
    the counts head's whole-image count beside the true answer, and the count's distance from a whole number."""
    asked = predictions[(predictions.template == "counting/how_many")
                        & predictions.counting_category.isin(categories)]
    missing = sorted(set(asked.image_id) - set(counts))
    if missing:
        sys.exit(f"error: --predictions: {len(missing)} image(s) not in the split counted, e.g. {missing[0]}: give the "
                 "predictions of the same split (--split)")
    head = np.array([float(counts[i][c][0]) for i, c in zip(asked.image_id, asked.counting_category)])
    return pd.DataFrame({"decoder_exact": asked.correct.to_numpy(),
                         "head_exact": np.round(head) == asked.answer.astype(int).to_numpy(),
                         "distance": np.abs(head - np.round(head))})


def exact_shares(asked: pd.DataFrame) -> dict:
    return {"questions": len(asked), "decoder_exact": round(float(asked.decoder_exact.mean()), 4),
            "head_exact": round(float(asked.head_exact.mean()), 4)}


def summary(table: pd.DataFrame, by: list[str]) -> list[dict]:
    groups = table.groupby(by).agg(exact=("exact", "mean"), mean_error=("error", "mean"), images=("exact", "size"))
    return [{**dict(zip(by, key if isinstance(key, tuple) else (key,))), **{k: round(float(v), 4) if k != "images"
             else int(v) for k, v in values.items()}} for key, values in groups.iterrows()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/vlm.pt")
    parser.add_argument("--data", default="data/processed")
    parser.add_argument("--raw", default="data/raw")
    parser.add_argument("--split", default="val")
    parser.add_argument("--categories", nargs="+", default=["car", "pedestrian"])
    parser.add_argument("--close", type=float, default=40.0, help="frame pixels between two centres that are close")
    parser.add_argument("--predictions", help="evaluate's predictions.csv of the same split: the decoder's answers")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.predictions and not Path(args.predictions).is_file():
        sys.exit(f"error: --predictions: {args.predictions} not found (evaluate writes metrics/eval/predictions.csv)")
    data = Path(args.data)
    loaded = load_model(args.model, data / "vocab.json")
    model = loaded.model
    if model.extension is None or "counts" not in model.extension.heads:
        sys.exit(f"error: {args.model}: has no counts head (model.perception.heads.counts)")
    targets = model.extension.targets(model.config.siglip.height_width, tuple(loaded.checkpoint["frame_size"]))
    dataset = TrafficVQADataset(data / "commands" / f"{args.split}.json", data / f"{args.split}_images.h5",
                                loaded.tokenizer, in_memory=True, targets=targets)
    counts = region_counts(model, dataset, args.categories)
    table = image_rows(load_raw(args.raw).iter_scenes(), counts, args.categories, args.close)
    several = table[table.true >= 2]  # where occlusion and closeness can happen
    report = {"model": args.model, "split": args.split, "close_px": args.close, "images": int(table.image_id.nunique()),
              "exact": summary(table, ["category"]), "by_true_count": summary(table, ["category", "true"]),
              "two_or_more_by_occluded": summary(several, ["category", "occluded"]),
              "two_or_more_by_close": summary(several, ["category", "close"])}
    if args.predictions:
        asked = how_many_rows(pd.read_csv(args.predictions, dtype={"image_id": str}), counts, args.categories)
        edges = [0, 0.1, 0.2, 0.3, 0.4, 0.5]
        labels = ["[0, 0.1]"] + [f"({low}, {high}]" for low, high in zip(edges[1:-1], edges[2:])]
        bands = pd.cut(asked.distance, edges, labels=labels, include_lowest=True)
        report["how_many"] = [exact_shares(asked)]
        report["how_many_by_head_distance"] = [{"head_distance": band, **exact_shares(group)}
                                               for band, group in asked.groupby(bands, observed=True)]
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    for key in ("exact", "two_or_more_by_occluded", "two_or_more_by_close", "how_many", "how_many_by_head_distance"):
        if key in report:
            print(key, json.dumps(report[key]))


if __name__ == "__main__":
    main()
