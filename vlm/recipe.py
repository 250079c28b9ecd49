"""A params profile (``recipes/*.yaml``): the params.yaml values an experiment changes, as ``dvc exp run``'s
``-S key=value`` flags, or that experiment run::

    python -m vlm.recipe recipes/gpu.yaml                          # the flags, quoted for a shell
    python -m vlm.recipe recipes/gpu.yaml --run --needs-cuda -- -S train.epochs=16   # what `make gpu` runs

Every key must be one of params.yaml's, a section is given by its keys, and each flag must set exactly the recipe's
value when DVC applies it (checked with DVC's own parser on a copy of params.yaml), so a mistake stops here, before
``dvc exp run`` starts, rather than in a stage after hours of work."""

import argparse
import functools
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAMLError

from vlm.cli import run
from vlm.config import ParamError, check
from vlm.params import parse_yaml

HYDRA_WORDS = {"true", "false", "null", "nan", "inf"}  # words Hydra's grammar reads as other than strings


def overrides(recipe: Mapping[str, Any], params: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """``recipe``'s values by dotted key (a mapping is a value where params.yaml holds a value, not a section)."""
    values = {}
    for key, value in recipe.items():
        check(key in params, f"{source}: {prefix}{key}", "not a key of params.yaml")
        section = isinstance(params[key], Mapping) and bool(params[key])
        if section:
            check(isinstance(value, Mapping), f"{source}: {prefix}{key}",
                  f"a section of params.yaml: give its keys, not {value!r}")
            values |= overrides(value, params[key], source, f"{prefix}{key}.")
        else:
            values[f"{prefix}{key}"] = value
    return values


def apply(params: dict[str, Any], values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``params`` (changed in place) with each dotted key of ``values`` set; a key params.yaml lacks stops."""
    for key, value in values.items():
        *path, last = key.split(".")
        section = params
        for name in path:
            check(isinstance(section.get(name), Mapping), f"{source}: {key}", "not a key of params.yaml")
            section = section[name]
        check(last in section, f"{source}: {key}", "not a key of params.yaml")
        section[last] = value
    return params


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar, which ``-S`` parses: a string quoted unless it is a plain word (so that
    "1", "null" or "a,b" stay strings), lists and mappings in flow style."""
    if isinstance(value, str):
        plain = re.fullmatch(r"[A-Za-z_][\w\-./]*", value) and value.lower() not in HYDRA_WORDS
        return value if plain else "'" + value.replace("'", "\\'") + "'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    return json.dumps(value)  # numbers, true, false, null


def flags(recipe_path: str | Path, params_path: str | Path = "params.yaml") -> list[str]:
    """``--set-param=key=value`` (``-S``) for each value of the recipe (``++key``: a mapping replaces the value),
    each checked to set exactly that value when DVC applies it to params.yaml."""
    source = str(recipe_path)
    try:
        recipe = parse_yaml(Path(recipe_path).read_text(encoding="utf-8")) or {}
        params = parse_yaml(Path(params_path).read_text(encoding="utf-8"))
    except YAMLError as e:
        raise ParamError(f"{source}: not valid YAML ({str(e).splitlines()[0]})") from e
    check(isinstance(recipe, Mapping), source, f"must be a mapping of params.yaml's sections, got {recipe!r}")
    values = overrides(recipe, params, source)
    made = {key: f"--set-param={'++' if isinstance(value, Mapping) else ''}{key}={hydra_value(value)}"
            for key, value in values.items()}
    _check_as_dvc_applies(made, values, params_path, source)
    return list(made.values())


def _check_as_dvc_applies(made: Mapping[str, str], values: Mapping[str, Any], params_path: str | Path,
                          source: str) -> None:
    """Stop unless DVC's ``-S`` parser, given each flag of ``made`` (by dotted key) on a copy of params.yaml, sets
    that key to its value in ``values``."""
    from dvc.utils.hydra import apply_overrides  # here, so that the key checks above do not wait for DVC

    with tempfile.TemporaryDirectory() as folder:
        copied = Path(folder) / "params.yaml"
        copied.write_bytes(Path(params_path).read_bytes())
        for flag in made.values():
            try:
                apply_overrides(copied, [flag.removeprefix("--set-param=")])
            except Exception as e:  # DVC's InvalidArgumentError, the Hydra error as its cause
                raise ParamError(f"{source}: {flag}: DVC cannot apply it ({e.__cause__ or e})".splitlines()[0]) from e
        got = parse_yaml(copied.read_text(encoding="utf-8"))
    for key, want in values.items():
        have = functools.reduce(lambda section, name: section[name], key.split("."), got)
        check(want == have and type(want) is type(have), f"{source}: {key}",
              f"DVC would set {have!r}, not the recipe's {want!r}")


def check_cuda(recipe_path: str | Path) -> None:
    """Stop with one line when torch sees no CUDA device: the recipe is sized for one."""
    import torch  # here, so that printing the flags does not wait for torch

    check(torch.cuda.is_available(), str(recipe_path),
          "sized for a GPU, and torch sees none here (torch.cuda.is_available() is False); on the CPU it would take "
          "many times the default run's training (metrics/recipe_compute.json counts it): `make gpu ALLOW_CPU=1` "
          "runs it anyway")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # passed on to dvc exp run
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--run", action="store_true", help="run `dvc exp run` with the flags, then the args after --")
    parser.add_argument("--needs-cuda", action="store_true", help="with --run: stop unless torch sees a GPU")
    args = parser.parse_args(argv)
    made = flags(args.recipe, args.params)
    if not args.run:
        print(shlex.join(made))
        return
    if args.needs_cuda:
        check_cuda(args.recipe)
    command = ["dvc", "exp", "run", *made, *extra]
    print(" ".join(command), flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    run(main)
