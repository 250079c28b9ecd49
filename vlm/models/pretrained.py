"""Reading HuggingFace checkpoints on disk (no download): a folder with ``config.json`` and
``model.safetensors`` or ``pytorch_model.bin``, or one such weights file."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vlm.params import ParamError, check

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def weights_file(path: Path, what: str) -> Path:
    """The weights file of ``path`` (the file itself, or the first of :data:`WEIGHT_FILES` in the folder)."""
    if path.is_file():
        return path
    if path.is_dir():
        for name in WEIGHT_FILES:
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"{path}: no {' or '.join(WEIGHT_FILES)} in this folder")
    raise FileNotFoundError(f"{what} checkpoint not found: {path}")


def load_tensors(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a ``.safetensors`` or ``torch.save``d (``.bin``, ``.pt``, ``.pth``) weights file."""
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(file)
    if file.suffix in (".bin", ".pt", ".pth"):
        return torch.load(file, map_location="cpu", weights_only=True)
    raise ValueError(f"{file}: expected a .safetensors or .bin file")


def sub_model_tensors(file: Path, key: str, what: str, drop: str | None = None) -> dict[str, torch.Tensor]:
    """The tensors of the one sub-model of ``file`` whose key prefix ``key`` follows, relative to it, bar ``drop``."""
    tensors = load_tensors(file)
    prefixes = [k[: -len(key)] for k in tensors if k.endswith(key)]
    if len(prefixes) != 1:
        raise ValueError(f"{file}: expected one {what} ('*{key}'), found {len(prefixes)}")
    prefix = prefixes[0]
    return {k[len(prefix):]: v for k, v in tensors.items()
            if k.startswith(prefix) and not (drop and k[len(prefix):].startswith(drop))}


def read_config(path: Path, name: str = "config.json") -> tuple[Path, dict[str, Any]] | None:
    """The JSON file ``name`` in the folder ``path`` (or beside the weights file ``path``) and its content."""
    config_file = (path if path.is_dir() else path.parent) / name
    if not config_file.is_file():
        return None
    with open(config_file, encoding="utf-8") as f:
        return config_file, json.load(f)


def pretrained_config(key: str, checkpoint: Any, read: Callable[[str], Any]) -> Any:
    """``read(checkpoint)``: the config of the checkpoint that ``model.{key}`` names, or a ``ParamError``."""
    check(isinstance(checkpoint, str), f"model.{key}", f"must be a path or null, got {checkpoint!r}")
    try:
        return read(checkpoint)
    except (OSError, ValueError) as e:
        raise ParamError(f"model.{key}: {e}") from e
