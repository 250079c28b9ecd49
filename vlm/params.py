"""Reading ``params.yaml`` and validating its sections before any expensive work starts. ``load_params``' view records
every key read inside ``with recording_reads()``: tests/test_stage_params.py checks them against dvc.yaml."""

import contextlib
import dataclasses
import os
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML, YAMLError


class ParamError(ValueError):
    """An impossible or malformed parameter; the message names the key and the rule."""


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


def pick(values: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """The entries of ``values`` named by ``keys`` (dotted for a nested one: ``augment.hflip_prob``) that it has,
    nested as in ``values``: what a stage reads of a section it uses part of (only those keys are recorded as read)."""
    picked: dict[str, Any] = {}
    for key in keys:
        head, _, rest = key.partition(".")
        if head not in values:
            continue
        if rest and isinstance(values[head], Mapping):
            inner = pick(values[head], [rest])
            if inner:
                picked.setdefault(head, {}).update(inner)
        else:
            picked[head] = values[head]
    return picked


def check(condition: bool, key: str, rule: str) -> None:
    """Raise ``ParamError('<key>: <rule>')`` unless ``condition`` holds."""
    if not condition:
        raise ParamError(f"{key}: {rule}")


def build_config(cls: type, values: Mapping[str, Any] | None, prefix: str, keys: Iterable[str] | None = None, *,
                 validate: bool = True):
    """Build the dataclass ``cls`` from a params mapping (``prefix``: its dotted path, for errors), rejecting unknown
    keys and wrong types, nested dataclasses from mappings, then ``validate()`` (a nested one named in ``cls``'s
    ``validates_nested`` is left to ``cls.validate``: it checks it where it is used); with ``keys`` (dotted:
    ``augment.hflip_prob``) only those are read, the rest default (every key is still checked). A field named
    ``seed`` must be a seed numpy and torch take (0 to 2**32 - 1)."""
    values = values or {}
    _check_known(cls, values, prefix)
    values = dict(values if keys is None else pick(values, keys))
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        key, hint = f"{prefix}.{name}", hints[name]
        if not dataclasses.is_dataclass(hint):
            kwargs[name] = _coerce(value, hint, key)
            check(name != "seed" or 0 <= kwargs[name] < 2 ** 32, key, f"must be from 0 to 2**32 - 1, got {value!r}")
        elif not isinstance(value, Mapping):
            raise ParamError(f"{key}: must be a mapping")
        else:
            kwargs[name] = build_config(hint, value, key, validate=name not in getattr(cls, "validates_nested", ()))
    config = cls(**kwargs)
    if validate and hasattr(config, "validate"):
        config.validate(prefix)
    return config


def _check_known(cls: type, values: Mapping[str, Any], prefix: str) -> None:
    """Every key of ``values`` (and of its mappings for dataclass fields) names a field of ``cls``; no value is read."""
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ParamError(f"{prefix}.{unknown[0]}: unknown key (known: {', '.join(sorted(fields))})")
    hints = typing.get_type_hints(cls)
    for name in values:
        if dataclasses.is_dataclass(hints[name]) and isinstance(nested := values[name], Mapping):  # a view: no read
            _check_known(hints[name], nested, f"{prefix}.{name}")


# scalar type -> (the Python types it accepts, bool excluded unless it is bool; how the error names it)
_SCALARS = {bool: ((bool,), "true or false"), int: ((int,), "an integer"), float: ((int, float), "a number"),
            str: ((str,), "a string")}


def _kind(hint: Any) -> str:
    """What a value of type ``hint`` is, for an error message (``int | None``: "an integer, or null")."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return repr(args[0]) if len(args) == 1 else f"one of {', '.join(map(repr, args))}"
    if origin in (list, tuple):
        return "a list"
    if origin is dict or hint is dict:
        return "a mapping"
    return "null" if hint is type(None) else _SCALARS[hint][1] if hint in _SCALARS else hint.__name__


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is not type(None):
                try:
                    return _coerce(value, arg, key)
                except ParamError as e:
                    errors.append(e)
        inner = [e for e in errors if not str(e).startswith(f"{key}: ")]  # an item's (key[0]: ...): it says more
        if inner:
            raise inner[0]
        raise ParamError(f"{key}: must be {', or '.join(_kind(arg) for arg in args)}, got {value!r}")
    if origin is typing.Literal:
        check(value in args, key, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin in (list, tuple):
        check(isinstance(value, (list, tuple)), key, f"must be a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or hint is dict:
        check(isinstance(value, Mapping), key, f"must be a mapping, got {value!r}")
        return dict(value)
    if hint in _SCALARS:
        accepted, what = _SCALARS[hint]
        check(isinstance(value, accepted) and not (isinstance(value, bool) and hint is not bool), key,
              f"must be {what}, got {value!r}")
        return float(value) if hint is float else value
    return value
