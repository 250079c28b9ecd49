"""Reading ``params.yaml`` and validating its sections before any expensive work starts. ``load_params``' view records
every key read inside ``with recording_reads()``: tests/test_stage_params.py checks them against dvc.yaml."""

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML, YAMLError

from vlm.config import ParamError, check


class Params(Mapping):
    """A read-only mapping over parsed params that records the dotted keys of the values read (``reads``)."""

    def __init__(self, data: dict[str, Any], prefix: str = "", reads: set[str] | None = None):
        self._data, self._prefix = data, prefix
        self.reads: set[str] = set() if reads is None else reads

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        if isinstance(value, dict):
            return Params(value, f"{self._prefix}{key}.", self.reads)
        self.reads.add(f"{self._prefix}{key}")
        return value

    def __contains__(self, key: object) -> bool:  # a key's presence is not a read of its value
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


_recorders: list[set[str]] = []  # the innermost recording_reads() block's set, last


@contextlib.contextmanager
def recording_reads() -> Iterator[set[str]]:
    """Collect the dotted keys read from every params file that ``load_params`` loads inside the block."""
    reads: set[str] = set()
    _recorders.append(reads)
    try:
        yield reads
    finally:
        _recorders.remove(reads)


def parse_yaml(text: str) -> Any:
    """``text`` read as DVC reads params.yaml (ruamel's safe loader, YAML 1.2): ``1e-05`` is a number, as ``-S`` writes
    a small float; ``no`` is a string (PyYAML's YAML 1.1 reads them the other way round)."""
    return YAML(typ="safe").load(text)


def load_params(path: str | os.PathLike = "params.yaml") -> Params:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"params file not found: {path}")
    try:
        params = parse_yaml(path.read_text(encoding="utf-8")) or {}
    except YAMLError as e:
        raise ParamError(f"{path}: invalid YAML: {e}") from e
    check(isinstance(params, dict), str(path), "top level must be a mapping of sections")
    return Params(params, reads=_recorders[-1] if _recorders else None)


def section(params: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """Return ``params[name]``, raising a clear error when it is missing or not a mapping."""
    check(name in params, "params.yaml", f"missing section '{name}'")
    value = params[name]
    check(isinstance(value, Mapping), "params.yaml", f"section '{name}' must be a mapping, got {type(value).__name__}")
    return value


RUNTIME = "runtime"  # the section of speed-only settings, one sub-section per stage section; no stage declares it


def runtime_section(params: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """``runtime.<name>``: how fast the stages of section ``name`` run, never what they write; ``{}`` when absent."""
    runtime = section(params, RUNTIME) if RUNTIME in params else {}
    value = runtime.get(name, {})
    check(isinstance(value, Mapping), "params.yaml",
          f"section '{RUNTIME}.{name}' must be a mapping, got {type(value).__name__}")
    return value


def available_cpus() -> int:
    """What a ``runtime`` count of 0 ("one per core") counts: the CPUs this process may run on (its affinity, which
    taskset, a container's cpuset or Slurm narrow), not all the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
