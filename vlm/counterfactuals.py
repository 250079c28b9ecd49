"""Counterfactual consistency: change one thing in a test scene (:mod:`vlm.scene_edits`), and check that the model's
answers change exactly where the answer rules say they must (docs/architecture.md, counterfactuals)."""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from vlm import plots
from vlm.checkpoint import LoadedModel, load_model
from vlm.commands.generate import CommandsConfig
from vlm.commands.templates import TEMPLATES, Candidate, fitting_answers
from vlm.commands.types import candidates
from vlm.config import check
from vlm.data.commands import read_commands
from vlm.device import pick_device
from vlm.inference import answer_questions, constrain
from vlm.io import atomic_path, write_json
from vlm.processor import Processor
from vlm.scene_edits import EDITS, Pair, make_pairs
from vlm.scenes.generate import ScenesConfig, load_raw
from vlm.scenes.schema import Scene

FIELDS = ("image_id", "command", "template")  # what is read of a commands record
# what :func:`run` reads of the scenes and commands params (dvc.yaml declares exactly these)
SCENES_KEYS = ("seed", "width", "height", "max_count", "jpeg_quality")


@dataclass
class CounterfactualsConfig:
    samples: int = 200  # test scenes re-rendered (all of them when the split is smaller)
    seed: int = 0
    unchanged_per_pair: int = 2  # questions whose answer must not change, asked per pair
    batch_size: int = 256
    sheet_examples: int = 8  # pairs on the contact sheet of edits the model did not follow
    edits: list[str] = field(default_factory=lambda: list(EDITS))

    def validate(self, prefix: str = "counterfactuals") -> None:
        check(self.samples >= 1, f"{prefix}.samples", f"must be >= 1, got {self.samples}")
        check(self.unchanged_per_pair >= 0, f"{prefix}.unchanged_per_pair", "must be >= 0")
        check(self.batch_size >= 1, f"{prefix}.batch_size", f"must be >= 1, got {self.batch_size}")
        check(self.sheet_examples >= 0, f"{prefix}.sheet_examples", "must be >= 0")
        unknown = [e for e in self.edits if e not in EDITS]
        check(not unknown and self.edits, f"{prefix}.edits", f"must name some of {', '.join(EDITS)}, got {self.edits}")
        check(len(set(self.edits)) == len(self.edits), f"{prefix}.edits", f"names an edit twice: {self.edits}")


def pair_questions(pair: Pair, width: float, height: float, asked: dict[str, Any], trained: set,
                   answers: set[str], unchanged_per_pair: int, rng: np.random.Generator) -> list[dict]:
    """The questions of one pair asked in training: all that must change, up to ``unchanged_per_pair`` that must not."""
    before = {c.key: c for c in candidates(pair.original.scene, width, height, asked)}
    after = {c.key: c for c in candidates(pair.edited_scene, width, height, asked)}
    keys = [k for k in sorted(before.keys() & after.keys())
            if (before[k].template, frozenset(before[k].params)) in trained
            and before[k].answer in answers and after[k].answer in answers]
    changed = [k for k in keys if before[k].answer != after[k].answer]
    unchanged = [k for k in keys if before[k].answer == after[k].answer]
    picked = rng.choice(len(unchanged), min(unchanged_per_pair, len(unchanged)), replace=False)
    rows = []
    for key in changed + [unchanged[i] for i in sorted(picked)]:
        candidate: Candidate = before[key]
        phrasing = int(rng.integers(len(TEMPLATES[candidate.template].phrasings)))
        rows.append({"key": key, "command": candidate.text(phrasing), "command_type": candidate.command_type,
                     "answer_before": candidate.answer, "answer_after": after[key].answer,
                     "must_change": candidate.answer != after[key].answer})
    return rows


@dataclass
class AskedPair:
    """A pair as the model is asked about it: its edit, and the keys of its two images in :class:`ModelImages`."""

    edit: str
    description: str
    image_id: str  # the original's key
    edited_key: str  # "{image id}/{pair}"


@dataclass
class ModelImages:
    """The pairs' images at the model's pixels (each JPEG-encoded at the scenes' quality first, as the scenes stage
    stores them) and their labels, by key. The full-size renders are not kept: a scene's original and edits
    at 1280 x 720 take about 24 MiB, at the model's 224 x 128 under 1 MiB."""

    processor: Processor
    jpeg_quality: int
    images: dict[str, torch.Tensor] = field(default_factory=dict)  # key -> uint8 [3, H, W]
    scenes: dict[str, Scene] = field(default_factory=dict)  # key -> its labels

    def add(self, p: int, pair: Pair) -> AskedPair:
        """Pair number ``p``'s two images: the original's once per scene, the edited one's under its own key."""
        original = pair.original.scene.image_id
        asked = AskedPair(pair.edit, pair.description, original, f"{original}/{p}")
        for key, image, scene in ((original, pair.original.image, pair.original.scene),
                                  (asked.edited_key, pair.edited_image, pair.edited_scene)):
            if key not in self.images:
                self.images[key], self.scenes[key] = self.processor.rendered(image, self.jpeg_quality), scene
        return asked


def answer_pairs(loaded: LoadedModel, pairs: list[AskedPair], questions: list[list[dict]], pictures: ModelImages,
                 batch_size: int, device: torch.device) -> list[tuple[list[str], list[str]]]:
    """The model's answers to each pair's questions on its original and its edited image."""
    row_of: dict[tuple[str, str], int] = {}  # (image key, question) -> its row in the answers
    slots = [tuple([row_of.setdefault((key, row["command"]), len(row_of)) for row in rows]
                   for key in (pair.image_id, pair.edited_key))
             for pair, rows in zip(pairs, questions)]  # per pair: its questions' rows on the original, on the edit
    maps = loaded.label_maps(pictures.scenes.values())  # for an oracle probe
    targets = None if maps is None else dict(zip(pictures.scenes, maps))
    probs = answer_questions(loaded.model, loaded.processor, pictures.images, list(row_of), loaded.candidates(),
                             batch_size, device, targets,
                             None if maps is None else loaded.label_targets().mirror)  # [Q, C]
    template_of = {row["command"]: row["key"].split("|")[0] for rows in questions for row in rows}
    probs = constrain(probs, fitting_answers([template_of[command] for _, command in row_of], loaded.answers))
    predicted = [loaded.answers[best] for best in probs.argmax(1)]
    return [([predicted[i] for i in before], [predicted[i] for i in after]) for before, after in slots]


def consistency_table(pairs: list[AskedPair], questions: list[list[dict]], predictions) -> pd.DataFrame:
    rows = []
    for p, (pair, pair_rows, (before, after)) in enumerate(zip(pairs, questions, predictions)):
        for row, pred_before, pred_after in zip(pair_rows, before, after):
            rows.append({"pair": p, "edit": pair.edit, "image_id": pair.image_id,
                         "description": pair.description, **row, "predicted_before": pred_before,
                         "predicted_after": pred_after})
    table = pd.DataFrame(rows)
    table["right_before"] = table["predicted_before"] == table["answer_before"]
    table["right_after"] = table["predicted_after"] == table["answer_after"]
    table["model_changed"] = table["predicted_before"] != table["predicted_after"]
    return table


def summarize(table: pd.DataFrame, edits: list[str]) -> dict[str, dict[str, Any]]:
    """Per edit: pairs, questions, accuracy before and after, consistency, changed / stayed when it had to."""
    out = {}
    for edit in edits:
        group = table[table["edit"] == edit]
        if group.empty:
            continue
        must, must_not = group[group["must_change"]], group[~group["must_change"]]
        out[edit] = {
            "pairs": int(group["pair"].nunique()), "questions": len(group), "must_change": len(must),
            "accuracy_original": round(float(group["right_before"].mean()), 4),
            "accuracy_edited": round(float(group["right_after"].mean()), 4),
            "consistency": round(float((group["right_before"] & group["right_after"]).mean()), 4),
            "changed_when_it_must": round(float(must["model_changed"].mean()), 4) if len(must) else None,
            "stayed_when_it_must": round(float((~must_not["model_changed"]).mean()), 4) if len(must_not) else None,
        }
    return out


@dataclass
class CounterfactualsPaths:
    model: Path = Path("models/vlm.pt")
    data: Path = Path("data/processed")  # commands/{train,test}.json, vocab.json
    raw: Path = Path("data/raw")  # labels.json, source.json
    metrics: Path = Path("metrics/counterfactuals.json")  # the headline: consistency per edit
    details: Path = Path("metrics/counterfactuals/summary.json")  # every rate per edit
    table: Path = Path("metrics/counterfactuals/questions.csv")  # every question of every pair
    plot: Path = Path("metrics/plots/counterfactuals.png")
    sheet: Path = Path("metrics/plots/counterfactual_failures.png")
    statistics: Path = Path("vlm/scenes/bdd100k_statistics.json")  # what the scenes were rendered from


def run(config: CounterfactualsConfig, scenes: ScenesConfig, commands: CommandsConfig, paths: CounterfactualsPaths,
        progress: bool = True) -> dict[str, Any]:
    """Render the pairs, ask the model, write the metrics, the question table, the plot and the sheet; return the
    summary per edit (empty for BDD100K frames). Of ``scenes`` and ``commands`` only ``*_KEYS``' fields are read."""
    raw = load_raw(paths.raw)
    if raw.source != "synthetic":
        write_outputs({"counterfactuals": {}}, pd.DataFrame(), [], paths,
                      f"no counterfactuals: scenes.source is {raw.source} (only rendered scenes can be edited)")
        return {}
    device = pick_device()
    loaded = load_model(paths.model, paths.data / "vocab.json", device)
    image_ids = sorted({r["image_id"] for r in read_commands(paths.data / "commands" / "test.json", FIELDS)})
    if config.samples < len(image_ids):
        image_ids = sorted(np.random.default_rng(config.seed).choice(image_ids, config.samples, replace=False).tolist())
    labels = {scene.image_id: scene for scene in raw.scenes}
    # (template, frozenset of params) of every question asked in training
    trained = {(r["template"], frozenset(TEMPLATES[r["template"]].parse(r["command"]).items()))
               for r in read_commands(paths.data / "commands" / "train.json", FIELDS)}
    answers, rng = set(loaded.answers), np.random.default_rng(config.seed)
    pictures = ModelImages(loaded.processor, scenes.jpeg_quality)
    render_config = dataclasses.replace(scenes.render_config, statistics=paths.statistics)
    pairs, questions = [], []
    for p, pair in enumerate(make_pairs(tqdm(image_ids, desc="render", disable=not progress), scenes.seed, labels,
                                        render_config, config.edits, config.seed)):
        questions.append(pair_questions(pair, raw.width, raw.height, commands.asked, trained, answers,
                                        config.unchanged_per_pair, rng))
        pairs.append(pictures.add(p, pair))
    predictions = answer_pairs(loaded, pairs, questions, pictures, config.batch_size, device)
    table = consistency_table(pairs, questions, predictions)
    metrics = {"counterfactuals": summarize(table, config.edits)}
    # the first question of each pair whose answer had to change and the model's did not (or changed to a wrong one),
    # its pair rendered again at full size for the sheet
    failed = table[table["must_change"] & ~table["right_after"]].drop_duplicates("pair")
    picks = failed.groupby("edit", sort=False).head(max(1, config.sheet_examples // len(config.edits)))
    shown = [(next(again for again in make_pairs([row.image_id], scenes.seed, labels, render_config,
                                                 config.edits, config.seed) if again.edit == row.edit), row)
             for row in picks.head(config.sheet_examples).itertuples()]
    nothing_shown = ("every edit was followed" if failed.empty
                     else "no pairs asked for the sheet (counterfactuals.sheet_examples: 0)")
    write_outputs(metrics, table, shown, paths, nothing_shown)
    return metrics["counterfactuals"]


def headline(summary: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """What ``dvc exp show`` compares (``metrics/counterfactuals.json``): per edit, the consistency (right on both)."""
    return {"consistency": {edit: rates["consistency"] for edit, rates in summary.items()}}


def write_outputs(metrics: dict, table: pd.DataFrame, shown: list[tuple[Pair, Any]], paths: CounterfactualsPaths,
                  empty_note: str) -> None:
    summary = metrics["counterfactuals"]
    write_json(paths.details, metrics)
    write_json(paths.metrics, headline(summary))
    with atomic_path(paths.table) as tmp:
        table.to_csv(tmp, index=False)
    plots.save_figure(plots.counterfactuals_figure(summary) if summary else plots.note_figure(empty_note), paths.plot)
    if shown:
        plots.save_image(plots.counterfactual_sheet(shown), paths.sheet)
    else:
        plots.save_figure(plots.note_figure(empty_note), paths.sheet)
