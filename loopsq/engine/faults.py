"""Fault injection for crash tests: ``LOOPSQ_FAULT=<point>`` makes this process kill itself with SIGKILL at
that point, so tests can prove recovery from a crash exactly there (e.g. ``after_finalize``: a run is recorded
but its loop's timer is not re-armed yet; ``mid_trim``: after the first trim of a maintenance pass).

It is honoured only in a process started for tests, with ``LOOPSQ_TEST_FAULTS=1`` as well: a stray
``LOOPSQ_FAULT`` in a production environment would otherwise make every worker kill itself on every run. A
process where it is on says so loudly when it starts (``warn_if_enabled``). Checking it costs one dict lookup
when ``LOOPSQ_FAULT`` is unset.
"""

from __future__ import annotations

import logging
import os
import signal

POINTS = ("after_claim", "after_spawn", "after_finalize", "mid_trim")
FAULT_ENV = "LOOPSQ_FAULT"
#: Must be ``1`` for ``LOOPSQ_FAULT`` to be honoured.
TEST_FAULTS_ENV = "LOOPSQ_TEST_FAULTS"


def active_fault() -> str | None:
    """The fault point this process honours, or None (``LOOPSQ_FAULT`` unset, or set without
    ``LOOPSQ_TEST_FAULTS=1``)."""
    point = os.environ.get(FAULT_ENV)
    if not point or os.environ.get(TEST_FAULTS_ENV) != "1":
        return None
    return point


def crash_point(point: str) -> None:
    """SIGKILL this process if fault injection is on and ``LOOPSQ_FAULT`` names ``point``."""
    if os.environ.get(FAULT_ENV) == point and os.environ.get(TEST_FAULTS_ENV) == "1":
        os.kill(os.getpid(), signal.SIGKILL)


def warn_if_enabled(log: logging.Logger) -> None:
    """At process start: a loud warning when fault injection is on, a quieter one when it is set but ignored."""
    point = os.environ.get(FAULT_ENV)
    if not point:
        return
    if active_fault() is not None:
        log.warning("!!! FAULT INJECTION IS ON: %s=%s with %s=1; this process will SIGKILL itself at %s. "
                    "This is for tests only; never set these in production !!!", FAULT_ENV, point, TEST_FAULTS_ENV,
                    point)
    else:
        log.warning("%s=%s is set but ignored: fault injection needs %s=1 (tests only)", FAULT_ENV, point,
                    TEST_FAULTS_ENV)
