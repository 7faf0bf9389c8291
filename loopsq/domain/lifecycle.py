"""Pure loop lifecycle transitions: pause, resume, stop (§3.10), with the reference's resume-after-stop fixed;
archive, unarchive and rename (0.3.15, 0.3.50).

Each function takes a loop and the current time and returns the loop as it should be stored next; none does I/O.
A command that finds the loop already where it would put it is a **no-op**: the very same loop is returned, so
the store writes nothing and appends no change (``pause`` on a paused loop, ``resume`` on an active one,
``stop`` on a stopped or expired one). A command that makes no sense for the loop's status is **refused** with
``ConflictError`` (exit code 2, HTTP 409), so the command's output never disagrees with ``show``:

- ``pause`` needs an active loop (a stopped or expired one is not scheduled: pausing it would make it look
  resumable to the same slot);
- ``resume`` refuses an expired loop (maintenance would expire it again at once) and a once loop whose one slot
  has already run (its runner would stop it again at once).
"""

from __future__ import annotations

from datetime import datetime

from loopsq.domain.models import Loop
from loopsq.domain.schedules import initial_next_run
from loopsq.domain.text import shown
from loopsq.domain.timeutil import from_iso, to_iso
from loopsq.errors import ConflictError


def _label(loop: Loop) -> str:
    return f"loop {shown(loop.name)} ({loop.id})"


def pause(loop: Loop, now: datetime, reason: str | None = None) -> Loop:
    """Status ``paused``; ``nextRunAt`` is kept so catch-up handles the missed slots on resume.

    A paused loop is returned unchanged (a no-op); a stopped or expired one is refused.
    """
    if loop.status == "paused":
        return loop
    if loop.status != "active":
        raise ConflictError(f"{_label(loop)} is {loop.status}: only an active loop can be paused")
    return loop.with_changes(status="paused", status_reason=reason, updated_at=to_iso(now))


def resume(loop: Loop, now: datetime, *, once_slot_ran: bool = False) -> Loop:
    """Status ``active``; a loop without a next run (stopped) is scheduled again from ``now``.

    The reference kept ``nextRunAt`` empty after ``stop``, so a resumed loop never ran again; loopsq computes the
    schedule's first slot after ``now``. A resume also clears a failure streak, the success streak of a loop that
    expires after N successful runs (an expired one starts a new count), and its recorded reason. An active loop
    is returned unchanged (a no-op).

    Args:
        loop: The stored loop.
        now: The current time.
        once_slot_ran: For a once loop, whether its one slot already has a run (the caller looks it up).

    Raises:
        ConflictError: for an expired loop past its ``expiresAt``, and for a once loop whose slot has run.
    """
    if loop.status == "active":
        return loop
    if loop.status == "expired" and loop.expires_at is not None and from_iso(loop.expires_at) <= now:
        raise ConflictError(f"{_label(loop)} expired at {loop.expires_at}: an expired loop cannot be resumed")
    next_run_at = loop.next_run_at
    if next_run_at is None:
        if loop.schedule.type == "once" and once_slot_ran:
            raise ConflictError(f"{_label(loop)} already ran its one slot ({loop.schedule.at}): nothing to resume")
        next_run_at = to_iso(initial_next_run(loop.schedule, now, loop.timezone))
    return loop.with_changes(
        status="active",
        next_run_at=next_run_at,
        status_reason=None,
        failure_streak=0,
        success_streak=0 if loop.success_streak is not None else None,
        updated_at=to_iso(now),
    )


def stop(loop: Loop, now: datetime) -> Loop:
    """Status ``stopped``; ``nextRunAt`` and any pending retry are cleared. A stopped or expired loop is returned
    unchanged (a no-op: neither runs again)."""
    if loop.status in ("stopped", "expired"):
        return loop
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
