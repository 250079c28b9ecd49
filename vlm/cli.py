"""Running a stage script: bad input ends with one clear line on stderr, not a traceback."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence


def run(main: Callable[[], object]) -> None:
    """Call ``main``; a ``ValueError`` or ``OSError`` (bad params, labels, files) exits 1 with its message.

    Set ``VLM_DEBUG=1`` to get the full traceback instead.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        main()
    except (ValueError, OSError) as e:
        if os.environ.get("VLM_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)


def relaunch_distributed(nproc: int, module: str, argv: Sequence[str]) -> None:
    """Replace this process by ``torchrun --standalone --nproc_per_node nproc -m module argv`` (``nproc``
    DDP processes on this machine), unless it is one of them already (torchrun sets ``LOCAL_RANK``) or
    ``nproc`` is 1. Several machines: run ``torchrun`` with its multi-node flags yourself."""
    if nproc <= 1 or "LOCAL_RANK" in os.environ:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc_per_node={nproc}", "-m", module, *argv])
