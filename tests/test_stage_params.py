"""Every stage reads exactly the params dvc.yaml declares for it, and the runtime section, which no stage declares.

Each stage's module runs in-process, in dvc.yaml's order, with the arguments of its `cmd`, on a tiny project
in a temporary folder; ``vlm.params.recording_reads`` collects the keys it reads. A declared key covers its
sub-keys (``model.gemma`` covers ``model.gemma.hidden_size``). A stage that reads an undeclared key does not
re-run when that key changes; a declared key it never reads re-runs it for nothing. ``runtime.*`` (speed only)
is read undeclared, so that changing it re-runs nothing: checked with `dvc status` on the tiny reproduced project.
"""

from __future__ import annotations

import importlib
import json
import shlex
import shutil
import sys
import traceback
from pathlib import Path

import pytest
import yaml

from dvc_graph import ROOT
from pipeline import _merge
from tiny_project import TINY_PIPELINE_PARAMS as TINY_PARAMS
from vlm.params import recording_reads

pytestmark = pytest.mark.xdist_group("stage_params")  # one worker runs the stages once for all the tests

STAGES = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def declared_params(stage: dict) -> list[str]:
    """The dotted keys of a stage's `params:` (a plain entry is in params.yaml; `{file: [keys]}` too)."""
    keys = []
    for entry in stage.get("params", []):
        keys.extend([entry] if isinstance(entry, str) else [k for ks in entry.values() for k in ks])
    return keys


def covered(key: str, by: str) -> bool:
    return key == by or key.startswith(by + ".")


RUNTIME = "runtime"  # params.yaml's speed-only section: read by the stages, declared by none


def _outputs(stage: dict) -> set[str]:
    return {next(iter(o)) if isinstance(o, dict) else o for o in stage.get("outs", [])}


def _upstream(name: str) -> set[str]:
    """The stages whose outputs ``name`` depends on."""
    return {other for other, stage in STAGES.items() if other != name for out in _outputs(stage)
            for dep in STAGES[name].get("deps", [])
            if dep == out or dep.startswith(out + "/") or out.startswith(dep + "/")}


def _order() -> list[str]:
    """The stages, each after those it depends on."""
    done: list[str] = []

    def visit(name: str) -> None:
        if name not in done:
            for upstream in sorted(_upstream(name)):
                visit(upstream)
            done.append(name)

    for name in STAGES:
        visit(name)
    return done


@pytest.fixture(scope="module")
def stage_reads(tmp_path_factory) -> dict[str, set[str] | str]:
    """Per stage: the keys it read, or why it did not finish (its error, or a failed upstream stage)."""
    workdir = tmp_path_factory.mktemp("stages")
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    (workdir / "params.yaml").write_text(yaml.safe_dump(_merge(base, TINY_PARAMS), sort_keys=False))
    for data in {d for stage in STAGES.values() for d in stage["deps"] if d.startswith("vlm/") and Path(d).suffix
                 not in ("", ".py")}:  # the data files the code reads from the project (the renderer's statistics)
        (workdir / data).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / data, workdir / data)
    mp = pytest.MonkeyPatch()
    mp.chdir(workdir)
    results: dict[str, set[str] | str] = {}
    try:
        for name in _order():
            words = shlex.split(STAGES[name]["cmd"])
            assert words[:2] == ["python", "-m"], name
            failed = sorted(u for u in _upstream(name) if isinstance(results[u], str))
            if failed:
                results[name] = f"{name} not run: its upstream stages {failed} failed"
                continue
            mp.setattr(sys, "argv", [words[2], *words[3:]])
            try:
                with recording_reads() as reads:
                    importlib.import_module(words[2]).main()
                results[name] = reads
            except (Exception, SystemExit):  # reported by this stage's test; the others go on
                results[name] = f"{name} failed:\n{traceback.format_exc()}"
    finally:
        mp.undo()
    return results


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_reads_exactly_its_declared_params(name, stage_reads):
    reads = stage_reads[name]
    if isinstance(reads, str):
        pytest.fail(reads)
    declared = declared_params(STAGES[name])
    assert not [d for d in declared if covered(d, RUNTIME)], f"{name} declares runtime settings: a change re-runs it"
    reads = {k for k in reads if not covered(k, RUNTIME)}
    assert reads, f"{name} read no params"
    undeclared = sorted(k for k in reads if not any(covered(k, d) for d in declared))
    assert not undeclared, f"{name} reads {undeclared}, not in its dvc.yaml params: a change would not re-run it"
    unread = [d for d in declared if not any(covered(k, d) for k in reads)]
    assert not unread, f"{name} declares {unread} in dvc.yaml but never reads them: a change re-runs it for nothing"
    leaves = _leaves(_merge(yaml.safe_load((ROOT / "params.yaml").read_text()), TINY_PARAMS))
    partly = {d: sorted(k for k in reads if covered(k, d)) for d in declared
              if not all(k in reads for k in leaves if covered(k, d))}
    assert not partly, f"{name} reads only part of what it declares: declare these keys instead: {partly}"


def _leaves(params, prefix: str = "") -> set[str]:
    """The dotted keys of the values of a params mapping (a list is one value, an empty mapping none)."""
    if not isinstance(params, dict):
        return {prefix}
    return set().union(set(), *(_leaves(value, f"{prefix}.{key}" if prefix else key)
                                for key, value in params.items()))


def test_every_runtime_setting_is_read_by_a_stage(stage_reads):
    failed = [reads for reads in stage_reads.values() if isinstance(reads, str)]
    if failed:
        pytest.skip("a stage failed (its own test reports it)")
    read = set().union(*stage_reads.values())
    settings = _leaves({RUNTIME: yaml.safe_load((ROOT / "params.yaml").read_text())[RUNTIME]})
    assert settings and sorted(settings - read) == []


@pytest.mark.pipeline
def test_changing_runtime_settings_leaves_every_stage_up_to_date(reproduced, tmp_path):
    """`dvc status` after the tiny `dvc repro` (tests/conftest.py): every runtime value changed, nothing is to do;
    a changed stage param still shows its stage, and only the stages that declare the key."""
    project = reproduced.copy(tmp_path / "project")
    params_path = project.path / "params.yaml"
    params = yaml.safe_load(params_path.read_text())
    changed = {"scenes": {"workers": 1}, "pack": {"workers": 2, "chunksize": 3},
               "train": {"threads": 2, "num_workers": 1, "eval_batch_size": 7, "checkpoint_every": 5,
                         "in_memory": False, "in_memory_budget_mb": 10, "compile": True}}
    assert _leaves(changed) == _leaves(params[RUNTIME])  # every setting
    assert all(params[RUNTIME][s][k] != v for s, values in changed.items() for k, v in values.items())
    params_path.write_text(yaml.safe_dump(_merge(params, {RUNTIME: changed}), sort_keys=False))
    status = project.run("dvc", "status")
    assert "Data and pipelines are up to date." in status.stdout, status.stdout

    # train no longer declares train.blind_epochs, nor counterfactuals commands.seed; the model card prints every
    # param the model depends on (whole sections), so it is written again
    params_path.write_text(yaml.safe_dump(_merge(params, {RUNTIME: changed, "train": {"blind_epochs": 2},
                                                          "commands": {"seed": 1}}), sort_keys=False))
    status = json.loads(project.run("dvc", "status", "--json").stdout)
    assert set(status) == {"train_blind", "generate_commands", "model_card"}, status
