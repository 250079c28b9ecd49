"""Queued experiments: each runs the code it was queued with, not the workspace's (`python -m stages.<name>` puts
the experiment's own copy of the repository first on the import path); a killed one, queued again, resumes its
training (its checkpoints live in the repository, not in the temporary copy DVC deletes)."""

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from pipeline import DvcProject

pytestmark = pytest.mark.pipeline

MARKER = '''

_train_timing = train_timing


def train_timing(*args, **kwargs):  # the queued code marks its timing file
    return {**_train_timing(*args, **kwargs), "marker": "queued code"}
'''


def _run_queue(project: DvcProject, *options: str, timeout: float = 240) -> str:
    """Start a queue worker and wait until nothing is queued or running; `dvc queue status`'s last output. (The
    worker inherits `dvc queue start`'s output pipes, so that call itself returns when the worker is done.)"""
    project.run("dvc", "queue", "start", *options)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = project.run("dvc", "queue", "status").stdout
        if "Queued" not in status and "Running" not in status:
            break
        time.sleep(1)
    return status


def _experiment(project: DvcProject, name: str) -> str:
    """The commit of the finished experiment ``name`` (its ref, refs/exps/<baseline>/<name>)."""
    refs = project.run("git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps").stdout.split("\n")
    return next(line.split()[1] for line in refs if line.split(" ")[0].endswith(f"/{name}"))


def _model_md5(dvc_lock: str) -> str:
    outs = yaml.safe_load(dvc_lock)["stages"]["train"]["outs"]
    return next(out["md5"] for out in outs if out["path"] == "models/vlm.pt")


HOOK = Path(__file__).resolve().parent / "killhook"


def test_a_queued_experiment_runs_its_own_code_and_resumes_when_killed(reproduced, tmp_path):
    """The tiny `dvc repro` (tests/conftest.py), committed; its train stage queued twice with the same params
    (`-f -s train`, so the uninterrupted run is the baseline's) and code that marks its timing file, the workspace's
    code restored before the queue runs. The test hook kills the first run just after its first resume checkpoint;
    the second, run after it by the same worker, resumes from that checkpoint, which outlived the first's temporary
    copy of the repository (it is in the repository's models/checkpoints), and ends with the baseline's model, byte
    for byte, and the queued code's mark; finished, it removes the checkpoint."""
    project = reproduced.copy(tmp_path / "project")
    project.run("git", "add", "-A")
    project.run("git", "commit", "-qm", "baseline")
    baseline = _model_md5((project.path / "dvc.lock").read_text())
    armed = tmp_path / "armed"  # the hook kills once: the first run
    armed.touch()
    # not the project on the path: the installed package points at the developer's checkout, not this one
    project.env.update(PYTHONPATH=str(HOOK), VLM_TEST_KILL_AFTER_REPLACE="models/checkpoints/vlm-",
                       VLM_TEST_KILL_ARMED=str(armed))
    source = project.path / "vlm" / "train.py"
    original = source.read_text()
    source.write_text(original + MARKER)
    for name in ("killed", "resumed"):  # a checkpoint every 3 steps: a speed setting, the same fingerprint
        project.run("dvc", "exp", "run", "--queue", "-f", "-s", "train", "-S", "runtime.train.checkpoint_every=3",
                    "-n", name)
    source.write_text(original)  # the workspace goes back before the queue runs
    status = _run_queue(project, "--jobs", "1")
    assert not armed.exists(), "the hook did not kill the first run"
    assert [line.split()[1:2] + line.split()[-1:] for line in status.splitlines()[1:3]] == \
        [["killed", "Failed"], ["resumed", "Success"]], status
    log = project.run("dvc", "queue", "logs", "resumed").stdout
    checkpoints = project.path.resolve() / "models" / "checkpoints"
    assert f"resuming vlm from {checkpoints}{os.sep}vlm-" in log and "batch 3, step 3" in log, log
    resumed = _experiment(project, "resumed")
    assert _model_md5(project.run("git", "show", f"{resumed}:dvc.lock").stdout) == baseline
    assert json.loads(project.run("git", "show", f"{resumed}:metrics/train_timing.json").stdout)["marker"] \
        == "queued code"
    assert not list(checkpoints.iterdir())  # the finished run removed it
