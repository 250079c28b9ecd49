"""The accuracy-vs-compute harness: its plan, its summary of the curve, and one real queued point."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import scaling_curve  # noqa: E402


def test_plan_runs_the_cheapest_points_first():
    params = {"train": {"epochs": 7}, "pack": {"image_size": 128}}
    points = scaling_curve.plan(params, [1, 2, 4, 8], 224, [1, 2])
    assert [p.name for p in points] == ["scale-128px-7ep", "scale-128px-14ep", "scale-224px-7ep",
                                        "scale-128px-28ep", "scale-224px-14ep", "scale-128px-56ep"]
    assert points[2].set_params(128) == ["train.epochs=7", "pack.image_size=224"]
    assert points[1].set_params(128) == ["train.epochs=14"]
    anchored = scaling_curve.plan({**params, "train": {"epochs": 8}}, [1, 2], None, [], base_epochs=7)
    assert [p.name for p in anchored] == ["scale-128px-7ep", "scale-128px-14ep"]


def test_the_images_series_multiplies_the_scenes_at_the_1x_epochs():
    params = {"train": {"epochs": 6}, "pack": {"image_size": 128}, "scenes": {"num_images": 4000}}
    points = scaling_curve.plan(params, [1, 2], 0, [], image_multiples=[1, 2, 4])
    assert [p.name for p in points] == ["scale-128px-6ep", "scale-128px-12ep", "scale-128px-6ep-8000img",
                                        "scale-128px-6ep-16000img"]  # its 1x is the epochs series' run
    assert points[2].set_params(128) == ["train.epochs=6", "scenes.num_images=8000"]
    assert [p.series for p in points] == ["128px", "128px", "128px, images", "128px, images"]
    assert [p.multiple for p in points] == [1, 2, 2, 4]


def row(size: int, multiple: int, accuracy: float, series: str | None = None) -> dict:
    return {"image_size": size, "multiple": multiple, "accuracy": accuracy, "seconds": 100.0 * multiple,
            "series": series or f"{size}px"}


def test_points_are_placed_at_their_series_1x_rate():
    rows = [{"image_size": 128, "series": "128px", "multiple": m, "steps": 100 * m, "train_seconds": t}
            for m, t in ((1, 50.0), (2, 160.0))]
    rows.append({"image_size": 224, "series": "224px", "multiple": 2, "steps": 200, "train_seconds": 300.0})
    rows.append({"image_size": 128, "series": "128px, images", "multiple": 4, "steps": 400, "train_seconds": 900.0})
    scaling_curve.at_reference_rate(rows)
    # the 224 px series has no 1x point: as measured; the images series' 1x is the 128 px run
    assert [r["seconds"] for r in rows] == [50.0, 100.0, 300.0, 200.0]


def test_targets_reached_or_extrapolated_from_the_trend():
    rows = [row(128, 1, 0.80), row(128, 2, 0.85), row(128, 4, 0.90), row(224, 1, 0.7), row(224, 2, 0.7),
            row(128, 2, 0.86, "128px, images"), row(128, 4, 0.93, "128px, images")]
    at_90 = scaling_curve.target_summary(rows, 0.90)
    assert at_90["128px"] == {"reached_at_multiple": 4, "seconds": 400.0}
    assert at_90["224px"]["multiple_needed_by_trend"] is None  # flat: never
    at_95 = scaling_curve.target_summary(rows, 0.95)["128px"]
    assert at_95["reached_at_multiple"] is None
    assert at_95["gain_per_doubling"] == pytest.approx(0.05)
    assert at_95["multiple_needed_by_trend"] == pytest.approx(8.0)  # 0.80 + 0.05 per doubling: 3 doublings
    images = scaling_curve.target_summary(rows, 0.95)["128px, images"]  # from the shared 1x: 0.80, 0.86, 0.93
    assert images["gain_per_doubling"] == pytest.approx(0.065)


def test_points_of_the_earlier_file_are_kept_where_their_experiments_are_elsewhere(tmp_path):
    params = {"train": {"epochs": 6}, "pack": {"image_size": 128}, "scenes": {"num_images": 4000}}
    points = scaling_curve.plan(params, [1, 2], 0, [], image_multiples=[2])
    earlier = tmp_path / "scaling.json"
    old = [{"name": "scale-128px-6ep", "image_size": 128, "accuracy": 0.9},
           {"name": "scale-64px-6ep", "image_size": 64}]
    earlier.write_text(json.dumps({"points": old}))
    found = {"scale-128px-6ep-8000img": {"name": "scale-128px-6ep-8000img", "accuracy": 0.95}}
    rows = scaling_curve.recorded(points, found, earlier)
    # the plan's order; the earlier file's point of another plan is left out, one from before the series named one
    assert [(r["name"], r["accuracy"]) for r in rows] == [("scale-128px-6ep", 0.9), ("scale-128px-6ep-8000img", 0.95)]
    assert rows[0]["series"] == "128px"
    assert scaling_curve.recorded(points, found, tmp_path / "none.json") == list(found.values())


@pytest.mark.pipeline
def test_one_point_through_the_queue_then_collect_reports_the_missing(reproduced, tmp_path):
    # the tiny `dvc repro` (tests/conftest.py), committed as after `make repro`: the point (1x its epochs at its
    # image size) is queued and run as an experiment of that commit, whose stages are up to date
    project = reproduced.copy(tmp_path / "project")
    project.run("git", "add", "-A")
    project.run("git", "commit", "-qm", "baseline")
    script = str(ROOT / "benchmarks" / "scaling_curve.py")
    project.env["PYTHONPATH"] = f"{project.path}:{ROOT}"
    run = project.run(sys.executable, script, "--multiples", "1", "--large-size", "0", "--poll", "1")
    assert "0 of 1 points done; running scale-32px-1ep" in run.stdout
    result = project.json("metrics/scaling.json")
    (point,) = result["points"]
    evaluation = json.loads(project.run("git", "show", f"{point['experiment']}:metrics/eval.json").stdout)
    assert point["accuracy"] == evaluation["vlm"]["accuracy"] and point["epochs"] == 1
    assert point["seconds"] == point["train_seconds"] > 0 and result["missing"] == []
    cf = "metrics/counterfactuals/summary.json"
    summary = json.loads(project.run("git", "show", f"{point['experiment']}:{cf}").stdout)
    assert point["counterfactuals_changed_when_they_must"] == {
        edit: values["changed_when_it_must"] for edit, values in summary["counterfactuals"].items()}
    # a wider curve, collected only: the finished point is reused, the others are reported missing
    project.run(sys.executable, script, "--multiples", "1", "2", "--large-size", "48", "--large-multiples", "1",
                "--collect-only")
    result = project.json("metrics/scaling.json")
    assert [p["name"] for p in result["points"]] == ["scale-32px-1ep"]
    assert result["missing"] == ["scale-32px-2ep", "scale-48px-1ep"]
    assert Path(project.path / "metrics/plots/scaling.png").stat().st_size > 10_000
    assert subprocess.run(["git", "status", "--porcelain", "dvc.lock"], cwd=project.path, capture_output=True,
                          text=True).stdout == ""  # the workspace was not touched


def test_points_that_did_not_finish_fail_the_run(monkeypatch, tmp_path, capsys):
    """A run whose queued points failed exits non-zero naming them (``--collect-only`` only reports them)."""
    monkeypatch.setattr(scaling_curve, "queue_missing", lambda points, size: points)
    monkeypatch.setattr(scaling_curve, "run_queue", lambda poll: None)
    monkeypatch.setattr(scaling_curve, "collect", lambda *args: {"points": [], "missing": ["scale-128px-1ep"]})
    argv = ["--params", str(ROOT / "params.yaml"), "--multiples", "1", "--large-size", "0", "--out",
            str(tmp_path / "s.json"), "--plot", str(tmp_path / "s.png")]
    with pytest.raises(SystemExit, match=r"1 point\(s\) did not finish"):
        scaling_curve.main(argv)
    scaling_curve.main([*argv, "--collect-only"])
    assert capsys.readouterr().err.count("missing: scale-128px-1ep") == 2
