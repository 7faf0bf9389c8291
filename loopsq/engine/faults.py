"""Fault injection for crash tests: ``LOOPSQ_FAULT=<point>`` makes this process kill itself with SIGKILL at
that point, so tests can prove recovery from a crash exactly there (e.g. ``after_finalize``: a run is recorded
but its loop's timer is not re-armed yet; ``mid_trim``: after the first trim of a maintenance pass). Unset in production; checking it costs one dict lookup."""

from __future__ import annotations

import os
import signal

POINTS = ("after_claim", "after_spawn", "after_finalize", "mid_trim")


def crash_point(point: str) -> None:
    """SIGKILL this process if ``LOOPSQ_FAULT`` names ``point``."""
    if os.environ.get("LOOPSQ_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)
