"""The real-frames measurement (evaluate_real) and answers constrained to the question's template."""

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from stages import evaluate_real as stage
from vlm.commands.generate import CommandsConfig
from vlm.commands.templates import TEMPLATES, closest_phrasings, fitting_answers, match_template
from vlm.commands.types import candidates
from vlm.inference import constrain
from vlm.scenes.render import RenderConfig, render_scene
from vlm.scenes.schema import scene_from_frame, scene_to_frame

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import real_frames  # noqa: E402

BOX = {"x1": 10, "y1": 10, "x2": 50, "y2": 60}
SMALL = {"x1": 10, "y1": 10, "x2": 20, "y2": 30}
NAMES_2018 = {"pedestrian": "person", "motorcycle": "motor", "bicycle": "bike"}
COLOURS_2018 = {"R": "red", "G": "green", "Y": "yellow", "NA": "none"}


def bdd_layout(root: Path, frames: int = 6) -> Path:
    """Rendered frames written as a BDD100K download is laid out, labelled in the 2018 dialect: the frames' odd ones
    keep no occlusion flags, and one has lights none of which is coloured (as a hand-labelled set leaves them)."""
    images = root / "images" / "100k" / "val"
    images.mkdir(parents=True)
    config = RenderConfig(width=1280, height=720, max_count=6)
    labels = []
    for k in range(frames):
        image, scene = render_scene(1000 + k, f"real{k}.jpg", config)
        image.save(images / scene.name, quality=85)
        frame = scene_to_frame(scene)
        for label in frame["labels"]:
            label["category"] = NAMES_2018.get(label["category"], label["category"])
            attributes = label["attributes"]
            attributes["trafficLightColor"] = COLOURS_2018[attributes["trafficLightColor"]]
            if k % 2:
                del attributes["occluded"]
            if k == 2:
                del attributes["trafficLightColor"]
        labels.append(frame)
    (root / "labels" / "det_20").mkdir(parents=True)
    (root / "labels" / "det_20" / "det_val.json").write_text(json.dumps(labels))
    return root


def test_the_types_asked_follow_what_the_labels_say():
    """A label set that colours no light answers no light or safety question; one that leaves a road user's occlusion
    unsaid answers no safety question; what the labels do not say survives the det_20 round trip."""
    car = {"category": "car", "attributes": {"occluded": False}, "box2d": BOX}
    light = {"category": "traffic light", "attributes": {"trafficLightColor": "G"}, "box2d": BOX}
    uncoloured = {"category": "traffic light", "attributes": {}, "box2d": SMALL}
    large_uncoloured = {"category": "traffic light", "attributes": {}, "box2d": BOX | {"y2": 90}}
    person = {"category": "person", "attributes": {}, "box2d": BOX}

    def types(*labels):
        scene = scene_from_frame({"name": "a.jpg", "labels": list(labels)})
        assert scene_from_frame(scene_to_frame(scene)) == scene
        return {c.command_type for c in candidates(scene, 1280, 720, CommandsConfig().asked)}

    everything = {"counting", "detection", "safety", "spatial", "traffic_light"}  # no frame attributes: no scene
    assert types(car, light) == everything
    assert types(car, uncoloured) == everything - {"safety", "traffic_light"}
    assert types(person) == everything - {"safety", "traffic_light"}  # no light to ask about; occlusion unsaid
    assert types(car, light, uncoloured) == everything  # the coloured ones are the larger lights
    assert types(car, light, large_uncoloured) == everything - {"safety", "traffic_light"}  # it may govern


def test_each_template_matches_its_phrasings_loosely_and_nothing_else():
    for template in TEMPLATES.values():
        assert match_template(template.phrasings[0].format(
            category="car", plural="cars", k=3, color="red", side="left", action="turn left")) is template
    assert match_template("  how many CARS are there") is TEMPLATES["counting/how_many"]
    assert match_template("Is the sky blue?") is None
    assert "Is there a {category}?" in closest_phrasings("Is there a cat?")


def test_constrained_answers_come_from_the_template_only():
    answers = ["0", "1", "green", "maybe", "no", "red", "yes"]
    probs = np.array([[0.4, 0.1, 0.2, 0.05, 0.05, 0.1, 0.1]] * 3, dtype=np.float32)
    fitting = fitting_answers(["counting/how_many", "traffic_light/color", None], answers)
    constrained = constrain(probs, fitting)
    assert [answers[i] for i in constrained.argmax(1)] == ["0", "green", "0"]
    np.testing.assert_allclose(constrained.sum(1), 1.0, rtol=1e-6)
    assert constrained[0, 2:].sum() == 0  # a count question never answers a colour
    np.testing.assert_allclose(constrained[2], probs[2])  # no template: every answer


def _params(path: Path, root: Path | None) -> Path:
    params = yaml.safe_load(Path("params.yaml").read_text())
    params["real"].update(root=None if root is None else str(root), failure_examples=3)
    out = path / "params.yaml"
    out.write_text(yaml.safe_dump(params))
    return out


def test_real_frames_scored_per_type_beside_the_most_common_answer(reproduced, tmp_path, capsys):
    project = reproduced.project.path
    root = bdd_layout(tmp_path / "bdd")
    metrics = tmp_path / "metrics"
    stage.main(["--params", str(_params(tmp_path, root)), "--models", str(project / "models"),
                "--vocab", str(project / "data/processed/vocab.json"), "--metrics", str(metrics)])
    details = json.loads((metrics / "real" / "details.json").read_text())
    assert details["measured"] and details["frames"] == 6
    headline = json.loads((metrics / "real.json").read_text())  # three columns of dvc exp show
    assert headline == {"real": {model: details[model]["accuracy"] for model in ("vlm", "blind", "most_common")}}
    assert sum(details["questions_per_type"].values()) == details["questions"]
    import pandas as pd
    table = pd.read_csv(metrics / "real" / "predictions.csv", dtype=str, keep_default_na=False)
    assert len(table) == details["questions"]
    # the labels decide which types are asked: safety only where occlusion is labelled (even frames), light colours
    # not on frame 2
    asked = table.groupby("image_id")["command_type"].agg(set)
    assert all("safety" not in asked[f"real{k}"] for k in (1, 3, 5))
    assert "traffic_light" not in asked["real2"]
    # every prediction is an answer of its question's template
    for template, prediction in zip(table["template"], table["vlm_prediction"]):
        assert prediction in TEMPLATES[template].answers
    for t, group in table.groupby("command_type"):
        common = group["answer"].value_counts().max() / len(group)
        assert details["most_common"]["per_type"][t] == pytest.approx(common, abs=1e-4)
    assert (metrics / "plots" / "real.png").stat().st_size > 0
    assert (metrics / "plots" / "real_failures.png").stat().st_size > 0
    assert "real frames" in capsys.readouterr().out


def test_no_root_writes_a_note_and_a_missing_folder_is_named(reproduced, tmp_path, capsys):
    project = reproduced.project.path
    note = json.loads((project / "metrics" / "real.json").read_text())["real"]["note"]  # the tiny repro's: root null
    assert "real.root is null" in note
    assert json.loads((project / "metrics" / "real" / "details.json").read_text()) == {"measured": False, "note": note}
    args = ["--models", str(project / "models"), "--vocab", str(project / "data/processed/vocab.json"),
            "--metrics", str(tmp_path / "metrics")]
    with pytest.raises(FileNotFoundError, match="real.root: .*nowhere is not a folder"):
        stage.main(["--params", str(_params(tmp_path, tmp_path / "nowhere")), *args])


def test_predict_names_the_closest_phrasings_of_a_question_of_no_template(caplog):
    from vlm.predict import question_template

    with caplog.at_level(logging.WARNING):
        assert question_template("Is there a cat?") is None
    assert "Is there a {category}?" in caplog.text
    assert question_template("is there a car") == "detection/present"


def test_the_benchmark_commits_aggregates_only(reproduced, tmp_path):
    """benchmarks/real_frames.py: the headline and per-question accuracies with the command and the models' hashes;
    no frame name, question or answer of a frame (BDD100K's labels stay out of the repository)."""
    project = reproduced.project.path
    root = bdd_layout(tmp_path / "bdd")
    out = tmp_path / "real_frames.json"
    real_frames.main(["--root", str(root), "--models", str(project / "models"), "--out", str(out),
                      "--vocab", str(project / "data/processed/vocab.json")])
    result = json.loads(out.read_text())
    assert result["frames"] == 6 and result["command"].endswith("--root /path/to/bdd100k_val")
    assert set(result["vlm"]["per_question"]) == set(real_frames.QUESTIONS)
    assert "real0" not in out.read_text() and str(root) not in out.read_text()
