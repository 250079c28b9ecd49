"""Real `dvc repro` of the data stages on tiny params, in a temporary git repository."""

import pytest

from pipeline import DvcProject

pytestmark = pytest.mark.pipeline


def test_data_stages_repro_then_up_to_date(tmp_path):
    project = DvcProject(tmp_path, {"scenes": {"num_images": 40}, "runtime": {"scenes": {"workers": 2}}})
    out = project.run("dvc", "repro", "build_vocab")
    for stage in ("generate_scenes", "generate_commands", "build_vocab"):
        assert f"Running stage '{stage}'" in out.stdout
    assert len(list((tmp_path / "data/raw/images").glob("*.jpg"))) == 40
    commands = project.json("metrics/commands.json")
    assert sum(s["images"] for s in commands.values()) == 40
    assert set(commands["train"]["types"]) == {"detection", "counting", "traffic_light", "spatial", "safety", "scene"}
    assert project.json("metrics/vocab.json")["val"]["coverage_pct"] > 90
    assert (tmp_path / "metrics/plots/commands_sheet.png").stat().st_size > 10_000
    assert (tmp_path / "dvc.lock").exists()
    again = project.run("dvc", "repro", "build_vocab")
    assert "Running stage" not in again.stdout
    status = project.run("dvc", "status", "build_vocab")
    assert "up to date" in status.stdout


def test_bad_param_fails_with_one_clear_line(tmp_path):
    project = DvcProject(tmp_path, {"scenes": {"num_images": 0}})
    result = project.run("dvc", "repro", "generate_scenes", check=False)
    assert result.returncode != 0
    assert "error: scenes.num_images: must be at least 1, got 0" in result.stderr + result.stdout
    assert not (tmp_path / "data/raw").exists()


def test_outputs_travel_through_a_dvc_remote(tmp_path):
    """`dvc push` to a remote, a clean machine's `dvc pull` restores every output byte for byte."""
    project = DvcProject(tmp_path / "a", {"scenes": {"num_images": 30}, "runtime": {"scenes": {"workers": 1}}})
    project.run("dvc", "repro", "generate_commands")
    remote = tmp_path / "remote"
    project.run("dvc", "remote", "add", "-d", "store", str(remote))
    project.run("dvc", "push")
    labels = (tmp_path / "a" / "data/raw/labels.json").read_bytes()
    project.run("git", "add", "-A")
    project.run("git", "commit", "-qm", "results")

    clone = tmp_path / "b"
    project.run("git", "clone", "-q", str(tmp_path / "a"), str(clone))
    other = DvcProject.existing(clone, project.env)
    other.run("dvc", "pull", "--with-deps", "generate_commands")
    assert (clone / "data/raw/labels.json").read_bytes() == labels
    assert len(list((clone / "data/raw/images").glob("*.jpg"))) == 30
    assert "up to date" in other.run("dvc", "status", "generate_commands").stdout
