"""The whole pipeline through real DVC on tiny params: `dvc repro`, then `dvc exp run -S`."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from pipeline import DvcProject
from test_metrics_columns import MAX_METRIC_COLUMNS, leaves
from vlm.commands.types import QUESTION_TYPES

pytestmark = pytest.mark.pipeline


def _check_headline_metrics(project: DvcProject) -> None:
    """A few dozen metric columns, the test accuracies first; every metrics file parses, no warning."""
    show = project.run("dvc", "metrics", "show", "--json")
    assert show.stderr.strip() == "", show.stderr
    files = json.loads(show.stdout)[""]["data"]
    assert all("error" not in entry for entry in files.values()), files
    columns = [name for entry in files.values() for name in leaves(entry["data"])]
    assert len(columns) <= MAX_METRIC_COLUMNS, (len(columns), columns)
    assert not any(c.startswith("slices.") for c in columns)  # beside them: metrics/eval/slices.json
    assert {c.split(".")[0] for c in columns if "." in c} >= {"vlm", "blind", "gain_from_vision", "consistency"}
    types = [c for c in columns if c.startswith("vlm.per_type.")]
    assert {c.removeprefix("vlm.per_type.") for c in types} <= set(QUESTION_TYPES)
    lead = ["vlm.accuracy", *types, "vlm.macro_f1", "vlm.ece", "blind.accuracy"]
    assert columns[:len(lead)] == lead
    header = project.run("dvc", "exp", "show", "--csv").stdout.splitlines()[0].split(",")
    assert header[header.index("parent") + 1:][:len(lead)] == lead  # exp show leads with the same columns


def test_repro_then_experiment(reproduced, tmp_path):
    project = reproduced.copy(tmp_path / "project")  # `dvc repro` on the tiny params (tests/conftest.py)
    for stage in ("generate_scenes", "generate_commands", "build_vocab", "pack_hdf5", "train", "train_blind",
                  "evaluate", "counterfactuals", "profile_dataloader"):
        assert f"Running stage '{stage}'" in reproduced.repro, stage
    evaluation = project.json("metrics/eval.json")
    assert {"vlm", "blind", "gain_from_vision"} <= set(evaluation)
    assert project.json("metrics/train.json")["epochs"] == 1
    baseline_steps = project.json("metrics/train.json")["steps"]
    assert "up to date" in project.run("dvc", "status").stdout
    # Bytecode that Python writes beside the code of a directory dep (vlm/models) changes no stage (.dvcignore)
    bytecode = project.path / "vlm" / "models" / "__pycache__" / "paligemma.cpython-311.pyc"
    bytecode.parent.mkdir(exist_ok=True)
    bytecode.write_bytes(b"\0")
    assert "up to date" in project.run("dvc", "status").stdout
    shutil.rmtree(bytecode.parent)
    _check_headline_metrics(project)
    project.run("git", "add", "-A")
    project.run("git", "commit", "-qm", "baseline")

    project.run("dvc", "exp", "run", "-S", "train.epochs=2", "-n", "two-epochs")
    show = json.loads(project.run("dvc", "exp", "show", "--json").stdout)
    baseline = next(entry for entry in show if entry["rev"] != "workspace")
    runs = {"baseline": baseline["data"]}
    for experiment in baseline["experiments"] or []:
        for rev in experiment["revs"]:
            runs[rev["name"]] = rev["data"]
    assert set(runs) == {"baseline", "two-epochs"}
    steps = {name: data["metrics"]["dvclive/vlm/metrics.json"]["data"]["step"] for name, data in runs.items()}
    for name, data in runs.items():
        assert data["params"]["params.yaml"]["data"]["train"]["epochs"] == (1 if name == "baseline" else 2)
        assert 0 <= data["metrics"]["metrics/eval.json"]["data"]["vlm"]["accuracy"] <= 1
    assert steps["baseline"] == baseline_steps < steps["two-epochs"]  # dvclive's step: the optimizer steps
    # `dvc exp run` leaves the experiment's results in the workspace: metrics diff against HEAD shows them.
    diff = json.loads(project.run("dvc", "metrics", "diff", "--json").stdout)
    assert diff["dvclive/vlm/metrics.json"]["step"]["old"] == steps["baseline"]
    assert diff["dvclive/vlm/metrics.json"]["step"]["new"] == steps["two-epochs"]
    for command in (("dvc", "metrics", "show"), ("dvc", "metrics", "diff")):  # every declared metric parses
        stderr = project.run(*command).stderr
        assert stderr.strip() == "", (command, stderr)
    plots = project.run("dvc", "plots", "show", "--json")
    assert plots.stderr.strip() == "", plots.stderr
    per_type = json.loads(plots.stdout)["data"]["metrics/eval/per_type.csv"][0]["content"]
    assert per_type["encoding"]["yOffset"]["field"] == "model"  # VLM and blind side by side, not stacked

    # Params are declared per key: the text-only baseline has no connector, so it is not retrained.
    out = project.run("dvc", "exp", "run", "-S", "model.connector=qformer", "-n", "qformer").stdout
    assert "Running stage 'train'" in out and "Running stage 'evaluate'" in out
    assert "Running stage 'train_blind'" not in out and "Running stage 'pack_hdf5'" not in out


def test_a_new_question_type_is_one_file_and_a_params_entry(reproduced, tmp_path):
    """docs/architecture.md's worked example: a file in vlm/commands/types and its entry under commands.types; the
    stages from generate_commands on re-run, and the new type is asked, trained, scored and drawn like the others."""
    project = reproduced.copy(tmp_path / "project")
    shutil.copy(Path(__file__).parent / "fixtures" / "vulnerable.py", project.path / "vlm/commands/types")
    params = yaml.safe_load((project.path / "params.yaml").read_text())
    params["commands"]["types"]["vulnerable"] = {}
    (project.path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = project.run("dvc", "repro", "evaluate").stdout
    for stage in ("generate_commands", "build_vocab", "pack_hdf5", "train", "train_blind", "evaluate"):
        assert f"Running stage '{stage}'" in out, stage
    assert "Running stage 'generate_scenes'" not in out
    asked = project.json("metrics/commands.json")["train"]["types"]
    assert set(asked["vulnerable"]["answers"]) == {"yes", "no"}
    evaluation = project.json("metrics/eval.json")
    assert 0 <= evaluation["vlm"]["per_type"]["vulnerable"] <= 1 and "vulnerable" in evaluation["blind"]["per_type"]
