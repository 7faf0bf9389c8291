"""Property tests for the pure scheduling domain: durations, cron, schedule shapes and slot maths."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from loopsq.domain.cron import next_cron_run, prev_cron_run, validate_cron
from loopsq.domain.durations import parse_duration
from loopsq.domain.schedules import Schedule, due_slots, parse_time
from loopsq.domain.text import shown
from loopsq.domain.timeutil import to_ms
from loopsq.errors import ValidationError

EXAMPLES = settings(max_examples=int(os.environ.get("LOOPSQ_FUZZ_EXAMPLES", "300")), deadline=None, database=None)
ZONES = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "America/Santiago",
]
MOMENTS = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2060, 1, 1)).map(
    lambda moment: moment.replace(microsecond=moment.microsecond // 1000 * 1000, tzinfo=UTC)
)


def _transitions(tz: str) -> list[datetime]:
    """The hours of 2026 at the end of which the zone's UTC offset changes (DST starts and ends)."""
    zone, hour = ZoneInfo(tz), datetime(2026, 1, 1, tzinfo=UTC)
    found = []
    while hour.year == 2026:
        if hour.astimezone(zone).utcoffset() != (hour + timedelta(hours=1)).astimezone(zone).utcoffset():
            found.append(hour)
        hour += timedelta(hours=1)
    return found or [datetime(2026, 1, 1, tzinfo=UTC)]


TRANSITIONS = {tz: _transitions(tz) for tz in ZONES}


def _pick(tz: str, near: bool, moment: datetime, index: int, minutes: int, ms: int) -> tuple[str, datetime]:
    if not near:
        return tz, moment
    edges = TRANSITIONS[tz]
    return tz, edges[index % len(edges)] + timedelta(minutes=minutes, milliseconds=ms)


# A zone and a moment, half of the time within two hours of one of the zone's DST changes.
ZONED_MOMENTS = st.builds(
    _pick,
    st.sampled_from(ZONES),
    st.booleans(),
    MOMENTS,
    st.integers(0, 7),
    st.integers(-120, 120),
    st.sampled_from([0, 0, 1, 999, 30_000, 59_999]),
)

# --- A small standard-cron model, independent of croniter, to check what croniter is made to do. ---
FIELD_BOUNDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
NAMES = [{}, {}, {}, {"jan": 1, "feb": 2, "jun": 6, "dec": 12}, {"sun": 0, "mon": 1, "fri": 5, "sat": 6}]


def _range(first: str, last: str, step: str | None, index: int) -> str:
    first, last = sorted((first, last), key=lambda token: _value(token, index))
    return f"{first}-{last}" + ("" if step is None else f"/{step}")


def cron_parts(index: int) -> st.SearchStrategy[str]:
    low, high = FIELD_BOUNDS[index]
    value = st.integers(low, high).map(str)
    if NAMES[index]:
        value = value | st.sampled_from(sorted(NAMES[index]))
    step = st.integers(1, high + 1).map(str)
    return st.one_of(
        step.map(lambda s: f"*/{s}"),
        value,
        st.tuples(value, step).map(lambda pair: f"{pair[0]}/{pair[1]}"),
        st.tuples(value, value, st.none() | step).map(lambda triple: _range(*triple, index)),
    )


def _agreed_day_fields(fields: tuple[str, ...]) -> bool:
    """Day-field combinations where every cron agrees: one is exactly "*", or neither uses "*"."""
    day, weekday = fields[2], fields[4]
    return day == "*" or weekday == "*" or ("*" not in day and "*" not in weekday)


CRON_FIELDS = [st.just("*") | st.lists(cron_parts(i), min_size=1, max_size=2).map(",".join) for i in range(5)]
CRON_EXPRESSIONS = st.tuples(*CRON_FIELDS).filter(_agreed_day_fields).map(" ".join)


def _value(token: str, index: int) -> int:
    return int(token) if token.isdigit() else NAMES[index][token]


def _expand(field: str, index: int) -> set[int]:
    low, high = FIELD_BOUNDS[index]
    values: set[int] = set()
    for part in field.split(","):
        span, _, step = part.partition("/")
        if span == "*":
            first, last = low, high
        elif "-" in span:
            first, last = (_value(token, index) for token in span.split("-"))
        else:
            first = _value(span, index)
            last = high if step else first
        values.update(range(first, last + 1, int(step or 1)))
    return {0 if index == 4 and value == 7 else value for value in values}


def standard_matcher(expression: str) -> Callable[[datetime], bool]:
    """Vixie cron's reading of an expression: a test for naive wall-clock times."""
    fields = expression.split()
    minute, hour, day, month, weekday = (_expand(field, i) for i, field in enumerate(fields))
    either = fields[2] != "*" and fields[4] != "*"

    def matches(wall: datetime) -> bool:
        day_ok, weekday_ok = wall.day in day, wall.isoweekday() % 7 in weekday
        days_ok = (day_ok or weekday_ok) if either else (day_ok and weekday_ok)
        return wall.minute in minute and wall.hour in hour and wall.month in month and days_ok

    return matches


def _valid(expression: str) -> str:
    try:
        return validate_cron(expression)
    except ValidationError:
        assume(False)
        raise


# --- Nothing but ValidationError, whatever the input. ---

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=8,
)
SCHEDULE_KEYS = st.sampled_from(["type", "at", "everyMs", "anchor", "expression", "minIntervalMs"])
SCHEDULE_VALUES = (
    JSON
    | st.sampled_from(
        ["once", "interval", "cron", "dynamic", "fixed_rate", "fixed_delay", "* * * * *", "@daily"]
    )
    | st.datetimes().map(lambda moment: moment.isoformat())
)


@EXAMPLES
@given(st.text() | st.text(alphabet="0123456789.msdhe -+", max_size=12))
def test_parse_duration_raises_only_validation_errors(text: str) -> None:
    try:
        assert parse_duration(text) >= 0
    except ValidationError as exc:
        assert str(exc) == f"invalid duration: {shown(text)}"


@EXAMPLES
@given(st.text() | st.text(alphabet="0123456789*/-,LWH#?RMONJAFEBSUN@ daily", max_size=30) | CRON_EXPRESSIONS)
def test_validate_cron_raises_only_validation_errors(text: str) -> None:
    with contextlib.suppress(ValidationError):
        assert validate_cron(text) == " ".join(text.split())


@EXAMPLES
@given(JSON | st.dictionaries(SCHEDULE_KEYS, SCHEDULE_VALUES, max_size=4))
def test_schedule_from_dict_raises_only_validation_errors(value: Any) -> None:
    try:
        schedule = Schedule.from_dict(value)
    except ValidationError:
        return
    assert Schedule.from_dict(schedule.to_dict()) == schedule


@EXAMPLES
@given(
    st.text()
    | st.datetimes().map(lambda moment: moment.isoformat())
    | st.datetimes(timezones=st.timezones()).map(str),
    st.sampled_from(ZONES),
)
def test_parse_time_raises_only_validation_errors(text: str, tz: str) -> None:
    try:
        moment = parse_time(text, tz, "--at")
    except ValidationError as exc:
        assert str(exc) == f"invalid --at: {shown(text)}"
        return
    assert moment.tzinfo is UTC
    assert moment.microsecond % 1000 == 0


# --- Cron: strictly after, a real match, at its first occurrence, and nothing skipped. ---


@EXAMPLES
@given(CRON_EXPRESSIONS, ZONED_MOMENTS)
def test_next_cron_run_is_the_first_standard_match_strictly_after_its_input(
    expression: str, zoned: tuple[str, datetime]
) -> None:
    tz, after = zoned
    _valid(expression)
    zone, matches = ZoneInfo(tz), standard_matcher(expression)
    result = next_cron_run(expression, after, tz)
    assert result > after
    assert result.tzinfo is UTC
    wall = result.astimezone(zone)
    assert wall.fold == 0  # a repeated wall time runs at its first occurrence
    assert matches(wall.replace(tzinfo=None))
    # Nothing earlier qualifies: walked minute by minute over the first six hours after ``after``.
    minute = (after + timedelta(minutes=1)).replace(second=0, microsecond=0)
    while minute < min(result, after + timedelta(hours=6)):
        local = minute.astimezone(zone)
        assert local.fold == 1 or not matches(local.replace(tzinfo=None)), minute
        minute += timedelta(minutes=1)


@EXAMPLES
@given(
    st.datetimes(timezones=st.just(UTC)), st.sampled_from(ZONES), st.sampled_from(["0 0 * * *", "@yearly"])
)
def test_cron_runs_at_the_ends_of_the_calendar_raise_only_validation_errors(
    moment: datetime, tz: str, expression: str
) -> None:
    with contextlib.suppress(ValidationError):
        assert next_cron_run(expression, moment, tz) > moment
    latest = prev_cron_run(expression, moment, tz)
    assert latest is None or latest <= moment


@EXAMPLES
@given(
    st.sampled_from(
        ["* * * * *", "*/7 * * * *", "30 1,2 * * *", "0 */3 * * *", "15 2 * * 0", "*/30 0-3 * * *"]
    ),
    ZONED_MOMENTS,
    st.integers(0, 180),
)
def test_prev_cron_run_agrees_with_stepping_forward(
    expression: str, zoned: tuple[str, datetime], minutes: int
) -> None:
    tz, start = zoned
    now = start + timedelta(minutes=minutes)
    stepped = None
    cursor = next_cron_run(expression, start - timedelta(milliseconds=1), tz)
    while cursor <= now:
        stepped, cursor = cursor, next_cron_run(expression, cursor, tz)
    latest = prev_cron_run(expression, now, tz)
    if stepped is None:
        assert latest is None or latest < start
    else:
        assert latest == stepped


# --- Interval due slots are never in the future and stay on the schedule's phase. ---


@EXAMPLES
@given(
    st.integers(1, 10 * 86_400_000),
    MOMENTS,
    st.integers(0, 3 * 365 * 86_400_000),
    st.sampled_from(["none", "latest", "all"]),
    st.integers(0, 60),
)
def test_interval_due_slots_are_not_after_now_and_on_phase(
    every_ms: int, next_run_at: datetime, behind_ms: int, catch_up: str, limit: int
) -> None:
    now = next_run_at + timedelta(milliseconds=behind_ms)
    slots = due_slots(
        schedule=Schedule(type="interval", every_ms=every_ms),
        status="active",
        next_run_at=next_run_at,
        expires_at=None,
        retry_scheduled_for=None,
        catch_up=catch_up,
        catch_up_limit=limit,
        tz="UTC",
        now=now,
    )
    assert 1 <= len(slots) <= max(1, limit)
    assert slots == sorted(set(slots))
    for slot in slots:
        assert next_run_at <= slot <= now
        assert (to_ms(slot) - to_ms(next_run_at)) % every_ms == 0
    if catch_up == "latest":
        assert to_ms(slots[0]) + every_ms > to_ms(now)
