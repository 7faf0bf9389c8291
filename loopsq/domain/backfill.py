"""Backfill: the slots of a loop's schedule in a past range, each to run once as a normal run with its slot time.

Pure: the slots come from the loop's schedule (its jitter offset included); interval loops keep the phase of
their ``nextRunAt``. Only interval and cron loops have slots to backfill.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from loopsq.domain.models import Loop
from loopsq.domain.schedules import cron_next
from loopsq.domain.timeutil import from_iso, to_ms
from loopsq.errors import ValidationError

#: The most slots one backfill may span.
MAX_BACKFILL_SLOTS = 10_000
OVERLAPS = ("skip", "allow")


def backfill_slots(loop: Loop, start: datetime, end: datetime, now: datetime) -> list[datetime]:
    """Every slot of ``loop`` in ``[start, end]``, oldest first.

    Raises:
        ValidationError: ``--to must be after --from``, ``--to must not be in the future``, a loop that is not an
            interval or cron loop, or a range of more than ``MAX_BACKFILL_SLOTS`` slots.
    """
    if end <= start:
        raise ValidationError(f"--to must be after --from, got {_iso(end)} (from {_iso(start)})")
    if end > now:
        raise ValidationError(f"--to must not be in the future, got {_iso(end)}")
    schedule = loop.schedule
    slots: list[datetime] = []
    if schedule.type == "interval" and schedule.every_ms:
        every = schedule.every_ms
        anchor = to_ms(from_iso(loop.next_run_at or loop.created_at))
        first = anchor + -((anchor - to_ms(start)) // every) * every
        if (to_ms(end) - first) // every + 1 > MAX_BACKFILL_SLOTS:
            raise _too_many()
        at = first
        while at <= to_ms(end):
            slots.append(start + timedelta(milliseconds=at - to_ms(start)))
            at += every
        return slots
    if schedule.type == "cron":
        moment = cron_next(schedule, start - timedelta(milliseconds=1), loop.timezone)
        while moment <= end:
            if len(slots) >= MAX_BACKFILL_SLOTS:
                raise _too_many()
            slots.append(moment)
            moment = cron_next(schedule, moment, loop.timezone)
        return slots
    raise ValidationError(f"backfill needs an interval or cron loop; {loop.name} has a {schedule.type} schedule")


def _too_many() -> ValidationError:
    return ValidationError(f"--from/--to span more than {MAX_BACKFILL_SLOTS} slots; backfill a shorter range")


def _iso(moment: datetime) -> str:
    from loopsq.domain.timeutil import to_iso

    return to_iso(moment)
