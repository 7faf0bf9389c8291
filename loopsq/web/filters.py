"""Checks of the list filters the dashboard and the API share: a time range, a choice, a page size, a tag filter.

Each bad value is a ``ValidationError`` (400, the one error body) naming the parameter and quoting the value.
"""

from __future__ import annotations

import re

from loopsq.domain import limits
from loopsq.domain.tags import parse_tags
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


#: The times a filter takes: RFC 3339 (``T`` and ``Z`` upper case, seconds required, up to 9 fraction digits,
#: offsets ``±HH:MM``) in the years 1970 to 9998 (no offset can take those outside what Python's datetime holds).
#: The API documents it with ``format: date-time`` (so a 30 February is outside the schema as it is outside what
#: the server takes); ASCII digits only.
TIME_PATTERN = (r"^(?:19[7-9][0-9]|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9])-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])"
                r"T(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])$")
_TIME = re.compile(TIME_PATTERN)


def time(name: str, value: str | None, *, blank_is_none: bool = True) -> str | None:
    """An RFC 3339 time (``TIME_PATTERN``), normalised to loopsq's UTC form (milliseconds, ``Z``); None when absent,
    or empty with ``blank_is_none`` (a dashboard form's empty field; the API refuses it)."""
    if value is None or (value == "" and blank_is_none):
        return None
    try:
        if not _TIME.fullmatch(str(value)):
            raise ValueError(value)
        return to_iso(from_iso(str(value)))
    except (ValueError, TypeError, OverflowError):
        raise ValidationError(f"{name} must be an ISO 8601 time (e.g. 2026-12-01T09:00:00Z), got {quoted(value)}") \
            from None


def time_range(since: str | None, until: str | None, *, blank_is_none: bool = True) -> tuple[str | None, str | None]:
    """``[since, until)`` checked: each an RFC 3339 time (``time``), since before until."""
    start, end = time("since", since, blank_is_none=blank_is_none), time("until", until, blank_is_none=blank_is_none)
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


#: The longest tag filter a dashboard form takes (``key:value`` pairs separated by spaces).
MAX_TAG_TEXT = 4000


def tag_text(value: str | None) -> tuple[str | None, dict[str, str]]:
    """A dashboard form's tag filter: ``key:value`` pairs separated by spaces, all of which must match; the text as
    shown back in the form (None when empty) and the tags.

    Raises:
        ValidationError: ``tag must be at most 4000 characters, got <n>``, or a bad pair as ``parse_tags`` names it.
    """
    text = (value or "").strip() or None
    if text and len(text) > MAX_TAG_TEXT:
        raise ValidationError(f"tag must be at most {MAX_TAG_TEXT} characters, got {len(text)}")
    return text, parse_tags(text.split() if text else (), "tag")
