"""dvc.yaml is the one place that names each stage's sources: every project file a stage imports is a
declared dependency, and every declared source is imported."""

from __future__ import annotations

import pytest
import yaml

from dvc_graph import ROOT, import_closure, stage_module

STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def _source_deps(stage: dict) -> list[str]:
    return [d for d in stage["deps"] if d.split("/")[0] in ("vlm", "stages")]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_imported_project_file_is_a_declared_dependency(name):
    stage = STAGES[name]
    imported = {str(path.relative_to(ROOT)) for path in import_closure(stage_module(stage["cmd"]))}
    declared = _source_deps(stage)
    missing = sorted(f for f in imported if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in declared))
    assert not missing, f"{name} imports {missing} but dvc.yaml does not list them as deps"
    stale = [d for d in declared if not any(f == d or f.startswith(d.rstrip("/") + "/") for f in imported)]
    assert not stale, f"{name} lists {stale} as deps but never imports them"


def test_stages_run_as_modules_with_their_paths_in_the_command():
    for name, stage in STAGES.items():
        assert stage["cmd"].startswith("python -m stages."), name  # the checkout's code, not an installed one

