"""A params profile (``recipes/*.yaml``): the params.yaml values an experiment changes, as ``dvc exp run``'s
``-S key=value`` flags::

    dvc exp run $(python -m vlm.recipe recipes/gpu.yaml)     # what `make gpu` runs

Every key must be one of params.yaml's, so a typo stops here rather than in a stage after hours of work."""

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args(argv)
    print(" ".join(flags(args.recipe, args.params)))


if __name__ == "__main__":
    main()
