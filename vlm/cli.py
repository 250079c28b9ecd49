"""Running a stage script: bad input ends with one clear line on stderr, not a traceback."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable


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
