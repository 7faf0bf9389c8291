"""Standard 5-field cron, parsed and iterated by croniter, evaluated in an IANA time zone with loopsq's DST rule.

croniter only ever sees naive local wall-clock times. The DST rule is ours: a local time that does not exist
that day (spring-forward gap) is skipped; a local time that occurs twice (fall-back) runs once, at its first
occurrence. Only standard syntax is accepted: numbers, month and weekday names, ``*``, ``a-b``, ``/step``,
lists, and the ``@yearly``…``@hourly`` macros. croniter's extensions (``H``, ``R``, ``L``, ``W``, ``#``,
``?``, seconds and year fields, wrap-around ranges) are rejected.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from croniter import croniter

from loopsq.domain.text import shown
from loopsq.domain.timeutil import truncate_ms
from loopsq.errors import ValidationError

MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# How far a search for the next (or previous) match may go before the expression counts as never matching.
_SEARCH_SPAN = timedelta(days=3653)

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH_NAMES = {name: number for number, name in enumerate(_MONTHS, 1)}
_DOW_NAMES = {name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_NAMES: tuple[dict[str, int], ...] = ({}, {}, {}, _MONTH_NAMES, _DOW_NAMES)
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))  # croniter would quietly read day or month 0 as 1
_DOW_FIELD = 4
_DOW_MAX = 7  # standard cron accepts 7 for Sunday; croniter's own range for the field stops at 6
_MAX_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}

# One list element: ``*`` or a value, an optional ``-value`` and an optional ``/step``. Anything else is an
# extension or garbage. Values are capped at 6 digits so int() never meets a pathological string.
_PART = re.compile(r"(\*|\d{1,6}|[a-z]{3})(?:-(\d{1,6}|[a-z]{3}))?(?:/(\d{1,6}))?", re.ASCII | re.IGNORECASE)


class _Invalid(Exception):
    """Raised internally when a field is not standard cron syntax."""


def validate_cron(expression: str) -> str:
    """Check a cron expression and return it normalised.

    Args:
        expression: Five whitespace-separated fields (minute hour day-of-month month day-of-week) or one of the
            macros ``@yearly @annually @monthly @weekly @daily @midnight @hourly``.

    Returns:
        The expression stripped, with internal whitespace collapsed to single spaces.

    Raises:
        ValidationError: ``cron must have 5 fields, got N: "<expr>"``, ``invalid cron expression: "<expr>"`` or
            ``cron expression never matches: "<expr>"``.
    """
    return _compile(expression)[0]


def next_cron_run(expression: str, after: datetime, tz: str) -> datetime:
    """Return the first time strictly after ``after`` at which the expression matches in the zone ``tz``.

    Args:
        expression: A cron expression (validated here).
        after: An aware datetime (a naive one is taken as UTC).
        tz: The IANA zone whose wall clock the expression is read in.

    Returns:
        An aware UTC datetime truncated to milliseconds.

    Raises:
        ValidationError: for an invalid expression or zone, or when no match exists within ten years.
    """
    normalised, template = _compile(expression)
    zone = load_zone(tz)
    after_utc = _as_utc(after)
    try:
        start = after_utc.astimezone(zone).replace(tzinfo=None)
    except OverflowError:  # within a day of year 1 or 9999
        raise ValidationError(f'cron expression never matches: "{shown(normalised)}"') from None
    for wall in _walk(template, start, normalised, backwards=False):
        instant = _first_instant(wall, zone)
        # After a fall-back, wall times just past ``start`` can map to instants before ``after``: keep going.
        if instant is not None and instant > after_utc:
            return truncate_ms(instant)
    raise AssertionError("unreachable: _walk raises when exhausted")  # pragma: no cover


def prev_cron_run(expression: str, at_or_before: datetime, tz: str) -> datetime | None:
    """Return the latest time not after ``at_or_before`` at which the expression matches in the zone ``tz``.

    It is the inverse of ``next_cron_run`` under the same DST rule, so the instants both walk through are the
    same set. Catch-up ``latest`` uses it to jump over long downtimes in one step.

    Args:
        expression: A cron expression (validated here).
        at_or_before: An aware datetime (a naive one is taken as UTC); a match exactly at it counts.
        tz: The IANA zone whose wall clock the expression is read in.

    Returns:
        An aware UTC datetime truncated to milliseconds, or None when nothing matched in the ten years before.

    Raises:
        ValidationError: for an invalid expression or zone.
    """
    normalised, template = _compile(expression)
    zone = load_zone(tz)
    limit = _as_utc(at_or_before)
    try:
        local = limit.astimezone(zone)
        start = local.replace(tzinfo=None)
        if local.fold:
            # In the second pass of a repeated hour every wall time of that hour has already run (at its
            # first occurrence), so the search starts from the end of the repeated hour.
            start += (local.replace(fold=0).utcoffset() or timedelta()) - (local.utcoffset() or timedelta())
        # croniter's get_prev is strict; one second later makes a match at ``at_or_before`` itself count.
        start += timedelta(seconds=1)
        for wall in _walk(template, start, normalised, backwards=True):
            instant = _first_instant(wall, zone)
            if instant is not None and instant <= limit:
                return truncate_ms(instant)
    except (ValidationError, OverflowError):  # nothing in ten years, or the calendar's first day
        return None
    raise AssertionError("unreachable: _walk raises when exhausted")  # pragma: no cover


def host_timezone_name() -> str:
    """Return the host's IANA zone name: ``$TZ`` if valid, else the ``/etc/localtime`` link target, else UTC."""
    env = os.environ.get("TZ", "").removeprefix(":")
    for candidate in (env, _zone_from_path(env), _zone_from_path(os.path.realpath("/etc/localtime"))):
        if candidate and _is_zone(candidate):
            return candidate
    return "UTC"


def load_zone(name: str) -> ZoneInfo:
    """Load an IANA time zone.

    Args:
        name: An IANA zone name such as ``Europe/Berlin`` or ``UTC``.

    Returns:
        The zone.

    Raises:
        ValidationError: ``unknown timezone: <name>`` for anything zoneinfo cannot load.
    """
    try:
        return ZoneInfo(name)
    # zoneinfo raises ZoneInfoNotFoundError, ValueError (paths, NULs), IsADirectoryError, other OSErrors and
    # TypeError depending on the name; every one of them means the same thing to the user.
    except Exception as exc:
        raise ValidationError(f"unknown timezone: {name}") from exc


def validate_timezone(name: str) -> str:
    """Return ``name`` unchanged if it is a loadable IANA zone.

    Raises:
        ValidationError: ``unknown timezone: <name>``.
    """
    load_zone(name)
    return name


@functools.lru_cache(maxsize=1024)
def _compile(expression: str) -> tuple[str, croniter]:
    """Validate and parse once per distinct expression: (normalised text, croniter template to copy)."""
    fields = expression.split()
    normalised = " ".join(fields)
    if len(fields) == 1 and normalised.startswith("@"):
        macro = normalised.lower()
        if macro == "@reboot":
            raise ValidationError("@reboot is not supported")
        if macro not in MACROS:
            raise ValidationError(f'unknown cron macro: "{shown(normalised)}" (use one of {" ".join(MACROS)})')
        fields = MACROS[macro].split()
    if len(fields) != 5:
        raise ValidationError(f'cron must have 5 fields, got {len(fields)}: "{shown(normalised)}"')
    try:
        standard = " ".join(_standard_field(text, index) for index, text in enumerate(fields))
        template = croniter(standard, datetime(2000, 1, 1))
    # croniter signals bad syntax with several exception types; all mean "not a cron expression".
    except Exception as exc:
        raise ValidationError(f'invalid cron expression: "{shown(normalised)}"') from exc
    if _never_matches(template.expanded):
        raise ValidationError(f'cron expression never matches: "{shown(normalised)}"')
    return normalised, template


def _standard_field(text: str, index: int) -> str:
    """Reject non-standard syntax in one field and rewrite the forms croniter reads differently from cron.

    croniter reads an equal range (``5-5``, ``SUN-SUN``) as the whole cycle and stops the weekday field at 6,
    so ``1/2`` would miss Sunday (7); both are rewritten to what standard cron means.
    """
    parts = []
    for part in text.split(","):
        match = _PART.fullmatch(part)
        if match is None:
            raise _Invalid(part)
        first, last, step = match.groups()
        if step is not None and int(step) == 0:
            raise _Invalid(part)
        if first == "*":
            if last is not None:
                raise _Invalid(part)
            parts.append(part)
            continue
        low = _value(first, index)
        if last is None and step is not None and index == _DOW_FIELD:
            high = _DOW_MAX
        elif last is None:
            parts.append(str(low) if step is None else f"{low}/{step}")
            continue
        else:
            high = _value(last, index)
        if low > high:
            raise _Invalid(part)  # wrap-around ranges are a croniter extension
        if low == high:
            parts.append(str(low))
        else:
            parts.append(f"{low}-{high}" + ("" if step is None else f"/{step}"))
    return ",".join(parts)


def _value(token: str, index: int) -> int:
    value = int(token) if token.isdigit() else _NAMES[index].get(token.lower(), -1)
    low, high = _BOUNDS[index]
    if not low <= value <= high:
        raise _Invalid(token)
    return value


def _never_matches(expanded: Sequence[Sequence[object]]) -> bool:
    """True when the day-of-month list fits in none of the months (``0 0 30 2 *``).

    croniter ORs the two day fields only when both are restricted; then the weekday side always matches some
    day. Otherwise the days of the month decide, and February counts 29 days (leap years).
    """
    days, months, weekdays = expanded[2], expanded[3], expanded[4]
    if days == ["*"] or weekdays != ["*"]:
        return False
    month_numbers = range(1, 13) if months == ["*"] else months
    first_day = min(d for d in days if isinstance(d, int))
    return first_day > max(_MAX_DAYS[m] for m in month_numbers if isinstance(m, int))


def _walk(template: croniter, start: datetime, expression: str, *, backwards: bool) -> Iterator[datetime]:
    """Yield the naive wall-clock matches after (or before) ``start``, for at most ten years."""
    iterator = copy.copy(template)  # shallow: the parsed fields are shared read-only, the cursor is not
    try:
        end = start - _SEARCH_SPAN if backwards else start + _SEARCH_SPAN
    except OverflowError:
        end = datetime.min if backwards else datetime.max
    step = iterator.get_prev if backwards else iterator.get_next
    cursor: datetime | None = start
    while True:
        try:
            wall: datetime = step(datetime, start_time=cursor)
        # croniter gives up after 50 years or at the calendar's edge (ValueError, OverflowError).
        except (ValueError, OverflowError) as exc:
            raise ValidationError(f'cron expression never matches: "{expression}"') from exc
        if (wall < end) if backwards else (wall > end):
            raise ValidationError(f'cron expression never matches: "{expression}"')
        yield wall
        cursor = None


def _first_instant(wall: datetime, zone: ZoneInfo) -> datetime | None:
    """Map a naive wall time to UTC at its first occurrence (fold=0); None if it does not exist that day."""
    try:
        instant = wall.replace(tzinfo=zone).astimezone(UTC)
    except OverflowError:
        return None
    # A time inside a spring-forward gap does not survive the round trip back to wall time.
    if instant.astimezone(zone).replace(tzinfo=None) != wall:
        return None
    return instant


def _as_utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _zone_from_path(path: str) -> str:
    """``/usr/share/zoneinfo/Europe/Berlin`` -> ``Europe/Berlin``; '' when the path is not under zoneinfo."""
    _, marker, name = path.rpartition("/zoneinfo/")
    if not marker:
        return ""
    return name.removeprefix("posix/").removeprefix("right/")


def _is_zone(name: str) -> bool:
    try:
        load_zone(name)
    except ValidationError:
        return False
    return True
