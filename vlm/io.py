"""Atomic, deterministic file output: every stage writes through these helpers, so that a failed or killed stage never
leaves a half-written file that looks valid (a temporary sibling first, moved into place with ``os.replace``)."""

import contextlib
import errno
import glob
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

# Errors of a write that fails for want of space or permission: re-raised naming the output they were writing.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (the caller creates a file or folder there), moved onto ``path`` on
    success; on an exception it is removed, ``path`` untouched (a full disk, an unwritable folder: an ``OSError`` naming
    ``path``). Its name (``.{name}.{pid}.{random}.tmp``) lets the next write of ``path`` remove a killed writer's."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _naming(e, path) from e
    os.close(fd)
    tmp, aside = Path(tmp_name), None
    tmp.unlink()
    try:
        yield tmp
        if path.is_dir() and not path.is_symlink():
            if not tmp.is_dir():  # a file output named after a folder (a mistyped path): the folder stays
                raise IsADirectoryError(errno.EISDIR, f"cannot write {path}: it is a folder, and this output is a "
                                                      "file; give the file's path")
            # the old folder moved aside in one rename (a temporary's name: the next write removes it if killed
            # here), so that a kill leaves it whole or gone, never half deleted
            aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent))
            os.replace(path, aside)
        try:
            os.replace(tmp, path)
        except OSError:
            if aside is not None:  # the old folder back in place
                os.replace(aside, path)
            raise
    except OSError as e:
        raise _naming(e, path) from e
    finally:
        _remove(tmp)
        if aside is not None:
            _remove(aside)


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries of ``path`` whose writing process no longer runs; return them."""
    stale = []
    for candidate in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        pid = candidate.name[len(path.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not _process_exists(int(pid)):
            _remove(candidate)
            stale.append(candidate)
    return stale


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def _naming(error: OSError, path: Path) -> OSError:
    """``error`` as one line naming ``path`` when it is a full disk or a permission problem, else unchanged."""
    if error.errno not in _WRITE_ERRNOS:
        return error
    # the short system message (HDF5's own spans several lines), or the one an inner atomic write named
    reason = getattr(error, "reason", None) or os.strerror(error.errno)
    named = type(error)(error.errno, f"cannot write {path}: {reason}")
    named.reason = reason
    return named


def check_writable(*paths: str | os.PathLike) -> None:
    """Fail now, naming the folder, if an output could not be written there (for stages, before their expensive
    work): a temporary file in each output's folder, or its nearest existing ancestor, nothing left behind."""
    for path in paths:
        folder = Path(path).absolute().parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        try:
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as e:
            reason = e.strerror or os.strerror(e.errno or 0)
            raise type(e)(e.errno, f"cannot write {path}: {folder} is not writable ({reason})") from e


def write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON atomically, keys in insertion order, UTF-8, trailing newline."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)
        f.write("\n")


def existing_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path when it is a file, else a ``FileNotFoundError`` naming ``what``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """Read JSON with errors that name the file and the position of a syntax error (or that it is empty)."""
    path = existing_file(path, what)
    if path.stat().st_size == 0:  # json's own message would be "Expecting value: line 1 column 1"
        raise ValueError(f"{path}: the {what} is empty (0 bytes)")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from e


@contextlib.contextmanager
def json_list_writer(path: str | os.PathLike) -> Iterator[Callable[[Any], None]]:
    """Yield ``write(item)``: a JSON list written atomically, one compact item per line as they come (none is held);
    the file appears when the block ends without an error."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write("[\n")
        separator = ""

        def write(item: Any) -> None:
            nonlocal separator
            f.write(separator + json.dumps(item, ensure_ascii=False))
            separator = ",\n"

        yield write
        f.write("\n]\n")


def write_json_list(path: str | os.PathLike, items: Iterable) -> int:
    """Write ``items`` with :func:`json_list_writer` as they come (a generator is never held whole); return how many."""
    count = 0
    with json_list_writer(path) as write:
        for item in items:
            write(item)
            count += 1
    return count


def iter_json_list(path: str | os.PathLike, what: str = "JSON list") -> Iterator[Any]:
    """The items of a JSON list that :func:`write_json_list` wrote (one item per line), one at a time: the file
    is never held whole. Errors name the file and the line."""
    path = existing_file(path, what)
    with open(path, encoding="utf-8") as f:
        if f.readline().strip() != "[":
            raise ValueError(f"{path}: line 1: expected '[' (a JSON list written one item per line)")
        lineno, closed = 1, False
        for lineno, line in enumerate(f, start=2):
            text = line.strip()
            if closed and text:
                raise ValueError(f"{path}: line {lineno}: text after the list's closing ']'")
            if text == "]":
                closed = True
            elif text:
                try:
                    yield json.loads(text.removesuffix(","))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: invalid JSON at line {lineno}, column {e.colno}: {e.msg} "
                                     f"(one item per line expected)") from e
        if not closed:
            raise ValueError(f"{path}: line {lineno}: the list ends without its closing ']' (truncated?)")
