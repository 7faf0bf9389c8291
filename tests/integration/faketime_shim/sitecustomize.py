"""Loaded (through ``PYTHONPATH``) only by processes that a test skews with libfaketime.

libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` fails ``clock_nanosleep`` on the monotonic clock with
EINVAL, so Python's ``time.sleep`` raises ``OSError``; and without that variable it fakes the monotonic clock too,
which hangs ``threading.Event.wait``. So the monotonic clock is left alone and ``time.sleep`` waits in ``select``
(which libfaketime leaves alone) instead. The process under test is otherwise unchanged.
"""

import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        select.select([], [], [], left)


time.sleep = _sleep
