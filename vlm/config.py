"""Typed configs from params mappings: a dataclass built from a mapping, every unknown key, wrong type and
broken rule one :class:`ParamError` that names the dotted key (``model.gemma.head_dim: must be ...``)."""

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any


class ParamError(ValueError):
    """An impossible or malformed parameter; the message names the key and the rule."""


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
