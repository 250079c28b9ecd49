"""Running a stage script: bad input ends with one clear line on stderr, not a traceback; DDP under torchrun; paths
that must outlive DVC's temporary copy of the repository."""

import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def run(main: Callable[[], object]) -> None:
    """Call ``main``; a ``ValueError``, ``OSError`` (bad params, labels, files) or ``ArithmeticError`` (a non-finite
    loss) exits 1 with its message (``VLM_DEBUG=1``: the full traceback instead)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        main()
    except (ValueError, OSError, ArithmeticError) as e:
        if os.environ.get("VLM_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def relaunch_distributed(nproc: int, module: str, argv: Sequence[str]) -> None:
    """Replace this process by ``torchrun --standalone --nproc_per_node nproc -m module argv`` unless it is one of
    its processes already (``LOCAL_RANK`` set: it then dies with torchrun, :func:`die_with_parent`) or ``nproc`` is 1;
    several machines: run ``torchrun`` yourself."""
    if under_torchrun():
        die_with_parent()
        return
    if nproc <= 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc_per_node={nproc}", "-m", module, *argv])


def under_torchrun() -> bool:
    """Whether this process is one of torchrun's (it sets ``LOCAL_RANK``)."""
    return "LOCAL_RANK" in os.environ


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies. torchrun starts each worker in a session of its own, so a
    kill of the stage's process group (DVC's, a queue's) ends torchrun but not the workers, which would train on and
    write the outputs of a run that was stopped."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes  # pylint: disable=import-outside-toplevel
    import signal  # pylint: disable=import-outside-toplevel

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the call above: nobody would end this process
        os._exit(1)


def in_repository(path: str | os.PathLike) -> Path:
    """``path`` (relative to the stage's folder) in ``DVC_ROOT``, the repository DVC runs the stage for, when the
    stage runs in a temporary copy (a queued or ``--temp`` experiment; docs/architecture.md, train), else as it is."""
    path, root = Path(path), os.environ.get("DVC_ROOT")
    here = Path.cwd().resolve()
    copy = next((folder for folder in (here, *here.parents) if (folder / ".dvc").is_dir()), None)
    if path.is_absolute() or not root or copy is None or copy == Path(root).resolve():
        return path
    return Path(root).resolve() / here.relative_to(copy) / path
