"""Pure loop lifecycle transitions: pause, resume, stop (§3.10), with the reference's resume-after-stop fixed;
archive, unarchive and rename (0.3.15, 0.3.50).

Each function takes a loop and the current time and returns the loop as it should be stored next; none does I/O.
"""

from __future__ import annotations

from datetime import datetime

from loopsq.domain.models import Loop
from loopsq.domain.schedules import initial_next_run
from loopsq.domain.timeutil import to_iso
from loopsq.errors import ConflictError


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
        retry_queue=None,
        status_reason=None,
        updated_at=to_iso(now),
    )


# -- archive and rename (reference 0.3.15, 0.3.50) ----------------------------------------------------------------
def ensure_not_archived(loop: Loop, ref: str, doing: str = "running") -> None:
    """Refuse to run (or pause, resume, stop) an archived loop: ``loop is archived; unarchive it before running: <x>``.

    Raises:
        ConflictError: when the loop is archived.
    """
    if loop.archived:
        raise ConflictError(f"loop is archived; unarchive it before {doing}: {ref}")


def archive(loop: Loop, now: datetime, ref: str) -> Loop:
    """Archived at ``now``, remembering the status it had; an active loop is paused (it is not run while archived).

    Raises:
        ConflictError: ``loop is already archived: <x>``.
    """
    if loop.archived:
        raise ConflictError(f"loop is already archived: {ref}")
    return loop.with_changes(
        status="paused" if loop.status == "active" else loop.status,
        archived_at=to_iso(now),
        archived_from_status=loop.status,
        updated_at=to_iso(now),
    )


def unarchive(loop: Loop, now: datetime, ref: str) -> Loop:
    """No longer archived, with the status it had when it was archived (an active loop without a next slot is
    scheduled from ``now``, as ``resume`` does).

    Raises:
        ConflictError: ``loop is not archived: <x>``.
    """
    if not loop.archived:
        raise ConflictError(f"loop is not archived: {ref}")
    status = loop.archived_from_status or loop.status
    next_run_at = loop.next_run_at
    if status == "active" and next_run_at is None:
        next_run_at = to_iso(initial_next_run(loop.schedule, now, loop.timezone))
    return loop.with_changes(status=status, next_run_at=next_run_at, archived_at=None, archived_from_status=None,
                             updated_at=to_iso(now))


def rename(loop: Loop, name: str, now: datetime) -> Loop:
    """The loop under its new (validated) name; its id, and so its history, stay."""
    return loop.with_changes(name=name, updated_at=to_iso(now))
