"""Shared fixtures: the tiny params, the tiny projects built once per test session, and a tiny DVC project
reproduced once per test run.

`make test` runs ``pytest -n 2 --dist loadgroup``: each of the 2 worker processes has its own session, so a
session fixture is built once per worker that uses it. The users of ``tiny_project`` share an ``xdist_group``
(the whole group runs on one worker): it is built once per run. The DVC project (``reproduced``) is
reproduced once per run by whichever worker needs it first, in the run's temporary folder, and copied by
its users on either worker.
"""

from __future__ import annotations

import copy
import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline import DvcProject
from tiny_project import TINY_PIPELINE_PARAMS, TinyProject, build_project

ROOT = Path(__file__).resolve().parents[1]
LOCAL_FIXTURES = ROOT / "tests" / "fixtures" / "bdd100k"


@pytest.fixture
def bdd_fixture_dir() -> Path:
    """The real BDD100K label samples (a copy lives in tests/fixtures so a clean clone has them)."""
    return LOCAL_FIXTURES


@pytest.fixture
def tiny_params() -> dict:
    """A copy of the tiny params (tiny_project.TINY_PIPELINE_PARAMS) to change or write at will."""
    return copy.deepcopy(TINY_PIPELINE_PARAMS)


class _Unchanged:
    """A folder's files (path, size, modification time) when built, checked again at the end of the session:
    the tests that share a session build only read it. Paths under ``ignore`` (DVC's own state) are not."""

    def __init__(self, folder: Path, ignore: str | None = None):
        self.folder, self.ignore = folder, ignore
        self.files = self._files()

    def _files(self) -> dict[str, tuple[int, int]]:
        files = {p.relative_to(self.folder).as_posix(): p.stat() for p in self.folder.rglob("*") if p.is_file()}
        return {name: (stat.st_size, stat.st_mtime_ns) for name, stat in sorted(files.items())
                if not (self.ignore and name.startswith(self.ignore))}

    def check(self) -> None:
        assert self._files() == self.files, f"a test wrote into the shared {self.folder}: copy it first"


@pytest.fixture(scope="session")
def tiny_project(tmp_path_factory) -> TinyProject:
    """40 rendered scenes, questioned, tokenised and packed at 32 px (tiny_project.build_project), built once per
    worker that uses it; read only. Its users share ``xdist_group("tiny_project")``: one worker builds it."""
    project = build_project(tmp_path_factory.mktemp("tiny_project"))
    unchanged = _Unchanged(project.root)
    yield project
    unchanged.check()


@pytest.fixture(scope="session")
def colour_project(tmp_path_factory) -> TinyProject:
    """The hand-made colour frames (build_project(frames="colours")), packed; read only (copy_to to write)."""
    project = build_project(tmp_path_factory.mktemp("colour_project"), frames="colours")
    unchanged = _Unchanged(project.root)
    yield project
    unchanged.check()


@dataclass
class Reproduced:
    """A tiny DVC project right after its first `dvc repro` (uncommitted), and that run's output; read only."""

    project: DvcProject
    repro: str  # the stdout of `dvc repro`

    def copy(self, path: Path) -> DvcProject:
        """A copy of the project (git repository, DVC cache, outputs) at ``path``, to run DVC commands in."""
        shutil.copytree(self.project.path, path, symlinks=True)
        return DvcProject.existing(path, self.project.env)


@pytest.fixture(scope="session")
def reproduced(tmp_path_factory) -> Reproduced:
    """`dvc repro` of the whole pipeline on the tiny params, once per test run: the first worker that needs it
    reproduces it in the run's temporary folder (shared by the xdist workers) while the other waits on a
    lock; its users copy it."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    path, out = shared / "reproduced", shared / "reproduced.out"
    with open(shared / "reproduced.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():  # written once the run has finished
            shutil.rmtree(path, ignore_errors=True)  # an earlier attempt that failed
            out.write_text(DvcProject(path, TINY_PIPELINE_PARAMS).run("dvc", "repro").stdout)
    unchanged = _Unchanged(path, ignore=".dvc/tmp/")
    yield Reproduced(DvcProject.existing(path), out.read_text())
    unchanged.check()
