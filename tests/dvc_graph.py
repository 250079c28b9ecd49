"""The project's own import graph of each DVC stage, read from the source (no import runs)."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vlm", "stages")


def module_file(module: str) -> Path | None:
    """The file of a project module (``vlm.data.pack`` -> vlm/data/pack.py or vlm/data/pack/__init__.py)."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imported_modules(path: Path) -> set[str]:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(p for p in [*parts, base] if p)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
    modules = set()
    for name in found:  # every package on the way is imported too
        parts = name.split(".")
        modules.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return modules


def import_closure(start: Path) -> set[Path]:
    """Every project file that running ``start`` as a module imports, directly or not (``start`` and its
    packages' ``__init__.py`` included)."""
    packages = start.relative_to(ROOT).parts[:-1]
    inits = [ROOT.joinpath(*packages[:i], "__init__.py") for i in range(1, len(packages) + 1)]
    seen, todo = set(), [start, *(path for path in inits if path.is_file())]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(f for m in _imported_modules(path) if (f := module_file(m)) is not None)
    return seen


def stage_module(cmd: str) -> Path:
    """``python -m stages.train ...`` -> stages/train.py."""
    words = shlex.split(cmd)
    return module_file(words[words.index("-m") + 1])
