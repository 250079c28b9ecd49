"""Reading HuggingFace checkpoints on disk (no download): a folder with ``config.json`` and
``model.safetensors`` or ``pytorch_model.bin`` (or their shards and index), or one such weights file."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vlm.config import ParamError, check

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# a sharded checkpoint's (PaliGemma-3B's, Gemma-2B's) map of each tensor to its shard file
INDEX_FILES = tuple(f"{name}.index.json" for name in WEIGHT_FILES)


def weights_files(path: Path, what: str) -> list[Path]:
    """The weights files of ``path``: the file itself, the first of :data:`WEIGHT_FILES` in the folder, or the shards
    that the folder's index (:data:`INDEX_FILES`) names."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{what} checkpoint not found: {path}")
    for name in WEIGHT_FILES:
        if (path / name).is_file():
            return [path / name]
    for name in INDEX_FILES:
        if (path / name).is_file():
            found = read_config(path, name)
            weight_map = found[1].get("weight_map") if isinstance(found[1], dict) else None
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{path / name}: no 'weight_map' of tensor names to shard files")
            shards = [path / shard for shard in sorted(set(weight_map.values()))]
            missing = [shard.name for shard in shards if not shard.is_file()]
            if missing:
                raise FileNotFoundError(f"{path / name}: names {missing[0]}, which is not in {path} "
                                        f"({len(missing)} of {len(shards)} shards missing)")
            return shards
    raise FileNotFoundError(f"{path}: no {' or '.join(WEIGHT_FILES)} in this folder, nor a sharded checkpoint's "
                            f"{' or '.join(INDEX_FILES)}")


def load_tensors(file: Path, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file (only ``names``, if given: only they are read) or every tensor of a
    ``torch.save``d (``.bin``, ``.pt``, ``.pth``) weights file."""
    if file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(file, framework="pt") as f:
            return {name: f.get_tensor(name) for name in (f.keys() if names is None else names)}
    if file.suffix in (".bin", ".pt", ".pth"):
        return torch.load(file, map_location="cpu", weights_only=True)
    raise ValueError(f"{file}: expected a .safetensors or .bin file")


def safetensors_names(file: Path) -> list[str]:
    """The names of the tensors of a ``.safetensors`` file, from its header."""
    from safetensors import safe_open

    with safe_open(file, framework="pt") as f:
        return list(f.keys())


def sub_model_tensors(files: list[Path], key: str, what: str, drop: str | None = None) -> dict[str, torch.Tensor]:
    """The tensors of the one sub-model of ``files`` (one file, or a checkpoint's shards) whose key prefix ``key``
    follows, relative to it, bar ``drop``; only they are read of a ``.safetensors`` file."""
    whole = {file: load_tensors(file) for file in files if file.suffix != ".safetensors"}  # read once, whole
    where = {name: file for file in files for name in (whole[file] if file in whole else safetensors_names(file))}
    prefixes = [k[: -len(key)] for k in where if k.endswith(key)]
    if len(prefixes) != 1:
        source = files[0] if len(files) == 1 else f"{files[0].parent} ({len(files)} shards)"
        raise ValueError(f"{source}: expected one {what} ('*{key}'), found {len(prefixes)}")
    prefix = prefixes[0]
    wanted = [k for k in where if k.startswith(prefix) and not (drop and k[len(prefix):].startswith(drop))]
    tensors = {}
    for file in files:
        names = [k for k in wanted if where[k] == file]
        if names:
            tensors.update({name: whole[file][name] for name in names} if file in whole else load_tensors(file, names))
    return {k[len(prefix):]: tensors[k] for k in wanted}


def load_strict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], what: str) -> None:
    """``model.load_state_dict(state_dict, strict=True)``; a missing, unexpected or mis-shaped weight is a
    ``ValueError`` of one line, ``what`` then torch's line per key joined (``vlm.cli.run`` prints one line)."""
    try:
        model.load_state_dict(state_dict, strict=True)
    except RuntimeError as e:
        detail = "; ".join(line.strip() for line in str(e).splitlines()[1:] if line.strip())
        raise ValueError(f"{what}: {detail}") from e


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
