"""A params profile (``recipes/*.yaml``): the params.yaml values an experiment changes, as ``dvc exp run``'s
``-S key=value`` flags, or that experiment run::

    python -m vlm.recipe recipes/gpu.yaml                          # the flags
    python -m vlm.recipe recipes/gpu.yaml --run --needs-cuda -- -S train.epochs=16   # what `make gpu` runs

Every key must be one of params.yaml's, so a typo stops here, before ``dvc exp run`` starts, rather than in a stage
after hours of work (``dvc exp run $(python -m vlm.recipe ...)`` would run the defaults when it stops)."""

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from vlm.cli import run
from vlm.params import check, load_params


def overrides(recipe: Mapping[str, Any], params: Mapping[str, Any], source: str, prefix: str = "") -> dict[str, Any]:
    """``recipe``'s values by dotted key (a mapping is a value where params.yaml holds a value, not a section)."""
    values = {}
    for key, value in recipe.items():
        check(key in params, f"{source}: {prefix}{key}", "not a key of params.yaml")
        if isinstance(value, Mapping) and isinstance(params[key], Mapping) and params[key]:
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


def flags(recipe_path: str | Path, params_path: str | Path = "params.yaml") -> list[str]:
    """``--set-param=key=value`` (``-S``) for each value of the recipe, the value in YAML's flow style (which
    ``-S`` parses) with no blank, so that the shell's word splitting of ``$(...)`` keeps each flag whole."""
    recipe = yaml.safe_load(Path(recipe_path).read_text(encoding="utf-8")) or {}
    values = overrides(recipe, load_params(params_path), str(recipe_path))
    out = []
    for key, value in values.items():
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        check(not any(c.isspace() for c in text), f"{recipe_path}: {key}",
              f"a value with blanks cannot pass through $(...): {text!r}")
        out.append(f"--set-param={key}={text}")
    return out


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
        print(" ".join(made))
        return
    if args.needs_cuda:
        check_cuda(args.recipe)
    command = ["dvc", "exp", "run", *made, *extra]
    print(" ".join(command), flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    run(main)
