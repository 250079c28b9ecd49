"""The model card written beside the model (``models/README.md``, Hugging Face's layout: YAML front matter, then
Markdown): what the model is, what it was trained on, its params, its accuracy per question type on the synthetic
test split and on real frames beside the blind baseline, its limits and how to load it. Every number comes from the
run's own files; real-frame numbers only where they were measured on this very model file (its SHA-256)."""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from vlm.io import existing_file, read_json

PARAM_SECTIONS = ("scenes", "commands", "pack", "model", "train")  # what the model file depends on
REAL_COLUMNS = (("vlm", "VLM"), ("blind", "blind"), ("most_common", "most common answer"))


@dataclass(frozen=True)
class CardInputs:
    """The files a card is written from."""

    model: Path  # models/vlm.pt
    eval: Path  # metrics/eval.json: the synthetic test split
    train: Path  # metrics/train.json
    scenes: Path  # metrics/scenes.json
    commands: Path  # metrics/commands.json
    real: Path  # metrics/real/details.json: evaluate_real's (not measured when real.root is null)
    real_frames: Path  # metrics/real_frames.json: `make real`, kept where it measured this model file


def real_accuracy(model_sha256: str, real: dict[str, Any], real_frames: dict[str, Any] | None
                  ) -> tuple[dict[str, Any], str] | None:
    """The real-frame measurement of this model and where it comes from: the pipeline's (``real.root`` set), else
    `make real`'s when it measured the same model file, else None."""
    if real.get("measured"):
        return real, "the pipeline's `evaluate_real` stage (`real.root`), `metrics/real/details.json`"
    if real_frames and real_frames.get("models_sha256", {}).get("vlm") == model_sha256:
        return real_frames, f"`{real_frames['command']}`, `metrics/real_frames.json`"
    return None


def _cell(metrics: dict[str, Any], model: str, question_type: str | None) -> str:
    """``model``'s accuracy on ``question_type`` (None: overall), "n/a" where the type was not asked."""
    scores = metrics[model]
    value = scores["accuracy"] if question_type is None else scores["per_type"].get(question_type)
    return "n/a" if value is None else f"{value:.3f}"


def _accuracy_table(synthetic: dict[str, Any], real: dict[str, Any] | None) -> list[str]:
    real_columns = [(key, name) for key, name in REAL_COLUMNS if real and key in real]
    header = ["type", "VLM, synthetic test", "blind, synthetic test", *(f"{name}, real frames"
                                                                         for _, name in real_columns)]
    rows = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for t in [*synthetic["vlm"]["per_type"], None]:
        cells = [_cell(synthetic, "vlm", t), _cell(synthetic, "blind", t), *(_cell(real, key, t)
                                                                               for key, _ in real_columns)]
        rows.append(f"| {'**overall**' if t is None else t} | " + " | ".join(cells) + " |")
    return rows


def _real_limit(real: dict[str, Any] | None) -> str:
    if real is None:
        return "- How well it transfers to real dashcam frames is not measured for this model file."
    behind = [t for t, value in real["vlm"]["per_type"].items() if value < real["blind"]["per_type"].get(t, 0.0)]
    return ("- On real frames it answers below the blind baseline on " + ", ".join(behind) + ": there it has not "
            "learnt to see what it was asked about." if behind else
            "- On real frames it is at or above the blind baseline on every type.")


def _plain(value: Any) -> Any:
    """Params (read-recording mappings) as plain dicts and lists, for YAML."""
    if isinstance(value, Mapping):
        return {k: _plain(value[k]) for k in value}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def model_card(inputs: CardInputs, params: Mapping[str, Any]) -> str:
    """The card's Markdown for the model file of ``inputs`` trained with ``params`` (params.yaml's sections)."""
    model = existing_file(inputs.model, "model checkpoint")
    payload = torch.load(model, map_location="cpu", weights_only=True)  # tensors and plain values only
    with open(model, "rb") as f:
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    synthetic, train = read_json(inputs.eval), read_json(inputs.train)
    scenes, commands = read_json(inputs.scenes), read_json(inputs.commands)
    real_frames = read_json(inputs.real_frames) if inputs.real_frames.is_file() else None
    measured = real_accuracy(sha256, read_json(inputs.real), real_frames)
    real, real_source = measured if measured else (None, None)

    width, height = payload.get("image_width") or payload["image_size"], payload["image_size"]
    if scenes["source"] == "synthetic":
        data = (f"{scenes['images']:,} rendered 1280x720 traffic scenes whose frame attributes, object counts, sizes "
                "and occlusion follow BDD100K's label statistics; no real frame")
    else:
        data = f"{scenes['images']:,} BDD100K frames (BDD100K's licence applies to a model trained on them)"
    types = ", ".join(commands["train"]["types"])
    lines = [
        "---",
        "license: mit",
        "library_name: pytorch",
        "pipeline_tag: visual-question-answering",
        "tags: [traffic, dashcam, paligemma, synthetic-data, dvc]",
        "metrics: [accuracy]",
        "---",
        "",
        f"# traffic-vlm: a {train['parameters'] / 1e6:.1f} M-parameter VLM for traffic scenes",
        "",
        "A PaliGemma-style vision-language model (SigLIP image encoder, connector, Gemma decoder; `model.*` below) "
        "that answers template questions about a dashcam frame by scoring every answer its question can give. "
        f"Written by the pipeline's `model_card` stage beside `vlm.pt` (SHA-256 `{sha256}`).",
        "",
        "## Training",
        "",
        f"{data}. {commands['train']['questions']:,} training questions on {commands['train']['images']:,} images, "
        f"of the types {types}. {train['steps']:,} optimizer steps; the model is epoch {train['best_epoch']} of "
        f"{train['epochs']}, the best on the validation split ({train['val_accuracy']:.3f}).",
        "",
        "## Accuracy",
        "",
        "The blind baseline is the same decoder trained on the questions alone: what a model gets without looking.",
        "",
        *_accuracy_table(synthetic, real),
        "",
        (f"Real frames: {real['frames']:,} labelled frames ({real['questions']:,} questions), zero-shot, from "
         f"{real_source}." if real else
         "Real frames: not measured for this model file (set `real.root` to a folder of labelled frames in "
         "BDD100K's layout, or run `make real ROOT=...`)."),
        "",
        "## Limits",
        "",
        "- A research baseline, not a perception system: never use it for decisions about real traffic.",
        _real_limit(real),
        f"- It answers the project's English question templates over a fixed set of {len(payload['answers'])} "
        f"answers ({', '.join(payload['answers'])}); a question of no template is scored over every answer.",
        f"- Any image is resized as in training, to {width} x {height} pixels: small objects such as traffic lights "
        "are a few pixels.",
        "",
        "## Load it",
        "",
        "With this repository installed (`make setup`):",
        "",
        "```bash",
        'python -m vlm.predict --checkpoint models/vlm.pt --image frame.jpg --question "Is there a pedestrian?"',
        "```",
        "",
        "```python",
        "from vlm.checkpoint import load_model",
        'loaded = load_model("models/vlm.pt")  # .model (a torch.nn.Module), .processor, .tokenizer, .answers',
        "```",
        "",
        "The file is a `torch.save` dict of tensors and plain values, read with `torch.load(weights_only=True)`.",
        "",
        "## Params",
        "",
        "```yaml",
        yaml.safe_dump({k: _plain(params[k]) for k in PARAM_SECTIONS if k in params}, sort_keys=False).rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)
