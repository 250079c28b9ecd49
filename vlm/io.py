"""Atomic, deterministic file output.

Every stage writes through these helpers so that a failed or killed stage never leaves a
half-written file that looks valid: content goes to a temporary sibling first and is moved
into place with ``os.replace`` (atomic on POSIX within one filesystem).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it onto ``path``.

    Works for files and directories: the caller creates whatever it likes at the yielded
    path. On any exception the temporary is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    tmp.unlink()
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        elif tmp.exists():
            tmp.unlink()


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON atomically, keys in insertion order, UTF-8, trailing newline."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=indent, ensure_ascii=False)
            f.write("\n")


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """Read JSON with errors that name the file and the position of a syntax error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e


def write_json_list(path: str | os.PathLike, items: list) -> None:
    """Write a JSON list atomically with one compact item per line: one document, yet diffable."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("[\n" + ",\n".join(json.dumps(x, ensure_ascii=False) for x in items) + "\n]\n")
