"""The ``evaluate`` stage: the VLM and its blind baseline on the test split, side by side (the headline metrics, the
slices, the details, tables and pictures: docs/architecture.md, evaluate)."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from sklearn.metrics import confusion_matrix, f1_score

from vlm import plots
from vlm.checkpoint import LoadedModel, load_model
from vlm.commands.templates import fitting_answers
from vlm.config import check
from vlm.data.dataset import TrafficVQADataset
from vlm.device import pick_device
from vlm.inference import constrain, predict_dataset
from vlm.io import atomic_path, write_json
from vlm.scenes.generate import load_raw
from vlm.scenes.schema import Scene
from vlm.slices import conditions_table, slice_accuracy

YES_NO_MAYBE = ["yes", "no", "maybe"]
CALIBRATION_BINS = 10  # equal-width confidence bins of the expected calibration error
OTHER = "other"  # a prediction outside yes/no/maybe (a colour, a count) for a yes/no/maybe question


@dataclass
class EvaluateConfig:
    split: str = "test"
    batch_size: int = 256
    attention_examples: int = 8  # test questions drawn with their attention maps
    failure_examples: int = 16  # failures on the contact sheet
    seed: int = 0

    def validate(self, prefix: str = "evaluate") -> None:
        check(self.split in ("train", "val", "test"), f"{prefix}.split",
              f"must be train, val or test, got {self.split!r}")
        check(self.batch_size >= 1, f"{prefix}.batch_size", f"must be >= 1, got {self.batch_size}")
        check(self.attention_examples >= 0, f"{prefix}.attention_examples", "must be >= 0")
        check(self.failure_examples >= 0, f"{prefix}.failure_examples", "must be >= 0")


@dataclass
class EvaluatePaths:
    model: Path = Path("models/vlm.pt")
    blind: Path = Path("models/blind.pt")
    data: Path = Path("data/processed")  # commands/, vocab.json, {split}_images.h5
    raw: Path = Path("data/raw")  # source.json: where the original images are, for pictures
    metrics: Path = Path("metrics/eval.json")  # headline metrics
    tables: Path = Path("metrics/eval")  # details.json, slices.json, predictions.csv, per_type.csv, slices.csv, ...
    plots: Path = Path("metrics/plots")  # eval.png, attention.png, failures.png

    @property
    def details(self) -> Path:
        return self.tables / "details.json"

    @property
    def slices(self) -> Path:
        return self.tables / "slices.json"


def predictions_table(loaded: LoadedModel, dataset: TrafficVQADataset, batch_size: int,
                      device: torch.device) -> pd.DataFrame:
    """One row per question: the record's fields, the prediction among the answers its template can give and its
    probability."""
    _, probs = predict_dataset(loaded.model, dataset, loaded.candidates(), batch_size, device)
    probs = constrain(probs, fitting_answers([record["template"] for record in dataset.records], loaded.answers))
    predicted = probs.argmax(1)
    table = pd.DataFrame([{"question_id": record["question_id"], "image_id": record["image_id"],
                           "command_type": record["command_type"], "template": record.get("template", ""),
                           "command": record["command"], "answer": record["answer"],
                           "prediction": loaded.answers[p], "probability": round(float(prob[p]), 4)}
                          for record, p, prob in zip(dataset.records, predicted, probs)])
    table["correct"] = table["prediction"] == table["answer"]
    return table


def yes_no_maybe_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """(actual, predicted) of the yes/no/maybe questions; any other prediction is called ``other``."""
    yn = table[table["answer"].isin(YES_NO_MAYBE)]
    predicted = yn["prediction"].where(yn["prediction"].isin(YES_NO_MAYBE), OTHER)
    return pd.DataFrame({"actual": yn["answer"].to_numpy(), "predicted": predicted.to_numpy()})


def summarize(table: pd.DataFrame) -> dict[str, Any]:
    """Accuracy overall / per type / per answer, macro-F1, the calibration, and the yes/no/maybe confusion matrix: a
    row per actual answer, a column per prediction (yes, no, maybe, other), each row summing to its questions."""
    pairs = yes_no_maybe_pairs(table)
    predicted = [*YES_NO_MAYBE, OTHER]
    matrix = (confusion_matrix(pairs["actual"], pairs["predicted"], labels=predicted)[: len(YES_NO_MAYBE)]
              if len(pairs) else np.zeros((len(YES_NO_MAYBE), len(predicted))))
    return {
        "accuracy": round(float(table["correct"].mean()), 4),
        "per_type": {t: round(float(g["correct"].mean()), 4) for t, g in table.groupby("command_type")},
        "macro_f1": round(float(f1_score(table["answer"], table["prediction"], labels=sorted(set(table["answer"])),
                                         average="macro", zero_division=0)), 4),
        "per_answer": {a: round(float(g["correct"].mean()), 4) for a, g in table.groupby("answer")},
        "confusion_yes_no_maybe": {"actual": YES_NO_MAYBE, "predicted": predicted,
                                   "matrix": matrix.astype(int).tolist()},
        **calibration(table["probability"].to_numpy(), table["correct"].to_numpy()),
    }


def calibration(confidence: np.ndarray, correct: np.ndarray, bins: int = CALIBRATION_BINS) -> dict[str, Any]:
    """Expected calibration error of the answers' probabilities ``confidence`` in equal-width bins over [0, 1] (the
    questions-weighted mean of |accuracy - mean probability|: 0 when p is right p of the time), and the bins."""
    index = np.clip((confidence * bins).astype(int), 0, bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        inside = index == b
        n = int(inside.sum())
        if n:
            accuracy, mean_confidence = float(correct[inside].mean()), float(confidence[inside].mean())
            ece += n / len(confidence) * abs(accuracy - mean_confidence)
            rows.append({"low": b / bins, "high": (b + 1) / bins, "questions": n,
                         "confidence": round(mean_confidence, 4), "accuracy": round(accuracy, 4)})
    return {"ece": round(ece, 4), "reliability": rows}


HEADLINE = ("accuracy", "per_type", "macro_f1", "ece")  # per model, in this order: dvc exp show's first columns


def split_metrics(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The headline (declared as DVC metrics: a column each in ``dvc exp show``), the slices and the rest."""
    models = ("vlm", "blind")
    headline = {m: {k: metrics[m][k] for k in HEADLINE} for m in models}
    headline["gain_from_vision"] = {"accuracy": metrics["gain_from_vision"]["accuracy"]}
    details = {"split": metrics["split"], "questions": metrics["questions"],
               "questions_per_type": metrics["questions_per_type"], "questions_per_slice": metrics["slice_questions"],
               **{m: {k: v for k, v in metrics[m].items() if k not in HEADLINE} for m in models},
               "gain_from_vision": {"per_type": metrics["gain_from_vision"]["per_type"]}}
    return headline, metrics["slices"], details


def evaluate(config: EvaluateConfig, paths: EvaluatePaths) -> dict[str, Any]:
    """Write the headline metrics, the details, tables and pictures; return every metric (one dict)."""
    device = pick_device()
    vocab_path = paths.data / "vocab.json"
    vlm = load_model(paths.model, vocab_path, device)
    blind = load_model(paths.blind, vocab_path, device)
    commands = paths.data / "commands" / f"{config.split}.json"
    dataset = TrafficVQADataset(commands, paths.data / f"{config.split}_images.h5", vlm.tokenizer, in_memory=True,
                                targets=vlm.label_targets())
    raw = load_raw(paths.raw)
    scenes = {scene.image_id: scene for scene in raw.scenes}
    image_paths = {scene.image_id: raw.image_dir / scene.name for scene in raw.scenes}

    ours = predictions_table(vlm, dataset, config.batch_size, device)
    text_only = predictions_table(blind, dataset, config.batch_size, device)
    table = ours.assign(blind_prediction=text_only["prediction"], blind_probability=text_only["probability"],
                        blind_correct=text_only["correct"])
    metrics = {"split": config.split, "questions": len(table), "vlm": summarize(ours), "blind": summarize(text_only)}
    metrics["gain_from_vision"] = {
        "accuracy": round(metrics["vlm"]["accuracy"] - metrics["blind"]["accuracy"], 4),
        "per_type": {t: round(metrics["vlm"]["per_type"][t] - metrics["blind"]["per_type"].get(t, 0.0), 4)
                     for t in metrics["vlm"]["per_type"]},
    }
    metrics["questions_per_type"] = {t: int(n) for t, n in table["command_type"].value_counts().sort_index().items()}
    table = pd.concat([table, conditions_table(dataset.records, scenes, raw.width, raw.height)], axis=1)
    slices, counts = slice_accuracy(table, {"vlm": "correct", "blind": "blind_correct"})
    metrics["slices"] = {model: _keyed(per_model) for model, per_model in slices.items()}
    metrics["slice_questions"] = _keyed(counts)

    write_tables(table, metrics, paths.tables)
    headline, per_slice, details = split_metrics(metrics)
    write_json(paths.details, details)
    write_json(paths.slices, per_slice)
    write_json(paths.metrics, headline)
    plots.save_figure(plots.summary_figure(metrics), paths.plots / "eval.png")
    plots.save_figure(plots.slices_figure(slices, counts), paths.plots / "slices.png")
    plots.save_figure(plots.reliability_figure(metrics, CALIBRATION_BINS), paths.plots / "calibration.png")
    # both sheets are declared outputs: a note stands in where there is nothing to draw
    if vlm.model.config.vision == "none":
        plots.save_figure(plots.note_figure("no attention maps: the model reads no image"),
                          paths.plots / "attention.png")
    elif not config.attention_examples:
        plots.save_figure(plots.note_figure("no attention maps asked (evaluate.attention_examples: 0)"),
                          paths.plots / "attention.png")
    else:
        shown = table.loc[pick_examples(table, config.attention_examples, config.seed)]
        heat = attention_grids(vlm, shown, image_paths, scenes, device)
        plots.save_image(plots.attention_sheet(shown, image_paths, heat), paths.plots / "attention.png")
    failures = table[~table["correct"]]
    if config.failure_examples and len(failures):
        picks = pick_examples(failures, config.failure_examples, config.seed)
        plots.save_image(plots.failure_sheet(table.loc[picks], image_paths), paths.plots / "failures.png")
    else:
        note = "no failure: every answer is right" if config.failure_examples else \
            "no failures asked (evaluate.failure_examples: 0)"
        plots.save_figure(plots.note_figure(note), paths.plots / "failures.png")
    return metrics


def write_tables(table: pd.DataFrame, metrics: dict, folder: Path) -> None:
    """CSV tables for ``dvc plots``: every prediction, per-type and per-slice accuracy (a row per type or
    ``dimension=value`` and model: bars side by side), the VLM's yes/no/maybe (actual, predicted) pairs."""
    per_type = [{"command_type": t, "model": model, "accuracy": metrics[model]["per_type"].get(t, 0.0)}
                for t in metrics["vlm"]["per_type"] for model in ("vlm", "blind")]
    slices = metrics["slices"]
    per_slice = [{"slice": f"{dimension}={value}", "model": model, "accuracy": slices[model][dimension][value]}
                 for dimension, values in slices["vlm"].items() for value in values for model in ("vlm", "blind")]
    frames = (("predictions.csv", table), ("per_type.csv", pd.DataFrame(per_type)),
              ("slices.csv", pd.DataFrame(per_slice)), ("confusion.csv", yes_no_maybe_pairs(table)))
    for name, frame in frames:
        with atomic_path(folder / name) as tmp:
            frame.to_csv(tmp, index=False)


def _keyed(per_dimension: dict[str, dict]) -> dict[str, dict]:
    """Slice values as metric names: ``city street`` -> ``city_street``, ``dawn/dusk`` -> ``dawn_dusk``."""
    return {dimension: {value.replace(" ", "_").replace("/", "_"): x for value, x in values.items()}
            for dimension, values in per_dimension.items()}


def pick_examples(table: pd.DataFrame, n: int, seed: int) -> list[int]:
    """Up to ``n`` row labels, taken in turn from each command type (seeded)."""
    rng = np.random.default_rng(seed)
    turns = [(turn, t, int(label)) for t, (_, group) in enumerate(table.groupby("command_type"))
             for turn, label in enumerate(rng.permutation(group.index.to_numpy()))]  # each type's rows, shuffled
    return [label for _, _, label in sorted(turns)[:n]]


@torch.no_grad()
def attention_grids(loaded: LoadedModel, rows: pd.DataFrame, image_paths: dict[str, Path], scenes: dict[str, Scene],
                    device: torch.device) -> np.ndarray | None:
    """The mean attention from [SEP] to the image tokens as the token grid ``[B, Gh, Gw]``; None with the Q-Former."""
    config = loaded.model.config
    if config.connector != "linear":
        return None
    processor = loaded.processor
    images = [processor.image(image_paths[image_id]) for image_id in rows["image_id"]]  # [3, H, W] each
    targets = loaded.label_maps(scenes[image_id] for image_id in rows["image_id"])  # for an oracle probe
    batch = processor(images, list(rows["command"]), targets=targets).to(device)
    attention = loaded.model.image_attention(batch)  # [B, layers, heads, T]
    weights = attention.float().mean(dim=(1, 2)).cpu().numpy()  # [B, T]
    grid_rows, grid_columns = (side // config.pixel_shuffle for side in config.siglip.grid)
    return weights[:, : grid_rows * grid_columns].reshape(-1, grid_rows, grid_columns)  # the cells, row-major
