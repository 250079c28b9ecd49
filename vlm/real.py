"""The ``evaluate_real`` stage: the VLM and its blind baseline zero-shot on real labelled frames in BDD100K's layout
(docs/architecture.md, evaluate_real). Every question the frames' labels can answer is asked, in the templates'
phrasings with the rules' answers, and scored per type beside answering each type's most common answer."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from PIL import Image

from vlm import plots
from vlm.checkpoint import LoadedModel, load_model
from vlm.commands.templates import TEMPLATES, fitting_answers
from vlm.commands.types import candidates
from vlm.config import check
from vlm.device import pick_device
from vlm.evaluate import CALIBRATION_BINS, calibration, pick_examples
from vlm.inference import answer_questions, constrain
from vlm.io import atomic_path, write_json
from vlm.scenes.bdd100k import match_images, read_labels
from vlm.scenes.schema import Scene

MODELS = ("vlm", "blind", "most_common")


@dataclass
class RealConfig:
    root: str | None = None  # a folder in BDD100K's layout; None: nothing is measured (the stage writes a note)
    images: str = "images/100k/val"  # relative to root
    labels: str = "labels/det_20/det_val.json"  # relative to root
    batch_size: int = 256
    failure_examples: int = 16  # wrong answers of the VLM on the failure sheet
    seed: int = 0  # picks each question's phrasing and the failures shown

    def validate(self, prefix: str = "real") -> None:
        check(self.root is None or bool(str(self.root).strip()), f"{prefix}.root", "must be a folder or null")
        check(self.batch_size >= 1, f"{prefix}.batch_size", f"must be >= 1, got {self.batch_size}")
        check(self.failure_examples >= 0, f"{prefix}.failure_examples", "must be >= 0")


@dataclass
class RealPaths:
    model: Path = Path("models/vlm.pt")
    blind: Path = Path("models/blind.pt")
    vocab: Path = Path("data/processed/vocab.json")
    metrics: Path = Path("metrics/real.json")  # the headline: each model's accuracy (or the note: nothing measured)
    tables: Path = Path("metrics/real")  # details.json, predictions.csv
    plots: Path = Path("metrics/plots")  # real.png, real_failures.png


def real_questions(scenes: list[Scene], sizes: dict[str, tuple[int, int]], asked: dict[str, Any],
                   seed: int) -> pd.DataFrame:
    """One row per question the labels can answer (a set that colours no light or leaves occlusion unsaid answers no
    traffic-light or safety question): every candidate of the ``asked`` types, in a seeded phrasing."""
    rng = np.random.default_rng(seed)
    rows = []
    for scene in scenes:
        width, height = sizes[scene.name]
        for c in candidates(scene, width, height, asked):
            rows.append({"image_id": scene.image_id, "name": scene.name, "command_type": c.command_type,
                         "template": c.template, "key": c.key,
                         "command": c.text(int(rng.integers(len(TEMPLATES[c.template].phrasings)))),
                         "answer": c.answer, "timeofday": scene.timeofday, "weather": scene.weather,
                         "scene": scene.scene})
    return pd.DataFrame(rows)


def read_frames(config: RealConfig) -> tuple[list[Scene], Path, dict[str, int]]:
    """The labelled frames under ``config.root`` whose image is there (the others are named in an error), the images
    folder, and the frames left out as unanswerable, by reason."""
    root = Path(config.root)
    if not root.is_dir():
        raise FileNotFoundError(f"real.root: {root} is not a folder (a BDD100K folder: {config.images}/, "
                                f"{config.labels})")
    labels = root / config.labels
    scenes, skipped = read_labels(labels)
    scenes, _ = match_images(scenes, root / config.images)
    return scenes, root / config.images, skipped


def _answers(loaded: LoadedModel, images: dict[str, torch.Tensor], table: pd.DataFrame, scenes: dict[str, Scene],
             batch_size: int, device: torch.device) -> tuple[list[str], np.ndarray]:
    """The model's answer to each row of ``table`` among those its template can give, and that answer's probability."""
    maps = loaded.label_maps(scenes[key] for key in images)  # for an oracle probe
    probs = answer_questions(loaded.model, loaded.processor, images, list(zip(table["image_id"], table["command"])),
                             loaded.candidates(), batch_size, device,
                             None if maps is None else dict(zip(images, maps)),
                             None if maps is None else loaded.label_targets().mirror)  # [Q, C]
    probs = constrain(probs, fitting_answers(list(table["template"]), loaded.answers))
    best = probs.argmax(1)
    return [loaded.answers[i] for i in best], probs[np.arange(len(best)), best]


def _accuracy(correct: pd.Series, groups: pd.Series) -> dict[str, float]:
    return {str(g): round(float(v), 4) for g, v in correct.groupby(groups).mean().items()}


def summarize(table: pd.DataFrame) -> dict[str, Any]:
    """Per model (VLM, blind, most common answer): accuracy overall, per type and per question key; the VLM's and the
    blind baseline's calibration."""
    out: dict[str, Any] = {}
    for model in MODELS:
        correct = table[f"{model}_correct"]
        out[model] = {"accuracy": round(float(correct.mean()), 4),
                      "per_type": _accuracy(correct, table["command_type"]),
                      "per_question": _accuracy(correct, table["key"])}
        if model != "most_common":
            out[model].update(calibration(table[f"{model}_probability"].to_numpy(), correct.to_numpy()))
    return out


def most_common_answers(table: pd.DataFrame) -> pd.Series:
    """Each row's type's most common answer on these frames (ties: the first in sorted order): what a model that
    never looks at the image or the question's words could score at best per type."""
    common = {t: group["answer"].value_counts().sort_index().idxmax() for t, group in table.groupby("command_type")}
    return table["command_type"].map(common)


def evaluate_real(config: RealConfig, asked: dict[str, Any], paths: RealPaths) -> dict[str, Any]:
    """Score both models on the frames under ``config.root``; write the headline (each model's accuracy: three
    columns of ``dvc exp show``), the details (per type, per question key, calibration, what was asked), the
    predictions and the pictures; return the details. With no root, write notes in their place."""
    if config.root is None:
        note = "nothing measured: real.root is null (set it to a folder of labelled frames in BDD100K's layout)"
        return _write_note(note, paths)
    scenes, image_dir, skipped = read_frames(config)
    check(bool(scenes), "real.root", f"{config.root}: no answerable frame with its image")
    sizes = {}
    for scene in scenes:
        with Image.open(image_dir / scene.name) as image:
            sizes[scene.name] = image.size
    table = real_questions(scenes, sizes, asked, config.seed)
    check(len(table) > 0, "real.root", f"{config.root}: its labels answer no question of {', '.join(asked)}")
    device = pick_device()
    vlm = load_model(paths.model, paths.vocab, device)
    blind = load_model(paths.blind, paths.vocab, device)
    processor = vlm.processor
    images = {scene.image_id: processor.image(image_dir / scene.name) for scene in scenes}  # uint8 [3, H, W] each
    by_id = {scene.image_id: scene for scene in scenes}
    for name, loaded in (("vlm", vlm), ("blind", blind)):
        table[f"{name}_prediction"], table[f"{name}_probability"] = _answers(loaded, images, table, by_id,
                                                                             config.batch_size, device)
    table["most_common_prediction"] = most_common_answers(table)
    for model in MODELS:
        table[f"{model}_correct"] = table[f"{model}_prediction"] == table["answer"]

    summary = summarize(table)
    details = {"measured": True, "frames": len(scenes), "questions": len(table), **summary,
               "frames_left_out": skipped,
               "questions_per_type": table["command_type"].value_counts().sort_index().astype(int).to_dict(),
               "answers_per_type": {t: g["answer"].value_counts().sort_index().astype(int).to_dict()
                                    for t, g in table.groupby("command_type")}}
    write_json(paths.tables / "details.json", details)
    with atomic_path(paths.tables / "predictions.csv") as tmp:
        table.drop(columns=["name"]).to_csv(tmp, index=False)
    write_json(paths.metrics, {"real": {model: summary[model]["accuracy"] for model in MODELS}})
    plots.save_figure(plots.real_figure(summary, len(scenes), CALIBRATION_BINS), paths.plots / "real.png")
    failures = table[~table["vlm_correct"]].rename(columns={"vlm_prediction": "prediction",
                                                            "vlm_probability": "probability"})
    if config.failure_examples and len(failures):
        shown = failures.loc[pick_examples(failures, config.failure_examples, config.seed)]
        image_paths = {scene.image_id: image_dir / scene.name for scene in scenes}
        plots.save_image(plots.failure_sheet(shown, image_paths), paths.plots / "real_failures.png")
    else:
        note = "no failure: every answer is right" if config.failure_examples else \
            "no failures asked (real.failure_examples: 0)"
        plots.save_figure(plots.note_figure(note), paths.plots / "real_failures.png")
    return details


def _write_note(note: str, paths: RealPaths) -> dict[str, Any]:
    details = {"measured": False, "note": note}
    write_json(paths.metrics, {"real": {"note": note}})
    write_json(paths.tables / "details.json", details)
    with atomic_path(paths.tables / "predictions.csv") as tmp:
        pd.DataFrame(columns=["image_id", "command_type", "command", "answer"]).to_csv(tmp, index=False)
    for name in ("real.png", "real_failures.png"):
        plots.save_figure(plots.note_figure(note), paths.plots / name)
    return details

