"""The whole pipeline through real DVC on tiny params: `dvc repro`, then `dvc exp run -S`."""

import json
import shlex
from pathlib import Path

import pytest
import yaml

from pipeline import DvcProject
from tiny_project import TINY_MODEL

pytestmark = [pytest.mark.pipeline, pytest.mark.xdist_group("pipeline")]

TINY_PARAMS = {
    "scenes": {"num_images": 48, "workers": 2},
    "commands": {"questions_per_image": 6},
    "pack": {"image_size": 32, "workers": 1},
    "model": TINY_MODEL,
    "train": {"epochs": 1, "batch_size": 16, "lr": 0.003, "warmup_steps": 2, "threads": 1},
    "evaluate": {"attention_examples": 2, "failure_examples": 2},
    "profile": {"workers": [0], "batch_sizes": [32], "extra_image_sizes": [48], "warmup_batches": 1, "batches": 2,
                "rounds": 1, "max_images": 16},
}


def _check_declared_params(project: DvcProject, log: Path) -> None:
    """Each stage read exactly the param keys dvc.yaml declares for it (a declared key covers its sub-keys)."""
    stages = yaml.safe_load((project.path / "dvc.yaml").read_text())["stages"]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    for name, stage in stages.items():
        argv = shlex.split(stage["cmd"])[3:]  # after `python -m stages.<name>`
        reads = set().union(*(set(run["reads"]) for run in runs if run["argv"] == argv))
        declared = stage["params"]
        assert reads, name

        def covered(key, by):
            return key == by or key.startswith(by + ".")
        assert not [k for k in reads if not any(covered(k, d) for d in declared)], (name, "reads undeclared params")
        assert not [d for d in declared if not any(covered(k, d) for k in reads)], (name, "declares unread params")


def test_repro_then_experiment(tmp_path):
    project = DvcProject(tmp_path / "project", TINY_PARAMS)
    log = tmp_path / "params-read.jsonl"
    project.env["VLM_PARAMS_READ_LOG"] = str(log)
    out = project.run("dvc", "repro")
    _check_declared_params(project, log)
    for stage in ("generate_scenes", "generate_commands", "build_vocab", "pack_hdf5", "train", "train_blind",
                  "evaluate", "profile_dataloader"):
        assert f"Running stage '{stage}'" in out.stdout, stage
    evaluation = project.json("metrics/eval.json")
    assert {"vlm", "blind", "gain_from_vision"} <= set(evaluation)
    assert project.json("metrics/train.json")["epochs"] == 1
    assert "up to date" in project.run("dvc", "status").stdout
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
    for name, data in runs.items():
        epochs = data["params"]["params.yaml"]["data"]["train"]["epochs"]
        assert data["metrics"]["metrics/train.json"]["data"]["epochs"] == epochs == (1 if name == "baseline" else 2)
        assert 0 <= data["metrics"]["metrics/eval.json"]["data"]["vlm"]["accuracy"] <= 1
    # `dvc exp run` leaves the experiment's results in the workspace: metrics diff against HEAD shows them.
    diff = json.loads(project.run("dvc", "metrics", "diff", "--json").stdout)
    assert diff["metrics/train.json"]["epochs"] == {"old": 1, "new": 2, "diff": 1}
    for command in (("dvc", "metrics", "show"), ("dvc", "metrics", "diff")):  # every declared metric parses
        assert "failed to load" not in project.run(*command).stderr.lower(), command

    # Params are declared per key: the text-only baseline has no connector, so it is not retrained.
    out = project.run("dvc", "exp", "run", "-S", "model.connector=qformer", "-n", "qformer").stdout
    assert "Running stage 'train'" in out and "Running stage 'evaluate'" in out
    assert "Running stage 'train_blind'" not in out and "Running stage 'pack_hdf5'" not in out
