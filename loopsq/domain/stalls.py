"""The progress watchdog's rules, without I/O: when an active loop counts as stalled (its next slot overdue past a
grace with no run of it going on), the causes it names, and what a stall record (``keys.stalls``) says.

``engine.stalls`` finds and repairs stalled loops; ``ops.doctor`` reports them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from loopsq.domain.durations import duration_setting
from loopsq.domain.models import Loop
from loopsq.domain.schedules import compute_next_after
from loopsq.domain.timeutil import from_iso, to_iso, to_ms

GRACE_MIN_ENV = "LOOPSQ_STALL_GRACE_MIN"
#: The least a loop may be overdue before it counts as stalled (``LOOPSQ_STALL_GRACE_MIN``); a loop's grace is
#: the larger of this and two of its cadences.
DEFAULT_GRACE_MIN_MS = 30_000
#: Refusals of one slot's claim within ``HOT_WINDOW_S`` past which the slot is a hot loop's and is given up.
HOT_REFUSALS = 5
HOT_WINDOW_S = 60
#: How long after a repair ``doctor`` still warns about it.
RECENT_REPAIR_MS = 3_600_000

#: A timer fired, its job hash says ``queued``, and no queue holds it (lost, e.g. in a failover).
LOST_FIRE_JOB = "lost_fire_job"
#: A slot whose claim can never pass (a claim key left behind): every fire is refused and re-armed at once.
HOT_LOOP = "hot_loop"
CAUSES = (LOST_FIRE_JOB, HOT_LOOP)
#: What each cause means, as logs and ``doctor`` say it (a hot loop's is the missed row's reason too).
CAUSE_TEXT = {LOST_FIRE_JOB: "its fire job was in no queue", HOT_LOOP: "a claim the slot can never pass"}


def grace_min_ms(env: Mapping[str, str] | None = None) -> int:
    """``LOOPSQ_STALL_GRACE_MIN`` (a duration such as ``30s``) in ms, default 30 s.

    Raises:
        ValidationError: a value that is not a duration above zero, naming the variable and quoting the value.
    """
    return duration_setting(os.environ if env is None else env, GRACE_MIN_ENV, DEFAULT_GRACE_MIN_MS, "30s")


def cadence_ms(loop: Loop, slot: datetime) -> int:
    """How far apart the loop's slots are around ``slot`` (0 for a loop that runs once)."""
    upcoming = compute_next_after(loop.schedule, slot, slot, loop.timezone)
    return max(0, to_ms(upcoming) - to_ms(slot)) if upcoming is not None else 0


def grace_ms(loop: Loop, slot: datetime, floor_ms: int) -> int:
    """How long the loop's slot ``slot`` may be overdue before the loop counts as stalled: max(2 x its cadence,
    ``floor_ms``)."""
    return max(2 * cadence_ms(loop, slot), floor_ms)


def overdue(loop: Loop, due: datetime | None, now: datetime, floor_ms: int) -> bool:
    """Whether the loop's next slot (or retry), due at ``due``, is overdue past its grace at ``now``."""
    if loop.status != "active" or due is None:
        return False
    return to_ms(now) - to_ms(due) > grace_ms(loop, due, floor_ms)


@dataclass(frozen=True)
class Stall:
    """A loop the watchdog found stalled: why, when, and whether it was repaired."""

    cause: str
    at: str
    repaired: bool

    def to_json(self) -> str:
        return json.dumps({"cause": self.cause, "at": self.at, "repaired": self.repaired}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Stall | None:
        """The record, None when unreadable."""
        try:
            data = json.loads(text)
            return cls(str(data["cause"]), str(data["at"]), bool(data["repaired"]))
        except (ValueError, KeyError, TypeError):
            return None

    def is_recent(self, now: datetime) -> bool:
        """Whether it happened within ``RECENT_REPAIR_MS`` of ``now``."""
        try:
            return to_ms(now) - to_ms(from_iso(self.at)) <= RECENT_REPAIR_MS
        except ValueError:
            return False

    def text(self) -> str:
        """``<cause>: <what it means>``."""
        return f"{self.cause}: {CAUSE_TEXT.get(self.cause, self.cause)}"


def stall_at(cause: str, now: datetime, *, repaired: bool) -> Stall:
    """The record of a stall found at ``now``."""
    return Stall(cause, to_iso(now), repaired)
