"""Clock, timestamps and ids: the reference's ISO-8601 UTC format with milliseconds and ``Z``; 12-hex ids.

Every timestamp loopsq stores or prints is ``YYYY-MM-DDTHH:MM:SS.sssZ`` in UTC, so that lexicographic order is
time order (the reference schema compares timestamps as strings). ``now()`` is the one patchable clock.

``now()`` is Redis's clock as this process last measured it: the host's time plus an offset that
``state.clock`` measures (``TIME``) at start and periodically and sets here, so that due slots, lease expiry and
lag are judged on one clock for every host (a host 30 s fast would otherwise run slots 30 s early). Until a
measurement it is the host's own time.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime, timedelta

_ISO_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


#: Redis's clock less this host's, as last measured (``set_clock_offset``); zero until then.
_offset = timedelta(0)


def now() -> datetime:
    """Return the current time on Redis's clock (the host's, corrected by the measured offset), UTC, truncated to
    milliseconds. Tests patch this function."""
    return truncate_ms(datetime.now(UTC) + _offset)


def host_now() -> datetime:
    """This host's own clock, uncorrected (what the offset is measured against)."""
    return datetime.now(UTC)


def set_clock_offset(ms: float) -> None:
    """Set the offset of Redis's clock from this host's (``state.clock`` measures it), in milliseconds."""
    global _offset
    _offset = timedelta(milliseconds=ms)


def clock_offset_ms() -> float:
    """The offset ``now()`` applies: Redis's clock less this host's, in milliseconds."""
    return _offset / timedelta(milliseconds=1)


def truncate_ms(dt: datetime) -> datetime:
    """Drop sub-millisecond precision (timestamps have millisecond resolution, as in the reference)."""
    return dt.replace(microsecond=dt.microsecond - dt.microsecond % 1000)


def to_iso(dt: datetime) -> str:
    """Format an aware datetime as ``YYYY-MM-DDTHH:MM:SS.sssZ`` in UTC (naive datetimes are taken as UTC)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    dt = dt.astimezone(UTC)
    # Not strftime: its %Y does not pad years before 1000 on glibc ("999-01-01"), which from_iso then refuses.
    return (f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}."
            f"{dt.microsecond // 1000:03d}Z")


def from_iso(value: str) -> datetime:
    """Parse a timestamp that loopsq itself wrote (or any ISO-8601 string with an offset) into aware UTC.

    Raises:
        ValueError: when the text is not an ISO-8601 timestamp with an offset.
    """
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        raise ValueError(f"timestamp has no UTC offset: {value}")
    return truncate_ms(dt.astimezone(UTC))


def is_iso(value: object) -> bool:
    """True when ``value`` is a string in loopsq's exact timestamp format."""
    return isinstance(value, str) and bool(_ISO_Z.match(value))


def to_ms(dt: datetime) -> int:
    """Milliseconds since the Unix epoch of an aware datetime."""
    return (dt - _EPOCH) // timedelta(milliseconds=1)


def from_ms(ms: int) -> datetime:
    """The aware UTC datetime ``ms`` milliseconds after the Unix epoch."""
    return _EPOCH + timedelta(milliseconds=ms)


def gen_id() -> str:
    """A new id: 12 lowercase hex characters from 6 random bytes, as the reference's ``genId()``."""
    return secrets.token_hex(6)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
