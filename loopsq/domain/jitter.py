"""Jitter (``--jitter``, ``jitterMs``): a deterministic offset per loop that spreads the slots of loops sharing a
schedule, so that 1,000 loops on ``0 * * * *`` do not all start in the same second.

The offset is a hash of the loop's id modulo ``jitterMs``, fixed at creation and stored in the schedule
(``offsetMs``); every slot is that much later than the schedule says, and the slot recorded (``scheduledFor``) is
the jittered one. An interval loop keeps its phase from its jittered first slot.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from loopsq.domain import durations
from loopsq.domain.checks import whole
from loopsq.domain.schedules import Schedule
from loopsq.domain.text import quoted
from loopsq.errors import ValidationError

#: The widest jitter: a week (larger offsets would move a weekly cron slot past the next one).
MAX_JITTER_MS = 7 * durations.MS_PER_UNIT["d"]
JITTERED_TYPES = ("interval", "cron")


def offset_ms(loop_id: str, jitter_ms: int) -> int:
    """The loop's offset in ``[0, jitter_ms)``: the same for the same id, spread evenly across ids."""
    digest = hashlib.sha256(loop_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") % jitter_ms


def validate_jitter(value: Any, schedule: Schedule) -> int | None:
    """A create request's ``jitterMs``: a positive integer of at most ``MAX_JITTER_MS``, for interval and cron
    schedules."""
    value = whole(value)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValidationError(f"jitterMs must be a positive integer, got {quoted(value)}")
    if value > MAX_JITTER_MS:
        raise ValidationError(f"jitterMs must be at most {MAX_JITTER_MS} (7d), got {quoted(value)}")
    if schedule.type not in JITTERED_TYPES:
        raise ValidationError(f"jitterMs applies to interval and cron schedules, got a {schedule.type} schedule")
    return value


def jittered(schedule: Schedule, loop_id: str, jitter_ms: int | None) -> Schedule:
    """``schedule`` with the loop's offset (none without jitter, whatever offset the request carried)."""
    offset = offset_ms(loop_id, jitter_ms) if jitter_ms else 0
    return replace(schedule, offset_ms=offset or None)
