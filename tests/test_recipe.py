"""The GPU recipe (``recipes/gpu.yaml``, ``make gpu``): its ``-S`` flags, and its switches trained at tiny sizes on
the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tiny_project import FRAME_SIZE, TINY_MODEL, paths_for
from vlm import recipe
from vlm.config import ParamError, build_config
from vlm.data.h5file import PackedImageReader
from vlm.recipe import apply, flags
from vlm.train import TrainConfig, TrainRuntime, train

pytestmark = pytest.mark.xdist_group("tiny_project")  # one worker builds the shared tiny project

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "gpu.yaml"
# What makes the recipe tiny: its sizes; its switches (packed questions, the optimizer, ...) stay. No compiling on
# the CPU (tests/test_train.py has a CUDA-marked test of it), one DataLoader worker.
TINY_SIZES = {"pack": {"image_size": 32}, "model": {"siglip": TINY_MODEL["siglip"], "gemma": TINY_MODEL["gemma"]},
              "train": {"epochs": 1, "batch_size": 16, "warmup_steps": 2},
              "runtime": {"train": {"threads": 1, "num_workers": 1, "compile": False}}}


def _merge(base: dict, changes: dict) -> dict:
    return {**base, **{key: _merge(base.get(key, {}), value) if isinstance(value, dict) else value
                       for key, value in changes.items()}}


def test_flags_are_params_keys_and_a_typo_stops(tmp_path):
    made = flags(RECIPE, ROOT / "params.yaml")
    assert "--set-param=model.pack_questions=true" in made and "--set-param=train.batch_size=512" in made
    assert "--set-param=pack.aspect=native" in made and all(" " not in flag for flag in made)
    value = tmp_path / "value.yaml"  # a mapping that params.yaml holds as one value is one flag, which replaces it
    value.write_text("commands:\n  holdout: {weather: rainy, timeofday: night}\n")
    assert flags(value, ROOT / "params.yaml") == ["--set-param=++commands.holdout={weather:rainy,timeofday:night}"]
    strings = tmp_path / "strings.yaml"  # strings that Hydra's grammar would read as others are quoted
    strings.write_text("pack:\n  aspect: 'null'\n  resample: \"it's 1, 2\"\n")
    assert flags(strings, ROOT / "params.yaml") == ["--set-param=pack.aspect='null'",
                                                    "--set-param=pack.resample='it\\'s 1, 2'"]
    small = tmp_path / "small.yaml"  # DVC writes it as 5e-05, which is read back as the number (YAML 1.2)
    small.write_text("train:\n  lr: 0.00005\n")
    assert flags(small, ROOT / "params.yaml") == ["--set-param=train.lr=5e-05"]
    for text, error in [("train:\n  epoch: 3\n", r"train.epoch: not a key of params.yaml"),
                        ("train: 5\n", r"train: a section of params.yaml: give its keys, not 5"),
                        ("train: [\n", r"not valid YAML"),
                        ("- 1\n", r"must be a mapping of params.yaml's sections")]:
        typo = tmp_path / "typo.yaml"
        typo.write_text(text)
        with pytest.raises(ParamError, match=rf"typo.yaml: {error}"):
            flags(typo, ROOT / "params.yaml")


def test_a_flag_dvc_would_read_otherwise_stops(tmp_path, monkeypatch):
    """Each flag is applied by DVC's own ``-S`` parser to a copy of params.yaml and must give the recipe's value."""
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text("pack:\n  aspect: 'null'\n")
    monkeypatch.setattr(recipe, "hydra_value", str)  # unquoted, Hydra reads null
    with pytest.raises(ParamError, match=r"recipe.yaml: pack.aspect: DVC would set None, not the recipe's 'null'"):
        flags(recipe_file, ROOT / "params.yaml")
    monkeypatch.setattr(recipe, "hydra_value", lambda value: '{"a":1}')  # JSON: not Hydra's grammar
    with pytest.raises(ParamError, match=r"recipe.yaml: --set-param=pack.aspect=\{\"a\":1\}: DVC cannot apply it"):
        flags(recipe_file, ROOT / "params.yaml")


def test_run_starts_dvc_exp_run_only_with_every_key_checked_and_a_gpu_when_asked(tmp_path, monkeypatch):
    """``--run`` (``make gpu``) replaces itself by ``dvc exp run`` with the recipe's flags and the arguments after
    ``--``; a typo or, with ``--needs-cuda``, no GPU stops it first (``dvc exp run $(...)`` ran the defaults)."""
    started = []
    monkeypatch.setattr(recipe.os, "execvp", lambda file, args: started.append(args))
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    params = str(ROOT / "params.yaml")
    recipe.main([str(RECIPE), "--params", params, "--run", "--", "-S", "train.epochs=16"])
    assert started == [["dvc", "exp", "run", *flags(RECIPE, ROOT / "params.yaml"), "-S", "train.epochs=16"]]
    with pytest.raises(ParamError, match=r"gpu.yaml: sized for a GPU, and torch sees none here"):
        recipe.main([str(RECIPE), "--params", params, "--run", "--needs-cuda"])
    typo = tmp_path / "typo.yaml"
    typo.write_text("train:\n  epoch: 3\n")
    with pytest.raises(ParamError, match=r"typo.yaml: train.epoch: not a key of params.yaml"):
        recipe.main([str(typo), "--params", params, "--run"])
    assert len(started) == 1
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    recipe.main([str(RECIPE), "--params", params, "--run", "--needs-cuda"])
    assert started[1] == started[0][:-2]


def test_the_bdd100k_recipe_applies_and_its_params_build():
    """recipes/bdd100k.yaml's flags are params keys DVC applies as written, and the configs they make are valid."""
    from vlm.real import RealConfig
    from vlm.scenes.generate import ScenesConfig

    made = flags(ROOT / "recipes" / "bdd100k.yaml", ROOT / "params.yaml")
    assert "--set-param=scenes.source=bdd100k" in made and "--set-param=real.root=data/bdd100k" in made
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    values = recipe.overrides(yaml.safe_load((ROOT / "recipes" / "bdd100k.yaml").read_text()), params, "bdd100k.yaml")
    changed = apply(params, values, "bdd100k.yaml")
    assert build_config(ScenesConfig, changed["scenes"], "scenes").source == "bdd100k"
    assert build_config(RealConfig, changed["real"], "real").root == "data/bdd100k"


def test_apply_sets_dotted_keys_and_a_missing_one_stops():
    params = {"train": {"epochs": 6, "lr": 0.002}, "runtime": {"train": {"num_workers": 0}}}
    assert apply(params, {"train.epochs": 5, "runtime.train.num_workers": 12}, "here") == {
        "train": {"epochs": 5, "lr": 0.002}, "runtime": {"train": {"num_workers": 12}}}
    for key in ("train.epoch", "trian.epochs", "train.epochs.more"):
        with pytest.raises(ParamError, match=rf"here: {key}: not a key of params.yaml"):
            apply(params, {key: 1}, "here")


def test_the_recipe_trains_at_tiny_sizes_on_the_cpu(tiny_project, tmp_path):
    values = _merge(yaml.safe_load(RECIPE.read_text()), TINY_SIZES)
    project = tiny_project.copy_to(tmp_path / "project")
    project.pack(**values["pack"], side_multiple=16)  # TINY_MODEL's patch 8 x pixel shuffle 2
    images = PackedImageReader(project.h5("train"))
    assert (images.image_width, images.image_size) == (64, 32)  # 1280 x 720 frames at the native aspect
    config = build_config(TrainConfig, values["train"], "train")
    runtime = build_config(TrainRuntime, values["runtime"]["train"], "runtime.train")
    model = _merge(TINY_MODEL, values["model"])
    assert model["pack_questions"] and values["pack"]["aspect"] == "native"
    metrics = train(model, config, paths_for(project.processed, tmp_path / "out"), progress=False,
                    frame_size=FRAME_SIZE, runtime=runtime)
    assert metrics["steps"] == metrics["planned_steps"] > 0 and metrics["val_accuracy"] >= 0
