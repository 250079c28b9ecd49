"""A throw-away copy of the project in a temporary git repository, to run real DVC commands on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("dvc.yaml", "params.yaml", "stages", "vlm", ".dvcignore", "data/bdd100k/README.md",
          "metrics/real_frames.json")  # `make real`'s committed measurement: a source of the model card


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _merge(base.get(key, {}), value) if nested else value
    return out


class DvcProject:
    def __init__(self, path: Path, params: dict):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        for name in COPIED:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, path / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                (path / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src, path / name)
        base = yaml.safe_load((ROOT / "params.yaml").read_text())
        (path / "params.yaml").write_text(yaml.safe_dump(_merge(base, params), sort_keys=False))
        self.env = self.environment(path)
        self.run("git", "init", "-q")
        self.run("dvc", "init", "-q")
        shutil.copytree(ROOT / ".dvc" / "plots", path / ".dvc" / "plots")  # the project's plot templates
        self.run("git", "add", "-A")
        self.run("git", "commit", "-qm", "init")

    @staticmethod
    def environment(path: Path) -> dict[str, str]:
        """The environment of DVC and git commands in the project at ``path`` (its code first on the path)."""
        bin_dir = str(Path(sys.executable).parent)
        return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
                "PYTHONPATH": str(path), "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "DVC_NO_ANALYTICS": "1"}

    @classmethod
    def existing(cls, path: Path, env: dict | None = None) -> DvcProject:
        """A handle on a checkout that already exists (a clone or a copy), with the same environment as
        ``env`` (by default a new project's)."""
        project = cls.__new__(cls)
        project.path, project.env = path, {**(env or cls.environment(path)), "PYTHONPATH": str(path)}
        return project

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(args, cwd=self.path, env=self.env, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def json(self, relative: str):
        return json.loads((self.path / relative).read_text())
