"""Real kills: every stage started as a subprocess and SIGKILLed at seeded moments (early, in the middle, and
just before its main output is moved into place), as `dvc repro` runs it (its outputs deleted first).

After each kill, every output that exists is byte-identical to an uninterrupted run's (a killed stage leaves
nothing half-written that looks valid); re-running finishes with byte-identical outputs and no temporaries
left (the same weights for train, which resumes from its checkpoint). The last test kills `dvc repro` itself:
`dvc status` then reports the stage as changed, never as up to date. Two `dvc repro` at once: DVC's lock.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from pipeline import DvcProject

pytestmark = [pytest.mark.pipeline, pytest.mark.xdist_group("kills")]  # one worker copies the project

HOOK = Path(__file__).resolve().parent / "killhook"
# The stage's main output, written last or nearly: the hook kills the stage just before it is moved into place.
FINAL_WRITE = {
    "generate_scenes": "data/raw",
    "generate_commands": "data/processed/commands",
    "build_vocab": "data/processed/vocab.json",
    "pack_hdf5": "data/processed/test_images.h5",
    "train": "models/vlm.pt",
    "evaluate": "metrics/eval.json",
}
# Outputs that legitimately differ between two runs (wall-clock seconds): checked to exist, not compared.
TIMINGS = {"metrics/train_timing.json", "metrics/scenes.json", "metrics/pack.json"}
# Training's dvclive curves are live: a killed run leaves them as far as it got (what `dvc exp show` showed),
# so they are compared only once a run has finished.
LIVE = "dvclive/"
TIME_FRACTIONS = (0.3, 0.7)  # of the uninterrupted run's wall time: start-up and reading, then the work


@pytest.fixture(scope="module")
def project(reproduced, tmp_path_factory):
    """A copy of the tiny project after `dvc repro` (tests/conftest.py), its stages started with the test hook."""
    project = reproduced.copy(tmp_path_factory.mktemp("kills") / "project")
    project.env["PYTHONPATH"] = os.pathsep.join([str(project.path), str(HOOK)])
    project.stages = yaml.safe_load((project.path / "dvc.yaml").read_text())["stages"]
    return project


def _outs(stage: dict) -> list[str]:
    entries = [*stage.get("outs", []), *stage.get("plots", [])]
    return [e if isinstance(e, str) else next(iter(e)) for e in entries]


def _snapshot(root: Path, outs: list[str]) -> dict[str, bytes]:
    """Every file of the outputs that exist, by path (temporaries are not outputs)."""
    files = {}
    for out in outs:
        path = root / out
        for file in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
            files[file.relative_to(root).as_posix()] = file.read_bytes()
    return files


def _comparable(files: dict[str, bytes], finished: bool = True) -> dict[str, bytes]:
    return {k: v for k, v in files.items() if k not in TIMINGS and (finished or not k.startswith(LIVE))}


def _temporaries(root: Path, outs: list[str]) -> list[Path]:
    folders = {(root / out).parent for out in outs}
    return sorted(p for folder in folders if folder.is_dir() for p in folder.glob(".*.tmp"))


def _remove(root: Path, outs: list[str]) -> None:
    """What `dvc repro` does before it runs a stage."""
    for out in outs:
        path = root / out
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def _start(project: DvcProject, cmd: str, **env: str) -> subprocess.Popen:
    """``cmd`` in its own process group (``exec``: the stage is the process, not a shell around it)."""
    return subprocess.Popen(f"exec {cmd}", shell=True, cwd=project.path, env={**project.env, **env},
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_after(process: subprocess.Popen, seconds: float) -> None:
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.mark.parametrize("name", list(FINAL_WRITE))
def test_a_killed_stage_leaves_no_wrong_output_and_reruns_to_the_same_bytes(project, name):
    stage = project.stages[name]
    outs = _outs(stage)
    reference = _snapshot(project.path, outs)
    assert reference and all(any(f == o or f.startswith(o + "/") for f in reference) for o in outs)
    checkpoints = project.path / "models" / "checkpoints"
    if name == "train":  # a finished run removed its resume checkpoint: this one trains from scratch
        assert not list(checkpoints.glob("*.pt"))

    _remove(project.path, outs)
    start = time.perf_counter()
    uninterrupted = _start(project, stage["cmd"])
    assert uninterrupted.wait() == 0, uninterrupted.stderr.read()
    wall = time.perf_counter() - start
    assert _comparable(_snapshot(project.path, outs)) == _comparable(reference)
    if name == "train":  # the killed runs below start from scratch too
        assert not list(checkpoints.glob("*.pt"))

    for fraction in TIME_FRACTIONS:
        _remove(project.path, outs)
        _kill_after(_start(project, stage["cmd"]), fraction * wall)
        left = _comparable(_snapshot(project.path, outs), finished=False)
        assert left == {k: reference[k] for k in left}, f"{name}: a killed run left an output that differs"

    _remove(project.path, outs)
    killed = _start(project, stage["cmd"], VLM_TEST_KILL_BEFORE_REPLACE=FINAL_WRITE[name])
    assert killed.wait() == -signal.SIGKILL  # the hook fired: killed in the final write
    assert not (project.path / FINAL_WRITE[name]).exists()
    assert _temporaries(project.path, outs), "the killed write should have left its temporary"
    left = _comparable(_snapshot(project.path, outs), finished=False)
    assert left == {k: reference[k] for k in left}

    _remove(project.path, outs)
    rerun = _start(project, stage["cmd"])
    assert rerun.wait() == 0, rerun.stderr.read()
    after = _snapshot(project.path, outs)
    assert _comparable(after) == _comparable(reference) and set(after) == set(reference)
    assert _temporaries(project.path, outs) == []


def test_two_dvc_repro_at_once(project, tmp_path):
    """A second `dvc repro` in the same workspace while the first runs a stage: DVC's lock stops it; the
    first finishes and its outputs and dvc.lock are intact."""
    processed = project.path / "data" / "processed"
    # once its stage is writing, the first holds the lock until the second has given up (past DVC's few seconds
    # of retrying), 60 s at most
    resume = tmp_path / "resume"
    first = _start(project, "dvc repro -f -s pack_hdf5", VLM_TEST_PAUSE_BEFORE_REPLACE="train_images.h5:60",
                   VLM_TEST_RESUME_FILE=str(resume))
    deadline = time.monotonic() + 120
    while not list(processed.glob(".*_images.h5.*.tmp")) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert first.poll() is None, "the first dvc repro should still be running"
    second = project.run("dvc", "repro", "-f", "-s", "pack_hdf5", check=False)
    assert first.poll() is None, "the first dvc repro should still hold the lock"
    assert second.returncode != 0 and "lock" in (second.stdout + second.stderr).lower()
    resume.touch()
    assert first.wait() == 0, first.stderr.read()
    assert "up to date" in project.run("dvc", "status", "pack_hdf5").stdout
    assert list(processed.glob(".*.tmp")) == []


def test_a_killed_dvc_repro_leaves_the_stage_changed(project):
    """`dvc repro` whose stage dies in its final write, then `dvc repro` SIGKILLed as a whole: each time
    `dvc status` reports the stage as changed; a plain `dvc repro` then finishes it cleanly."""
    params = yaml.safe_load((project.path / "params.yaml").read_text())
    params["pack"]["image_size"] = 48
    (project.path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    processed = project.path / "data" / "processed"

    killed = subprocess.run(["dvc", "repro", "pack_hdf5"], cwd=project.path, capture_output=True, text=True,
                            env={**project.env, "VLM_TEST_KILL_BEFORE_REPLACE": "data/processed/val_images.h5"})
    assert killed.returncode != 0
    status = project.run("dvc", "status", "pack_hdf5").stdout
    assert "pack_hdf5:" in status and "up to date" not in status

    repro = _start(project, "dvc repro pack_hdf5")  # killed, dvc and all, while the stage writes a file
    deadline = time.monotonic() + 120
    while not list(processed.glob(".*_images.h5.*.tmp")) and repro.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    _kill_after(repro, 0)
    assert repro.returncode == -signal.SIGKILL
    status = project.run("dvc", "status", "pack_hdf5").stdout
    assert "pack_hdf5:" in status and "up to date" not in status

    project.run("dvc", "repro", "pack_hdf5")
    assert "up to date" in project.run("dvc", "status", "pack_hdf5").stdout
    assert list(processed.glob(".*.tmp")) == []
