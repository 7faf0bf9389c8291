"""Checks of the list filters the dashboard and the API share: a time range, a choice, a page size.

Each bad value is a ``ValidationError`` (400, the one error body) naming the parameter and quoting the value.
"""

from __future__ import annotations

from loopsq.domain import limits
from loopsq.domain.text import quoted
from loopsq.domain.timeutil import from_iso, to_iso
from loopsq.errors import ValidationError


def choice(name: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    """``value`` when it is one of ``allowed``; None when empty."""
    if value in (None, ""):
        return None
    if value not in allowed:
        raise ValidationError(f"{name} must be one of {', '.join(allowed)}, got {quoted(value)}")
    return value


def time(name: str, value: str | None) -> str | None:
    """An ISO 8601 time, normalised to loopsq's UTC form (milliseconds, ``Z``); None when empty."""
    if value in (None, ""):
        return None
    try:
        return to_iso(from_iso(str(value)))
    except (ValueError, TypeError):
        raise ValidationError(f"{name} must be an ISO 8601 time (e.g. 2026-12-01T09:00:00Z), got {quoted(value)}") \
            from None


def time_range(since: str | None, until: str | None) -> tuple[str | None, str | None]:
    """``[since, until)`` checked: each an ISO time, since before until."""
    start, end = time("since", since), time("until", until)
    if start and end and start >= end:
        raise ValidationError(f"since must be before until, got since={quoted(since)} until={quoted(until)}")
    return start, end


def page_size(value: str | None, default: int) -> int:
    """A page size from 1 to ``limits.MAX_PAGE_LIMIT``; ``default`` when empty."""
    if value in (None, ""):
        return default
    try:
        number = int(str(value))
    except ValueError:
        number = 0
    if not 1 <= number <= limits.MAX_PAGE_LIMIT:
        raise ValidationError(f"limit must be an integer from 1 to {limits.MAX_PAGE_LIMIT}, got {quoted(value)}")
    return number
