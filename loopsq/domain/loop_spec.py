"""Building a new loop from a create request: validation of every field, and the reference's defaults.

The request is the camelCase body the SDK and the HTTP API accept (the CLI maps its flags onto it). Every
problem raises ``ValidationError`` with a message that names the field and quotes the value; nothing is stored
by this module.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from loopsq.domain import limits, models
from loopsq.domain.agent_options import with_creation_defaults
from loopsq.domain.checks import check_length, check_visible, first_compatibility_form, whole
from loopsq.domain.cron import host_timezone_name, validate_timezone
from loopsq.domain.durations import format_duration
from loopsq.domain.jitter import jittered, validate_jitter
from loopsq.domain.loop_features import feature_fields
from loopsq.domain.models import Loop
from loopsq.domain.schedules import CATCH_UP_POLICIES, Schedule, initial_next_run, parse_time
from loopsq.domain.tags import validate_tags
from loopsq.domain.targets import validate_target
from loopsq.domain.text import quoted
from loopsq.domain.timeutil import gen_id, to_iso
from loopsq.errors import ValidationError

MAX_NAME_LENGTH = limits.MAX_NAME_LENGTH


def show(value: Any) -> str:
    """A short, quoted, escaped rendering of a user value for error messages (``text.quoted``)."""
    return quoted(value)


def validate_name(value: Any, field: str = "name") -> str:
    """A loop name: a string of at most ``MAX_NAME_LENGTH`` characters that, trimmed of whitespace, is not empty
    and has no control, format, bidi or zero-width character (``checks.INVISIBLE_CATEGORIES``); returned trimmed
    and in Unicode's composed form (NFC), so that a composed and a decomposed ``é`` name one loop. A character
    with a compatibility form (``checks.is_compatibility_form``: fullwidth or styled letters, ligatures) would make
    a second loop look like the first: it is refused, naming the plain spelling (NFKC)."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f"loop name must not be empty, got {show(value)}")
    check_length(value, field, MAX_NAME_LENGTH)
    trimmed = check_visible(value.strip(), field)
    index = first_compatibility_form(trimmed)
    if index is not None:
        plain = unicodedata.normalize("NFKC", trimmed)
        raise ValidationError(f"{field} must not contain compatibility characters such as fullwidth or styled "
                              f"letters, ligatures or no-break spaces (U+{ord(trimmed[index]):04X} at position "
                              f"{index + 1}): write {show(plain)}, got {show(value)}")
    return unicodedata.normalize("NFC", trimmed)


def _positive_int(body: Mapping[str, Any], key: str, default: int | None, maximum: int = limits.MAX_COUNT,
                  minimum: int = 1) -> int | None:
    value = whole(body.get(key))
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValidationError(f"{key} must be a positive integer, got {show(value)}")
    if value < minimum:
        raise ValidationError(f"{key} must be at least {minimum} ({format_duration(minimum)}), got {show(value)}")
    if value > maximum:
        raise ValidationError(f"{key} must be at most {maximum}, got {show(value)}")
    return value


def _breaker(body: Mapping[str, Any]) -> int:
    """``pauseAfterFailures``: a whole number up to ``MAX_COUNT``, 0 turning the breaker off; absent or null: the
    default breaker, ``DEFAULT_PAUSE_AFTER_FAILURES`` (stored explicitly, so the loop keeps it whatever later
    versions default to)."""
    value = whole(body.get("pauseAfterFailures"))
    if value is None:
        return models.DEFAULT_PAUSE_AFTER_FAILURES
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValidationError(
            f"pauseAfterFailures must be a whole number (0 turns the circuit breaker off), got {show(value)}")
    if value > limits.MAX_COUNT:
        raise ValidationError(f"pauseAfterFailures must be at most {limits.MAX_COUNT}, got {show(value)}")
    return int(value)


def _check_interval(schedule: Schedule) -> None:
    """An interval loop's ``everyMs`` and a dynamic loop's ``minIntervalMs`` are at least ``MIN_EVERY_MS``."""
    for kind, label, value in (("interval", "interval everyMs", schedule.every_ms),
                               ("dynamic", "dynamic minIntervalMs", schedule.min_interval_ms)):
        if schedule.type == kind and value is not None and value < limits.MIN_EVERY_MS:
            raise ValidationError(
                f"{label} must be at least {limits.MIN_EVERY_MS} ({format_duration(limits.MIN_EVERY_MS)}), "
                f"got {value}"
            )


#: The first date a once loop's ``at`` may be written with. A day after the epoch, so that no offset or time zone
#: (at most 14 h) can put it before 1970-01-01T00:00:00Z, when no scheduler would ever fire it; and a rule on the
#: text alone, which the API's document states exactly (``web.body_schemas``: a pattern).
FIRST_ONCE_DATE = "1970-01-02"


def before_first_once_date(text: str) -> bool:
    """Whether a time as written (``YYYY-MM-DD…``) falls before ``FIRST_ONCE_DATE``."""
    return text[:10] < FIRST_ONCE_DATE


def _check_once_at(schedule: Schedule, timezone: str) -> None:
    """A once loop's ``at`` is written ``FIRST_ONCE_DATE`` or later (see there)."""
    if schedule.type == "once" and schedule.at is not None:
        parse_time(schedule.at, timezone, "schedule.at")  # (a malformed one says so first)
        if before_first_once_date(schedule.at):
            raise ValidationError(f"schedule.at must be {FIRST_ONCE_DATE} or later, got {show(schedule.at)}")


def _choice(body: Mapping[str, Any], key: str, choices: tuple[str, ...], default: str) -> str:
    value = body.get(key)
    if value is None:
        return default
    if value not in choices:
        raise ValidationError(f"{key} must be one of {', '.join(choices)}, got {show(value)}")
    return str(value)


def new_loop(body: Mapping[str, Any], now: datetime, *, loop_id: str | None = None) -> Loop:
    """Validate a create request and return the new loop (status ``active``, first ``nextRunAt`` computed).

    ``loop_id``: the id to give it (an update validates the merged definition as a loop of the same id, so its
    jitter offset stays); a new id otherwise.

    Raises:
        ValidationError: for the first invalid field, in a fixed order (name, timezone, schedule, target,
            policies, expiry).
    """
    if not isinstance(body, Mapping):
        raise ValidationError(f"loop must be an object, got {show(body)}")
    name = validate_name(body.get("name"))
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise ValidationError(f"description must be a string, got {show(description)}")
    if description is not None:
        check_length(description, "description", limits.MAX_DESCRIPTION_LENGTH)
    tz_value = body.get("timezone")
    if tz_value is None:
        timezone = host_timezone_name()
    elif isinstance(tz_value, str):
        timezone = validate_timezone(check_length(tz_value, "timezone", limits.MAX_TIMEZONE_LENGTH))
    else:
        raise ValidationError(f"unknown timezone: {show(tz_value)}")
    schedule = Schedule.from_dict(body.get("schedule"))
    _check_interval(schedule)
    _check_once_at(schedule, timezone)
    loop_id = loop_id or gen_id()
    jitter_ms = validate_jitter(body.get("jitterMs"), schedule)
    schedule = jittered(schedule, loop_id, jitter_ms)
    target = with_creation_defaults(validate_target(body.get("target"), "target"))
    expires_at = _expiry(body.get("expiresAt"), timezone)
    expire_after = _positive_int(body, "expiresAfterRuns", None)
    loop = Loop(
        id=loop_id,
        name=name,
        description=description,
        schedule=schedule,
        target=target,
        timezone=timezone,
        created_at=to_iso(now),
        updated_at=to_iso(now),
        next_run_at=to_iso(initial_next_run(schedule, now, timezone)),
        catch_up=_choice(body, "catchUp", CATCH_UP_POLICIES, models.DEFAULT_CATCH_UP),
        catch_up_limit=_positive_int(body, "catchUpLimit", models.DEFAULT_CATCH_UP_LIMIT) or 0,
        overlap=_choice(body, "overlap", models.OVERLAP_POLICIES, models.DEFAULT_OVERLAP),
        max_attempts=_positive_int(body, "maxAttempts", models.DEFAULT_MAX_ATTEMPTS) or 0,
        retry_delay_ms=_positive_int(body, "retryDelayMs", models.DEFAULT_RETRY_DELAY_MS, limits.MAX_MS) or 0,
        retry_backoff=_choice(body, "retryBackoff", models.RETRY_BACKOFFS, "fixed"),
        retry_max_delay_ms=_positive_int(body, "retryMaxDelayMs", None, limits.MAX_MS),
        lease_ms=_positive_int(body, "leaseMs", models.DEFAULT_LEASE_MS, limits.MAX_MS, limits.MIN_LEASE_MS) or 0,
        expires_at=expires_at,
        pause_after_failures=_breaker(body),
        expires_after_runs=expire_after,
        success_streak=0 if expire_after else None,
        keep_runs=_positive_int(body, "keepRuns", None),
        jitter_ms=jitter_ms,
        tags=validate_tags(body.get("tags")),
        **feature_fields(body),
    )
    return loop


def _expiry(value: Any, timezone: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"invalid expiresAt: {show(value)}")
    return to_iso(parse_time(check_length(value, "expiresAt", limits.MAX_TIME_LENGTH), timezone, "expiresAt"))
