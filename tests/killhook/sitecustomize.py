"""A test hook for tests/test_kills.py, imported at start-up only by the processes it starts (this folder is on
their PYTHONPATH, nowhere else).

With ``VLM_TEST_KILL_BEFORE_REPLACE`` set, the process SIGKILLs itself just before it moves the temporary of
an output whose path ends with that value into place: the output is fully written but not yet renamed, the
last moment of a stage's final write.
"""

import os
import signal

_target = os.environ.get("VLM_TEST_KILL_BEFORE_REPLACE")
if _target:
    _replace = os.replace

    def _killing_replace(src, dst, *args, **kwargs):
        if os.fspath(dst).endswith(_target):
            os.kill(os.getpid(), signal.SIGKILL)
        return _replace(src, dst, *args, **kwargs)

    os.replace = _killing_replace
