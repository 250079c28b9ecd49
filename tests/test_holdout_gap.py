"""The held-out combination harness: the comparison it makes, and one real held-out experiment."""

import io
import sys

import pandas as pd
import pytest

from pipeline import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import holdout_gap  # noqa: E402


def test_compare_on_the_frames_of_the_combination():
    seen = pd.DataFrame({"image_id": ["a", "a", "b", "c"], "command_type": ["scene", "counting", "scene", "scene"],
                         "template": ["scene/night", "counting/how_many", "scene/night", "scene/night"],
                         "timeofday": ["night", "night", "night", "daytime"], "weather": ["rainy"] * 3 + ["clear"],
                         "correct": [True, True, False, True]})
    unseen = pd.DataFrame({"image_id": ["a", "b", "d"], "command_type": ["scene", "scene", "scene"],
                           "template": ["scene/night"] * 3, "correct": [False, False, True]})
    result = holdout_gap.compare(seen, unseen, {"timeofday": "night", "weather": "rainy"})
    assert result["frames"] == 2
    assert result["seen_in_training"]["accuracy"] == pytest.approx(2 / 3, abs=1e-4)
    assert result["held_out"] == {"questions": 2, "accuracy": 0.0, "per_type": {"scene": 0.0}}
    assert result["held_out_whole_split"]["questions"] == 3
    assert result["gap"] == pytest.approx(2 / 3, abs=1e-4)
    # the held-out model asked no counting question of these frames: the same mix is scene/night's alone
    assert result["same_mix"] == {"templates": 1, "templates_left_out": ["counting/how_many"],
                                  "questions": {"seen_in_training": 2, "held_out": 2}, "seen_in_training": 0.5,
                                  "held_out": 0.0, "gap": 0.5, "gap_standard_error": round((0.25 / 2) ** 0.5, 4)}


def test_the_same_mix_weights_each_template_as_the_seen_questions_do():
    """Two templates, asked 3:1 of the seen model and 1:3 of the held-out one: its accuracy at the seen mix."""
    seen = pd.DataFrame({"template": ["t1"] * 3 + ["t2"], "correct": [True, True, False, True]})
    held = pd.DataFrame({"template": ["t1"] + ["t2"] * 3, "correct": [True, False, False, True]})
    mix = holdout_gap.same_mix(seen, held)
    assert mix["seen_in_training"] == pytest.approx(0.75, abs=1e-4)  # its own accuracy: the mix is its own
    assert mix["held_out"] == pytest.approx(0.75 * 1.0 + 0.25 * (1 / 3), abs=1e-4)  # not its raw 0.5
    variance = 0.75 ** 2 * ((2 / 3) * (1 / 3) / 3 + 0) + 0.25 ** 2 * (0 + (1 / 3) * (2 / 3) / 3)
    assert mix["gap_standard_error"] == pytest.approx(variance ** 0.5, abs=1e-4)


def test_combination_argument():
    assert holdout_gap.parse_combination("timeofday=night,weather=rainy") == {"timeofday": "night",
                                                                             "weather": "rainy"}
    assert holdout_gap.experiment_name({"timeofday": "dawn/dusk", "scene": "city street"}) == \
        "holdout-dawn_dusk-city_street"
    with pytest.raises(SystemExit, match="expected attribute=value"):
        holdout_gap.parse_combination("night")


@pytest.mark.pipeline
def test_a_held_out_experiment_that_fails_stops_with_one_line(monkeypatch):
    calls = []
    monkeypatch.setattr(holdout_gap, "check_workspace_run", lambda: None)
    monkeypatch.setattr(holdout_gap.scaling_curve, "finished_experiments", dict)
    monkeypatch.setattr(holdout_gap.scaling_curve, "queue_entries", lambda: {"holdout-night": "Failed"})
    monkeypatch.setattr(holdout_gap.scaling_curve, "dvc", lambda *args: calls.append(args) or "")
    monkeypatch.setattr(holdout_gap.scaling_curve, "run_queue", lambda poll: calls.append(("run_queue",)))
    with pytest.raises(SystemExit, match=r"holdout-night did not finish \(Failed\): `dvc queue logs holdout-night`"):
        holdout_gap.main(["--combination", "timeofday=night"])
    assert calls[-1] == ("run_queue",) and calls[0][:2] == ("queue", "remove")  # the failed entry queued again


def test_held_out_experiment_against_the_workspace_run(reproduced, tmp_path):
    project = reproduced.copy(tmp_path / "project")  # `dvc repro` on the tiny params (tests/conftest.py)
    project.env["PYTHONPATH"] = f"{project.path}:{ROOT}"
    predictions = project.path / "metrics" / "eval" / "predictions.csv"
    committed = predictions.read_bytes()
    predictions.write_bytes(committed.replace(b"yes", b"no"))  # not the run's output: refused, nothing queued
    refused = project.run(sys.executable, str(ROOT / "benchmarks" / "holdout_gap.py"), "--combination",
                          "timeofday=night", check=False)
    assert refused.returncode != 0 and "the workspace is not its committed run" in refused.stderr
    predictions.write_bytes(committed)
    run = project.run(sys.executable, str(ROOT / "benchmarks" / "holdout_gap.py"), "--combination",
                      "timeofday=night", "--poll", "1")
    assert "seen in training" in run.stdout
    result = project.json("metrics/holdout.json")
    shown = project.run("git", "show", f"{result['experiment']}:metrics/eval/predictions.csv").stdout
    held_out = pd.read_csv(io.StringIO(shown))
    assert set(held_out["timeofday"]) == {"night"}  # the experiment's test split: the combination only
    assert result["held_out_whole_split"]["questions"] == len(held_out)
    assert 1 <= result["held_out"]["questions"] <= len(held_out) and result["seen_in_training"]["questions"] >= 1
