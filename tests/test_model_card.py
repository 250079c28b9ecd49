"""The model card (models/README.md) that the model_card stage writes beside the model: Hugging Face's layout, every
number from the run's files, real-frame numbers only for the model file they were measured on."""

import json
import re

import yaml

from vlm.io import write_json
from vlm.model_card import CardInputs, model_card
from vlm.params import load_params


def _inputs(project, real_frames):
    metrics = project / "metrics"
    return CardInputs(model=project / "models" / "vlm.pt", eval=metrics / "eval.json", train=metrics / "train.json",
                      scenes=metrics / "scenes.json", commands=metrics / "commands.json",
                      real=metrics / "real" / "details.json", real_frames=real_frames)


def test_the_pipeline_writes_the_card_from_its_metrics(reproduced):
    project = reproduced.project.path
    card = (project / "models" / "README.md").read_text(encoding="utf-8")
    front = yaml.safe_load(card.split("---")[1])
    assert front["license"] == "mit" and front["pipeline_tag"] == "visual-question-answering"
    synthetic = json.loads((project / "metrics" / "eval.json").read_text())
    overall = re.search(r"\| \*\*overall\*\* \| ([\d.]+) \| ([\d.]+) \|", card)
    assert overall and float(overall[1]) == round(synthetic["vlm"]["accuracy"], 3)
    assert float(overall[2]) == round(synthetic["blind"]["accuracy"], 3)
    for t, value in synthetic["vlm"]["per_type"].items():
        assert f"| {t} | {value:.3f} |" in card
    # the tiny run measured no real frames (real.root null), and the committed measurement is of another model
    assert "Real frames: not measured for this model file" in card
    params = yaml.safe_load(card.split("```yaml")[1].split("```")[0])
    assert params["train"] == yaml.safe_load((project / "params.yaml").read_text())["train"]
    assert "python -m vlm.predict --checkpoint models/vlm.pt" in card


def test_real_frames_measured_on_this_model_file_go_in_the_card(reproduced, tmp_path):
    project = reproduced.project.path
    from vlm.checkpoint import file_sha256

    per_type = {"counting": 0.4, "detection": 0.7}
    measured = {"command": "python benchmarks/real_frames.py --root /path/to/bdd100k_val", "frames": 6,
                "questions": 50, "models_sha256": {"vlm": file_sha256(project / "models" / "vlm.pt")},
                "vlm": {"accuracy": 0.5, "per_type": per_type},
                "blind": {"accuracy": 0.6, "per_type": {"counting": 0.5, "detection": 0.6}},
                "most_common": {"accuracy": 0.65, "per_type": {"counting": 0.45, "detection": 0.7}}}
    write_json(tmp_path / "real_frames.json", measured)
    card = model_card(_inputs(project, tmp_path / "real_frames.json"), load_params(project / "params.yaml"))
    assert "| VLM, real frames | blind, real frames | most common answer, real frames |" in card
    assert "| counting |" in card and " | 0.400 | 0.500 | 0.450 |" in card
    assert "| **overall** |" in card and " | 0.500 | 0.600 | 0.650 |" in card
    assert "6 labelled frames (50 questions)" in card and "below the blind baseline on counting:" in card
    measured["models_sha256"]["vlm"] = "0" * 64  # another model's measurement is not shown
    write_json(tmp_path / "real_frames.json", measured)
    card = model_card(_inputs(project, tmp_path / "real_frames.json"), load_params(project / "params.yaml"))
    assert "real frames |" not in card and "not measured for this model file" in card
