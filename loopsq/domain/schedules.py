"""Schedule specs and slot maths: the first run, the next slot after a run, and the slots due now (§3.3-§3.5).

Pure functions: the time is always a parameter. Datetimes are aware UTC with millisecond precision, and
interval arithmetic is done in integer milliseconds so that a ten-year downtime costs as much as a minute's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from loopsq.domain.cron import load_zone, next_cron_run, prev_cron_run, validate_cron
from loopsq.domain.durations import MAX_DURATION_MS
from loopsq.domain.text import quoted, shown
from loopsq.domain.timeutil import from_ms, to_ms, truncate_ms
from loopsq.errors import ValidationError

SCHEDULE_TYPES = ("once", "interval", "cron", "dynamic")
ANCHORS = ("fixed_rate", "fixed_delay")
CATCH_UP_POLICIES = ("none", "latest", "all")
DEFAULT_MIN_INTERVAL_MS = 60_000
#: The earliest time a once loop may be set for: the scheduler's timers hold epoch milliseconds, and a slot before
#: the epoch would never fire (it is refused at creation instead).
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Schedule:
    """When a loop runs: ``once`` at a time, every ``every_ms``, on a cron expression, or ``dynamic``.

    Construction validates the fields the type needs and fills the reference's defaults (anchor
    ``fixed_rate``, ``min_interval_ms`` 60 000) and normalises a cron expression, so equal schedules compare
    equal and ``Schedule.from_dict(s.to_dict()) == s``.
    """

    type: str
    at: str | None = None
    every_ms: int | None = None
    anchor: str | None = None
    expression: str | None = None
    min_interval_ms: int | None = None
    #: loopsq addition (``--jitter``): every slot of an interval or cron schedule is this much later than the
    #: schedule says (a deterministic per-loop offset, ``domain.jitter``); None: no offset.
    offset_ms: int | None = None

    def __post_init__(self) -> None:
        if self.type not in SCHEDULE_TYPES:
            raise ValidationError(f"schedule.type must be once, interval, cron or dynamic, got {_render(self.type)}")
        if self.type == "once":
            if not isinstance(self.at, str):
                raise ValidationError(f"invalid schedule.at: {_bare(self.at)}")
            parse_time(self.at, "UTC", "schedule.at")  # syntax only; the zone is applied at use
        elif self.type == "interval":
            _check_ms(self.every_ms, "interval everyMs")
            anchor = "fixed_rate" if self.anchor is None else self.anchor
            if anchor not in ANCHORS:
                raise ValidationError(f"schedule.anchor must be fixed_rate or fixed_delay, got {_render(anchor)}")
            object.__setattr__(self, "anchor", anchor)
        elif self.type == "cron":
            if not isinstance(self.expression, str):
                raise ValidationError(f"schedule.expression must be a string, got {_render(self.expression)}")
            object.__setattr__(self, "expression", validate_cron(self.expression))
        else:
            minimum = DEFAULT_MIN_INTERVAL_MS if self.min_interval_ms is None else self.min_interval_ms
            _check_ms(minimum, "dynamic minIntervalMs")
            object.__setattr__(self, "min_interval_ms", minimum)

    def to_dict(self) -> dict[str, Any]:
        """Return the reference's camelCase JSON shape for this schedule."""
        if self.type == "once":
            return {"type": "once", "at": self.at}
        offset = {"offsetMs": self.offset_ms} if self.offset_ms else {}
        if self.type == "interval":
            return {"type": "interval", "everyMs": self.every_ms, "anchor": self.anchor, **offset}
        if self.type == "cron":
            return {"type": "cron", "expression": self.expression, **offset}
        return {"type": "dynamic", "minIntervalMs": self.min_interval_ms}

    @classmethod
    def from_dict(cls, d: Any) -> Schedule:
        """Build a schedule from its JSON shape (e.g. ``{"type": "interval", "everyMs": 60000}``).

        Keys that the type does not use are ignored. Whole-number floats (``60000.0``) are accepted as ms.

        Raises:
            ValidationError: naming the field and quoting the value, e.g. ``interval everyMs must be > 0, got 0``.
        """
        if not isinstance(d, dict):
            raise ValidationError("schedule must be an object")
        kind = d.get("type")
        if kind == "once":
            at = d.get("at")
            if not isinstance(at, str):
                raise ValidationError(f"invalid schedule.at: {_bare(at)}")
            return cls(type="once", at=at)
        if kind == "interval":
            return cls(
                type="interval",
                every_ms=_coerce_ms(d.get("everyMs"), "interval everyMs"),
                anchor=d.get("anchor"),
                offset_ms=_offset(d),
            )
        if kind == "cron":
            return cls(type="cron", expression=d.get("expression"), offset_ms=_offset(d))
        if kind == "dynamic":
            raw = d.get("minIntervalMs")
            return cls(
                type="dynamic",
                min_interval_ms=None if raw is None else _coerce_ms(raw, "dynamic minIntervalMs"),
            )
        raise ValidationError(f"schedule.type must be once, interval, cron or dynamic, got {_render(kind)}")


def _offset(d: dict[str, Any]) -> int | None:
    """A stored schedule's ``offsetMs`` (written by loopsq from ``jitterMs``; anything else counts as none)."""
    value = d.get("offsetMs")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_DURATION_MS else None


def cron_next(schedule: Schedule, after: datetime, tz: str) -> datetime:
    """The cron schedule's first slot after ``after``, with the schedule's offset (``offset_ms``) applied."""
    offset = schedule.offset_ms or 0
    return _shift(next_cron_run(_expression(schedule), _shift(after, -offset), tz), offset)


def cron_prev(schedule: Schedule, before: datetime, tz: str) -> datetime | None:
    """The cron schedule's last slot at or before ``before`` (as ``prev_cron_run``), with its offset applied."""
    offset = schedule.offset_ms or 0
    found = prev_cron_run(_expression(schedule), _shift(before, -offset), tz)
    return None if found is None else _shift(found, offset)


def _render(value: Any) -> str:
    """A value as these messages quote it: a string as ``'text'`` (short, escaped), a number or None as its
    ``repr``, anything else as its short JSON."""
    if isinstance(value, str):
        return "'" + shown(value).replace("'", "\\'") + "'"
    if value is None or isinstance(value, bool | float) or (isinstance(value, int) and abs(value) < 10**30):
        return repr(value)
    return quoted(value)


def _bare(value: Any) -> str:
    """A value quoted without quotes (``invalid schedule.at: nope``), short and escaped."""
    return shown(value) if isinstance(value, str) else _render(value)


def parse_time(text: str, tz: str, field: str) -> datetime:
    """Parse a user-given absolute time (``--at``, ``--expires-at``).

    Any ISO-8601 form ``datetime.fromisoformat`` accepts, plus a trailing ``Z``. A value without an offset
    (including a bare date) is wall time in ``tz``: a repeated time resolves to its first occurrence and a
    time inside a spring-forward gap moves forward by the gap, as a JS ``Date`` does.

    Args:
        text: The time as given.
        tz: The IANA zone for values without an offset.
        field: The field name used in the error message.

    Returns:
        An aware UTC datetime truncated to milliseconds.

    Raises:
        ValidationError: ``invalid <field>: <text>``, or ``unknown timezone: <tz>``.
    """
    zone = load_zone(tz)
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(raw)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=zone)
        return truncate_ms(moment.astimezone(UTC))
    except (ValueError, OverflowError):
        raise ValidationError(f"invalid {field}: {shown(text)}") from None


def initial_next_run(schedule: Schedule, start: datetime, tz: str) -> datetime:
    """Return a new loop's first ``nextRunAt`` (§3.3).

    ``once`` runs at ``at`` (a past time means due now); ``interval`` one interval after ``start``; ``cron`` at
    the first match after ``start``; ``dynamic`` ``minIntervalMs`` after ``start``.

    Raises:
        ValidationError: for a bad ``at``, expression or zone.
    """
    if schedule.type == "once":
        return parse_time(schedule.at or "", tz, "schedule.at")
    if schedule.type == "interval":
        return _shift(start, _every(schedule) + (schedule.offset_ms or 0))
    if schedule.type == "cron":
        return cron_next(schedule, start, tz)
    return _shift(start, schedule.min_interval_ms or DEFAULT_MIN_INTERVAL_MS)


def compute_next_after(
    schedule: Schedule, scheduled_for: datetime, finished_at: datetime, tz: str
) -> datetime | None:
    """Return the slot after a run of ``scheduled_for`` that finished at ``finished_at`` (§3.4).

    ``once`` has none (the loop stops). ``interval`` adds ``everyMs`` to ``scheduled_for`` (fixed_rate) or
    ``finished_at`` (fixed_delay) and skips whole intervals until the slot is after ``finished_at``, so phase
    is kept and nothing is scheduled in the past. ``cron`` takes the first match after both times.
    ``dynamic`` is ``finished_at + minIntervalMs``.
    """
    if schedule.type == "once":
        return None
    if schedule.type == "interval":
        every = _every(schedule)
        base = finished_at if schedule.anchor == "fixed_delay" else scheduled_for
        first, finished = to_ms(base) + every, to_ms(finished_at)
        if first <= finished:
            first += ((finished - first) // every + 1) * every
        return _from_ms(first)
    if schedule.type == "cron":
        upcoming = cron_next(schedule, scheduled_for, tz)
        # Stepping match by match until past finished_at ends at the first match after finished_at.
        return cron_next(schedule, finished_at, tz) if upcoming <= finished_at else upcoming
    return _shift(finished_at, schedule.min_interval_ms or DEFAULT_MIN_INTERVAL_MS)


def due_slots(
    *,
    schedule: Schedule,
    status: str,
    next_run_at: datetime | None,
    expires_at: datetime | None,
    retry_scheduled_for: datetime | None,
    catch_up: str,
    catch_up_limit: int,
    tz: str,
    now: datetime,
) -> list[datetime]:
    """Return the slots a loop should run now, oldest first (§3.5).

    Nothing is due for a missing ``next_run_at``, a status other than ``active``, an expiry at or before
    ``now``, or a ``next_run_at`` after ``now``. A pending retry wins over catch-up. ``once`` and ``dynamic``
    run ``next_run_at``. Interval and cron loops follow ``catch_up``: ``none`` runs ``next_run_at``;
    ``latest`` the last slot not after ``now``; ``all`` every slot from ``next_run_at`` to ``now``, but only
    the first ``catch_up_limit`` of them (the oldest, as the reference does); the rest are skipped when the
    loop advances past them. A limit below 1 counts as 1, since an empty list would leave a due loop stuck.

    Raises:
        ValidationError: for an unknown ``catch_up`` policy.
    """
    if next_run_at is None or status != "active" or next_run_at > now:
        return []
    if expires_at is not None and expires_at <= now:
        return []
    if retry_scheduled_for is not None:
        return [retry_scheduled_for]
    if catch_up not in CATCH_UP_POLICIES:
        raise ValidationError(f"catchUp must be none, latest or all, got {_render(catch_up)}")
    if schedule.type in ("once", "dynamic") or catch_up == "none":
        return [next_run_at]
    limit = max(1, catch_up_limit)
    if schedule.type == "interval":
        every, first = _every(schedule), to_ms(next_run_at)
        behind = (to_ms(now) - first) // every
        if catch_up == "latest":
            return [_from_ms(first + behind * every)]
        return [_from_ms(first + i * every) for i in range(min(behind + 1, limit))]
    if catch_up == "latest":
        latest = cron_prev(schedule, now, tz)
        return [latest if latest is not None and latest > next_run_at else next_run_at]
    slots = [next_run_at]
    while len(slots) < limit:
        upcoming = cron_next(schedule, slots[-1], tz)
        if upcoming > now:
            break
        slots.append(upcoming)
    return slots


def _check_ms(value: object, label: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValidationError(f"{label} must be > 0, got {_render(value)}")
    if value > MAX_DURATION_MS:
        raise ValidationError(f"{label} must be at most {MAX_DURATION_MS} (100 years), got {_render(value)}")
    return value


def _coerce_ms(value: Any, label: str) -> Any:
    """JSON numbers may arrive as whole floats (``60000.0``); anything else is left for ``_check_ms``."""
    if isinstance(value, float) and math.isfinite(value):
        if not value.is_integer():
            raise ValidationError(f"{label} must be a whole number of milliseconds, got {_render(value)}")
        return int(value)
    return value


def _every(schedule: Schedule) -> int:
    return _check_ms(schedule.every_ms, "interval everyMs")


def _expression(schedule: Schedule) -> str:
    if schedule.expression is None:
        raise ValidationError("schedule.expression must be a string, got None")
    return schedule.expression


def _shift(moment: datetime, ms: int) -> datetime:
    return _from_ms(to_ms(moment) + ms)


def _from_ms(ms: int) -> datetime:
    try:
        return from_ms(ms)
    except OverflowError:
        raise ValidationError(f"time out of range: {ms} ms since the epoch") from None
