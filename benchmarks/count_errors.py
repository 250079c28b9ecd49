"""Where the perception's counts go wrong: for each image of a split and each counted category, the counts head's
whole-image count (its density summed over the image and rounded, as the decoder's tokens read it; mirror-averaged
when the model is) against the labels' count, grouped by what the labels say about the image's objects of that
category: the true count, whether one of them is occluded, and whether two of their box centres are close (within
``--close`` frame pixels). Writes exact shares and mean signed errors (rounded count minus true count) per group.
With ``--predictions`` (evaluate's answers, ``metrics/eval/predictions.csv``, of the same split) it also sets the
decoder's "how many" answers beside the counts head's rounded count, by how far the head's count is from a whole
number: where the perception is unsure, and what the decoder makes of it. With ``--calibrated`` too, a classifier
fitted on the train split's density statistics answers the same questions: does the decoder read less of the density
than a readout trained on its counts alone could? With ``--sheet`` it draws the images counted furthest from their
labels as the model reads them (its pixels, enlarged), with the category's label boxes, occluded ones in red.

    PYTHONPATH=. .venv/bin/python benchmarks/count_errors.py --out metrics/count_errors.json \
        --sheet metrics/plots/count_errors.png   # after make repro
    PYTHONPATH=. .venv/bin/python benchmarks/count_errors.py --split test --predictions metrics/eval/predictions.csv \
        --calibrated --out /tmp/count_errors_test.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image, ImageDraw
from sklearn.ensemble import HistGradientBoostingClassifier

from vlm.checkpoint import load_model
from vlm.data.collate import collate_questions
from vlm.data.dataset import TrafficVQADataset
from vlm.data.sampler import GroupedBatchSampler
from vlm.models.perception import image_head_logits
from vlm.models.perception.targets import CHANNELS
from vlm.plots import GREEN, GREY, RED, Line, contact_sheet, save_image
from vlm.scenes.generate import load_raw


def head_counts(model, dataset: TrafficVQADataset) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The counts head on every image of ``dataset``: image ids, their region sums ``[N, C, R]`` (the expected counts of
    each density channel over ``CENTRE_REGIONS``/``FOOT_REGIONS``: the whole image, its left third, its right third
    for the centres) and density statistics ``[N, F]``: the region sums, and per channel the sum of squared cell
    counts, the largest cell, the cells above 0.1 and the largest WINDOW x WINDOW window sum."""
    head = model.extension.heads["counts"]
    ids, sums, statistics = [], [], []
    for indices in GroupedBatchSampler(dataset.image_rows, 256, shuffle=False):
        batch = collate_questions(dataset.__getitems__(indices), dataset.pad_token_id)
        density = head.density(image_head_logits(model, batch.images)["counts"])  # [N, h*w, C]
        regions = head.region_sums(density)  # [N, C, R]
        ids += list(dict.fromkeys(batch.image_id))
        sums.append(regions.numpy())
        statistics.append(torch.cat([regions.flatten(1), density.pow(2).sum(1), density.amax(1),
                                     (density > 0.1).float().sum(1), head.window_sums(density).flatten(2).amax(2)],
                                    dim=1).numpy())
    return ids, np.concatenate(sums), np.concatenate(statistics)


def region_counts(model, ids: list[str], sums: np.ndarray, categories: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """image id -> category -> its expected counts over the regions ``[R]`` (from :func:`head_counts`)."""
    head = model.extension.heads["counts"]
    names = CHANNELS[head.centres] + CHANNELS[head.feet]  # the density channels, in order
    channels = {category: names.index(f"centre/{category}") for category in categories}
    return {image_id: {category: sums[row, c] for category, c in channels.items()} for row, image_id in enumerate(ids)}


def calibrated_counts(train: tuple[list[str], np.ndarray], true: dict[str, dict[str, int]],
                      split: tuple[list[str], np.ndarray], categories: list[str]) -> dict[str, dict[str, int]]:
    """A gradient-boosted classifier per category, fitted on the train split's density statistics against the labels'
    whole-image counts, then counting each image of the split: image id -> category -> count."""
    (train_ids, train_statistics), (ids, statistics) = train, split
    counts: dict[str, dict[str, int]] = {image_id: {} for image_id in ids}
    for category in categories:
        classifier = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, random_state=0)
        classifier.fit(train_statistics, [true[image_id][category] for image_id in train_ids])
        for image_id, count in zip(ids, classifier.predict(statistics)):
            counts[image_id][category] = int(count)
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


def boxes_sheet(images: list[tuple[Image.Image, list[tuple[tuple[float, float, float, float], bool]], list[Line]]],
                frame_size: tuple[float, float], scale: int = 2) -> Image.Image:
    """Images ``(pixels, [(label box in frame coordinates, occluded), ...], caption)``, each enlarged ``scale`` times
    without smoothing (the pixels a model reads) under its boxes: occluded ones red, the others green."""
    tiles = []
    for image, boxes, lines in images:
        enlarged = image.convert("RGB").resize((image.width * scale, image.height * scale), Image.NEAREST)
        draw = ImageDraw.Draw(enlarged)
        x_scale, y_scale = enlarged.width / frame_size[0], enlarged.height / frame_size[1]
        for (x1, y1, x2, y2), occluded in boxes:
            draw.rectangle((x1 * x_scale, y1 * y_scale, x2 * x_scale, y2 * y_scale),
                           outline=(255, 40, 40) if occluded else (40, 230, 60))
        tiles.append((enlarged, lines))
    return contact_sheet(tiles, columns=3, tile_width=tiles[0][0].width, max_lines=2)


def count_sheet(dataset: TrafficVQADataset, scenes, table: pd.DataFrame, counts: dict[str, dict[str, np.ndarray]],
                frame_size: tuple[float, float], examples: int) -> Image.Image:
    """The ``examples`` (image, category) rows of :func:`image_rows` counted furthest from the labels (the most
    objects first among equal misses), each image as the model reads it with that category's label boxes."""
    shown = table.assign(miss=table.error.abs()).sort_values(["miss", "true", "image_id", "category"],
                                                             ascending=[False, False, True, True]).head(examples)
    first_question = {}
    for index, record in enumerate(dataset.records):
        first_question.setdefault(record["image_id"], index)
    objects = {scene.image_id: scene.objects for scene in scenes}
    tiles = []
    for row in shown.itertuples():
        pixels = dataset[first_question[row.image_id]]["image"].permute(1, 2, 0).numpy()  # uint8 [S, W, 3]
        boxes = [(o.box, o.occluded) for o in objects[row.image_id] if o.category == row.category]
        expected = float(counts[row.image_id][row.category][0])
        tiles.append((Image.fromarray(pixels), boxes,
                      [(f"{row.image_id}: {row.true} {row.category}, head {expected:.2f} -> {row.predicted}",
                        GREEN if row.exact else RED),
                       (f"{sum(occluded for _, occluded in boxes)} occluded (red)", GREY)]))
    return boxes_sheet(tiles, frame_size)


def true_counts(scenes, categories: list[str]) -> dict[str, dict[str, int]]:
    """image id -> category -> the labels' count."""
    return {scene.image_id: {category: sum(o.category == category for o in scene.objects) for category in categories}
            for scene in scenes}


def how_many_rows(predictions: pd.DataFrame, counts: dict[str, dict[str, np.ndarray]], categories: list[str],
                  calibrated: dict[str, dict[str, int]] | None = None) -> pd.DataFrame:
    """The "how many" questions of ``predictions`` (evaluate's table) about a counted category: the decoder's answer and
    the counts head's whole-image count beside the true answer, and the count's distance from a whole number; with
    ``calibrated`` (:func:`calibrated_counts`) whether its count is the answer too."""
    asked = predictions[(predictions.template == "counting/how_many")
                        & predictions.counting_category.isin(categories)]
    missing = sorted(set(asked.image_id) - set(counts))
    if missing:
        sys.exit(f"error: --predictions: {len(missing)} image(s) not in the split counted, e.g. {missing[0]}: give the "
                 "predictions of the same split (--split)")
    head = np.array([float(counts[i][c][0]) for i, c in zip(asked.image_id, asked.counting_category)])
    answers = asked.answer.astype(int).to_numpy()
    rows = pd.DataFrame({"category": asked.counting_category.to_numpy(), "decoder_exact": asked.correct.to_numpy(),
                         "head_exact": np.round(head) == answers,
                         "distance": np.abs(head - np.round(head))})
    if calibrated is not None:
        rows["calibrated_exact"] = np.array([calibrated[i][c] for i, c in zip(asked.image_id,
                                                                               asked.counting_category)]) == answers
    return rows


def exact_shares(asked: pd.DataFrame) -> dict:
    return {"questions": len(asked), **{column: round(float(asked[column].mean()), 4) for column in
                                        ("decoder_exact", "head_exact", "calibrated_exact") if column in asked}}


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
    parser.add_argument("--calibrated", action="store_true",
                        help="with --predictions: a classifier fitted on the train split's density statistics (as a "
                             "readout trained with the model would be) answers the same questions")
    parser.add_argument("--sheet", help="PNG: the images counted furthest from their labels, with their label boxes")
    parser.add_argument("--sheet-examples", type=int, default=12, help="images on --sheet")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.sheet_examples < 1:
        sys.exit(f"error: --sheet-examples: must be at least 1, got {args.sheet_examples}")
    if args.calibrated and not args.predictions:
        sys.exit("error: --calibrated: needs --predictions (the questions it answers)")
    if args.calibrated and args.split == "train":
        sys.exit("error: --calibrated: the classifier is fitted on the train split; answer another (--split)")
    if args.predictions and not Path(args.predictions).is_file():
        sys.exit(f"error: --predictions: {args.predictions} not found (evaluate writes metrics/eval/predictions.csv)")
    data = Path(args.data)
    loaded = load_model(args.model, data / "vocab.json")
    model = loaded.model
    if model.extension is None or "counts" not in model.extension.heads:
        sys.exit(f"error: {args.model}: has no counts head (model.perception.heads.counts)")
    frame_size = tuple(loaded.checkpoint["frame_size"])  # (width, height) of the label boxes' frames
    targets = model.extension.targets(model.config.siglip.height_width, frame_size)

    def split_dataset(split: str) -> TrafficVQADataset:
        return TrafficVQADataset(data / "commands" / f"{split}.json", data / f"{split}_images.h5", loaded.tokenizer,
                                 in_memory=True, targets=targets)

    dataset = split_dataset(args.split)
    ids, sums, statistics = head_counts(model, dataset)
    counts = region_counts(model, ids, sums, args.categories)
    scenes = list(load_raw(args.raw).iter_scenes())
    table = image_rows(scenes, counts, args.categories, args.close)
    several = table[table.true >= 2]  # where occlusion and closeness can happen
    report = {"model": args.model, "split": args.split, "close_px": args.close, "images": int(table.image_id.nunique()),
              "exact": summary(table, ["category"]), "by_true_count": summary(table, ["category", "true"]),
              "two_or_more_by_occluded": summary(several, ["category", "occluded"]),
              "two_or_more_by_close": summary(several, ["category", "close"])}
    if args.predictions:
        calibrated = None
        if args.calibrated:
            train_ids, _, train_statistics = head_counts(model, split_dataset("train"))
            calibrated = calibrated_counts((train_ids, train_statistics), true_counts(scenes, args.categories),
                                           (ids, statistics), args.categories)
            report["calibrated_on"] = {"split": "train", "images": len(train_ids)}
        asked = how_many_rows(pd.read_csv(args.predictions, dtype={"image_id": str}), counts, args.categories,
                              calibrated)
        edges = [0, 0.1, 0.2, 0.3, 0.4, 0.5]
        labels = ["[0, 0.1]"] + [f"({low}, {high}]" for low, high in zip(edges[1:-1], edges[2:])]
        bands = pd.cut(asked.distance, edges, labels=labels, include_lowest=True)
        report["how_many"] = [exact_shares(asked)]
        report["how_many_by_head_distance"] = [{"head_distance": band, **exact_shares(group)}
                                               for band, group in asked.groupby(bands, observed=True)]
        report["how_many_by_category"] = [{"category": category, **exact_shares(group)}
                                          for category, group in asked.groupby("category")]
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    if args.sheet:
        save_image(count_sheet(dataset, scenes, table, counts, frame_size, args.sheet_examples), Path(args.sheet))
    for key in ("exact", "two_or_more_by_occluded", "two_or_more_by_close", "how_many", "how_many_by_category",
                "how_many_by_head_distance"):
        if key in report:
            print(key, json.dumps(report[key]))


if __name__ == "__main__":
    main()
