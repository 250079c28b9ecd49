"""Each stage config's dataclass defaults are the values in params.yaml (which states every field), so that
code building a config without params.yaml (tests, notebooks, benchmarks) gets the pipeline's settings.

The model configs are the exception: ``VLMConfig``, ``SiglipVisionConfig``, ``GemmaConfig`` (and the heads and
Q-Former configs) keep the architecture defaults of the plain PaliGemma design (linear connector, no pixel
shuffle, no conv stem, auxiliary heads off, HF's init std 0.02), and params.yaml's ``model:`` section states
every departure from it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from vlm.commands.generate import CommandsConfig
from vlm.config import ParamError, build_config
from vlm.counterfactuals import CounterfactualsConfig
from vlm.data.pack import PackConfig, PackRuntime
from vlm.data.profile import ProfileConfig
from vlm.evaluate import EvaluateConfig
from vlm.params import load_params
from vlm.real import RealConfig
from vlm.scenes.generate import ScenesConfig, ScenesRuntime
from vlm.tokenizer import VocabConfig
from vlm.traffic_vlm import VLMConfig
from vlm.train import TrainConfig, TrainRuntime

ROOT = Path(__file__).resolve().parents[1]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
CONFIGS = {"scenes": ScenesConfig, "commands": CommandsConfig, "vocab": VocabConfig, "pack": PackConfig,
           "train": TrainConfig, "evaluate": EvaluateConfig, "counterfactuals": CounterfactualsConfig,
           "profile": ProfileConfig, "real": RealConfig}
RUNTIME = {"scenes": ScenesRuntime, "pack": PackRuntime, "train": TrainRuntime}  # params.yaml's runtime.<section>


def test_every_stage_section_but_the_model_has_a_config():
    assert set(PARAMS) == set(CONFIGS) | {"model", "runtime"}
    assert set(PARAMS["runtime"]) == set(RUNTIME) <= set(CONFIGS)


@pytest.mark.parametrize("name", sorted(RUNTIME))
def test_runtime_defaults_are_the_params_yaml_values(name):
    assert build_config(RUNTIME[name], PARAMS["runtime"][name], f"runtime.{name}") == RUNTIME[name]()
    assert set(PARAMS["runtime"][name]) == {f.name for f in dataclasses.fields(RUNTIME[name])}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_dataclass_defaults_are_the_params_yaml_values(name):
    assert build_config(CONFIGS[name], PARAMS[name], name) == CONFIGS[name]()


def _keys(config, prefix: str) -> set[str]:
    """Dotted names of a config's fields, nested configs' fields included."""
    keys = set()
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        keys |= _keys(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else {prefix + f.name}
    return keys


def _yaml_keys(section: dict, prefix: str) -> set[str]:
    keys = set()
    for key, value in section.items():
        # commands.splits, .holdout, .types: values, not sections
        nested = isinstance(value, dict) and key not in ("splits", "holdout", "types")
        keys |= _yaml_keys(value, f"{prefix}{key}.") if nested else {prefix + key}
    return keys


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_params_yaml_states_every_field(name):
    assert _yaml_keys(PARAMS[name], "") == _keys(CONFIGS[name](), "")


def test_params_are_read_as_dvc_writes_them(tmp_path):
    """``-S train.lr=1e-5`` writes ``lr: 1e-05``: a number in DVC's YAML 1.2 (``dvc params diff``, ``dvc exp show``)
    and in the stages', where PyYAML's YAML 1.1 read a string and train stopped; ``no`` is a string to both."""
    from dvc.utils.hydra import apply_overrides
    from dvc.utils.serialize import load_yaml

    path = tmp_path / "params.yaml"
    path.write_bytes((ROOT / "params.yaml").read_bytes())
    apply_overrides(path, ["train.lr=1e-5", "model.pack_questions=no"])
    assert "lr: 1e-05" in path.read_text() and yaml.safe_load(path.read_text())["train"]["lr"] == "1e-05"
    params = load_params(path)
    assert build_config(TrainConfig, params["train"], "train").lr == 1e-5
    assert params["model"]["pack_questions"] == "no" == load_yaml(path)["model"]["pack_questions"]
    with pytest.raises(ParamError, match=r"model.pack_questions: must be true or false, got 'no'"):
        VLMConfig.from_params(params["model"], vocab_size=64, image_size=128, image_width=224)
