"""Pure loop lifecycle transitions: pause, resume, stop (§3.10), with the reference's resume-after-stop fixed.

Each function takes a loop and the current time and returns the loop as it should be stored next; none does I/O.
"""

from __future__ import annotations

from datetime import datetime

from loopsq.domain.models import Loop
from loopsq.domain.schedules import initial_next_run
from loopsq.domain.timeutil import to_iso


def pause(loop: Loop, now: datetime, reason: str | None = None) -> Loop:
    """Status ``paused``; ``nextRunAt`` is kept so catch-up handles the missed slots on resume."""
    return loop.with_changes(status="paused", status_reason=reason, updated_at=to_iso(now))


def resume(loop: Loop, now: datetime) -> Loop:
    """Status ``active``; a loop without a next run (stopped) is scheduled again from ``now``.

    The reference kept ``nextRunAt`` empty after ``stop``, so a resumed loop never ran again; loopsq computes the
    schedule's first slot after ``now``. A resume also clears a failure streak and its recorded reason.
    """
    next_run_at = loop.next_run_at
    if next_run_at is None:
        next_run_at = to_iso(initial_next_run(loop.schedule, now, loop.timezone))
    return loop.with_changes(
        status="active",
        next_run_at=next_run_at,
        status_reason=None,
        failure_streak=0,
        updated_at=to_iso(now),
    )


def stop(loop: Loop, now: datetime) -> Loop:
    """Status ``stopped``; ``nextRunAt`` and any pending retry are cleared."""
    return loop.with_changes(
        status="stopped",
        next_run_at=None,
        retry_scheduled_for=None,
        status_reason=None,
        updated_at=to_iso(now),
    )
