"""Test hooks for tests/test_kills.py and tests/test_ddp.py, imported at start-up only by the processes they
start (this folder is on their PYTHONPATH, nowhere else). Every output is moved into place by ``os.replace``
(``vlm.io.atomic_path``), so wrapping it sees every final write.

- ``VLM_TEST_KILL_BEFORE_REPLACE``: the process SIGKILLs itself just before it moves the temporary of an
  output whose path ends with that value into place: the output is fully written but not yet renamed, the
  last moment of a stage's final write.
- ``VLM_TEST_KILL_AFTER_REPLACE`` with ``VLM_TEST_KILL_ARMED`` (a file): the process SIGKILLs itself just after
  it moves into place an output whose path contains that value, if the file exists, which it removes first: one
  kill, right after a complete write (a training run killed just after a checkpoint), whatever runs after it.
- ``VLM_TEST_PAUSE_BEFORE_REPLACE`` (``suffix:seconds``): the process sleeps that long before it moves such
  an output into place (a stage that holds DVC's lock for a known time); with ``VLM_TEST_RESUME_FILE`` set,
  at most that long: it goes on as soon as that file exists (the test says when it has seen enough).
- ``VLM_TEST_RECORD_WRITES``: each ``os.replace`` appends ``"{RANK} {destination}"`` to that file (the DDP
  rank from torchrun's environment, 0 without one).
"""

import os
import signal
import time

_kill_target = os.environ.get("VLM_TEST_KILL_BEFORE_REPLACE")
_kill_after, _armed = os.environ.get("VLM_TEST_KILL_AFTER_REPLACE"), os.environ.get("VLM_TEST_KILL_ARMED")
_pause_target, _, _pause_seconds = os.environ.get("VLM_TEST_PAUSE_BEFORE_REPLACE", "").rpartition(":")
_resume_file = os.environ.get("VLM_TEST_RESUME_FILE")
_record = os.environ.get("VLM_TEST_RECORD_WRITES")
if _kill_target or _kill_after or _pause_target or _record:
    _replace = os.replace

    def _hooked_replace(src, dst, *args, **kwargs):
        path = os.fsdecode(dst)  # DVC's own git library moves files by bytes paths
        if _kill_target and path.endswith(_kill_target):
            os.kill(os.getpid(), signal.SIGKILL)
        if _pause_target and path.endswith(_pause_target):
            _pause(float(_pause_seconds))
        if _record:
            with open(_record, "a", encoding="utf-8") as log:
                log.write(f"{os.environ.get('RANK', '0')} {os.path.abspath(path)}\n")
        result = _replace(src, dst, *args, **kwargs)
        if _kill_after and _kill_after in path and _armed and os.path.exists(_armed):
            os.remove(_armed)
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    def _pause(seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (_resume_file and os.path.exists(_resume_file)):
            time.sleep(0.05)

    os.replace = _hooked_replace
