"""dvc.yaml is the one place that names each stage's sources: every project file a stage imports is a
declared dependency, and every declared source is imported."""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dvc_graph import ROOT, import_closure, stage_module

STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def _source_deps(stage: dict) -> list[str]:
    """The stage's declared code: files and folders under vlm/ and stages/ but the data files there (a .json the
    code reads, as the renderer's statistics)."""
    return [d for d in stage["deps"] if d.split("/")[0] in ("vlm", "stages") and Path(d).suffix in ("", ".py")]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_imported_project_file_is_a_declared_dependency(name):
    stage = STAGES[name]
    imported = {str(path.relative_to(ROOT)) for path in import_closure(stage_module(stage["cmd"]))}
    declared = _source_deps(stage)
    missing = sorted(f for f in imported if not any(f == d or f.startswith(d.rstrip("/") + "/") for d in declared))
    assert not missing, f"{name} imports {missing} but dvc.yaml does not list them as deps"
    stale = [d for d in declared if not any(f == d or f.startswith(d.rstrip("/") + "/") for f in imported)]
    assert not stale, f"{name} lists {stale} as deps but never imports them"


def test_the_pack_stage_imports_the_image_size_rules_not_the_model():
    """A change to the decoder, the connector or the perception must not re-pack the images: of the model code the
    pack stage imports the image size rules and what they read a checkpoint's patch size with."""
    imported = {str(path.relative_to(ROOT)) for path in import_closure(stage_module(STAGES["pack_hdf5"]["cmd"]))}
    models = sorted(f for f in imported if f.startswith("vlm/models/"))
    assert models == ["vlm/models/__init__.py", "vlm/models/attention.py", "vlm/models/image_size.py",
                      "vlm/models/pretrained.py", "vlm/models/siglip.py"]


def _committed_outputs(stage: dict) -> set[str]:
    """A stage's outputs that git holds (``cache: false``: metrics, plots, dvclive's folders), not DVC's cache."""
    entries = [*(stage.get("outs") or []), *(stage.get("metrics") or []), *(stage.get("plots") or [])]
    return {next(iter(e)) for e in entries if isinstance(e, dict) and next(iter(e.values())).get("cache") is False}


@pytest.mark.xdist_group("repository_dvc")  # one DVC command at a time in the repository (its lock)
def test_the_committed_lock_is_a_run_of_this_code_and_these_params():
    """`dvc status` finds no stage whose command, source files or params differ from dvc.lock's, nor a committed
    output (a metric, a plot) that differs from the file the run wrote: the lock and the metrics beside it come from
    running this code, none edited by hand. Data and models are absent in a clone, another run's in a workspace:
    not checked here."""
    dvc = Path(sys.executable).parent / "dvc"
    status = json.loads(subprocess.run([str(dvc), "status", "--json"], cwd=ROOT, check=True, capture_output=True,
                                       text=True).stdout)
    stale = {}
    for name, changes in status.items():
        for change in changes:
            if not isinstance(change, dict):  # "changed command"
                stale.setdefault(name, []).append(change)
                continue
            deps, outs = change.get("changed deps", {}), change.get("changed outs", {})
            stale.setdefault(name, []).extend(f"{path}: {state}" for path, state in deps.items()
                                              if path.split("/")[0] in ("vlm", "stages") or path == "params.yaml")
            stale[name].extend(f"{path}: {state}" for path, state in outs.items()
                               if path in _committed_outputs(STAGES[name]))
    stale = {name: changes for name, changes in stale.items() if changes}
    assert not stale, f"dvc.lock and the committed outputs are not a run of this code and params.yaml: {stale}"


def test_stages_run_as_modules_with_their_paths_in_the_command():
    for name, stage in STAGES.items():
        assert stage["cmd"].startswith("python -m stages."), name  # the checkout's code, not an installed one


@pytest.mark.parametrize(("name", "section"), [("evaluate", "evaluate"), ("profile_dataloader", "profile")])
def test_a_stage_that_reads_a_chosen_split_depends_on_that_splits_images(name, section):
    """`evaluate.split` and `profile.split` pick the HDF5 file the stage reads: its dep is that file, templated from
    the param, so another split is tracked (and the default's path, and so the lock, is the same)."""
    assert f"data/processed/${{{section}.split}}_images.h5" in _paths(STAGES[name]["deps"])


def _paths(entries) -> list[str]:
    """The paths of a `deps`/`outs`/`metrics`/`plots` list (an entry is a path or `{path: options}`)."""
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries or []]


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# Paths a stage writes that are deliberately not DVC outputs (an output is deleted before its stage runs).
UNTRACKED = {
    "models/checkpoints": "train's resume checkpoints: they must survive a killed run (a queued experiment's too: "
                          "they go to the repository, DVC_ROOT) to resume it",
}


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_data_path_is_named_in_the_command(name):
    """The paths a stage reads and writes reach it through `cmd` (stage scripts have no path defaults): each
    data dep and each output is a path of the command or inside one, and each path of the command is used."""
    stage = STAGES[name]
    words = shlex.split(stage["cmd"])
    arguments = [w for w in words[3:] if not w.startswith("-")]
    outs = _paths(stage.get("outs")) + _paths(stage.get("metrics")) + _paths(stage.get("plots"))
    # A `${...}` dep is a path set in params.yaml (the BDD100K folder), templated by DVC: not a cmd argument.
    data = [d for d in _paths(stage["deps"]) if d not in _source_deps(stage) and "${" not in d]
    unnamed = [p for p in data + outs if not any(_under(p, a) for a in arguments)]
    assert not unnamed, f"{name}: {unnamed} are deps/outs that its cmd does not name"
    unused = [a for a in arguments if a not in UNTRACKED and not any(_under(p, a) for p in data + outs)]
    assert not unused, f"{name}: its cmd names {unused}, neither a dep nor an output"


SCRIPTS = sorted({str(stage_module(stage["cmd"]).relative_to(ROOT)) for stage in STAGES.values()})


@pytest.mark.parametrize("script", SCRIPTS)
def test_stage_scripts_take_their_paths_as_required_arguments(script):
    """No path defaults in a stage script: dvc.yaml's cmd is the one place that names them (``--params`` and
    flags excepted)."""
    for node in ast.walk(ast.parse((ROOT / script).read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
            continue
        option = node.args[0].value
        keywords = {k.arg: k.value for k in node.keywords}
        if option == "--params" or getattr(keywords.get("action"), "value", "").startswith("store_"):
            continue
        assert "default" not in keywords, f"{script}: {option} has a default; name the path in dvc.yaml's cmd"
        assert option.startswith("--") and getattr(keywords.get("required"), "value", False) is True, (
            f"{script}: {option} must be a required option")
