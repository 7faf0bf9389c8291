"""A loop's schedule in words and its next fire times: what ``loopsq next`` prints and the loop page shows.

Pure functions over a loop's camelCase dict (a stored loop or a mirror row), so the CLI and the dashboard list
the same instants. The times start at the loop's ``nextRunAt`` (its pending retry first, when it has one) and
step with the same rule the runner advances a loop by (``compute_next_after``), as if every run took no time:
for a ``fixed_delay`` interval they are the earliest the slots can come. ``once`` and ``dynamic`` schedules have
one known time; a loop that is not active, or whose ``expiresAt`` has passed, has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loopsq.domain.cron import load_zone
from loopsq.domain.durations import format_duration
from loopsq.domain.schedules import Schedule, compute_next_after
from loopsq.domain.timeutil import from_iso, to_iso

DEFAULT_COUNT = 10
MAX_COUNT = 100


@dataclass(frozen=True)
class FireTime:
    """One upcoming fire time, in the loop's zone and in UTC (ISO 8601, milliseconds)."""

    local: str
    utc: str
    retry: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"local": self.local, "utc": self.utc, **({"retry": True} if self.retry else {})}


def local_iso(moment: datetime, tz: str) -> str:
    """``moment`` in zone ``tz`` as ISO 8601 with milliseconds and its offset (``2026-12-01T09:00:00.000+01:00``)."""
    return moment.astimezone(load_zone(tz)).isoformat(timespec="milliseconds")


def fire_times(loop: Mapping[str, Any], count: int = DEFAULT_COUNT) -> list[FireTime]:
    """The loop's next ``count`` fire times (fewer when the schedule has fewer, none when it is not active)."""
    if loop.get("status") != "active" or loop.get("archivedAt") or count <= 0:
        return []
    schedule = Schedule.from_dict(loop.get("schedule"))
    tz = str(loop.get("timezone") or "UTC")
    expires = from_iso(str(loop["expiresAt"])) if loop.get("expiresAt") else None
    out: list[FireTime] = []
    retry_at = loop.get("retryAt")
    if isinstance(retry_at, str) and retry_at:
        at = from_iso(retry_at)
        out.append(FireTime(local_iso(at, tz), to_iso(at), retry=True))
    slot = from_iso(str(loop["nextRunAt"])) if loop.get("nextRunAt") else None
    while slot is not None and len(out) < count:
        if expires is not None and slot >= expires:
            break
        out.append(FireTime(local_iso(slot, tz), to_iso(slot)))
        if schedule.type in ("once", "dynamic"):
            break
        slot = compute_next_after(schedule, slot, slot, tz)
    return out[:count]


def schedule_in_words(schedule: Mapping[str, Any], timezone: str | None = None) -> str:
    """A schedule as a sentence: ``every 5m, on a fixed rate``, ``cron '0 9 * * 1-5' in Europe/Paris``, …"""
    kind = schedule.get("type")
    zone = f" in {timezone}" if timezone else ""
    if kind == "interval" and isinstance(schedule.get("everyMs"), int):
        every = format_duration(schedule["everyMs"])
        if schedule.get("anchor") == "fixed_delay":
            return f"every {every} after the previous run ends"
        return f"every {every}, on a fixed rate"
    if kind == "cron":
        return f"on cron '{schedule.get('expression')}'{zone}"
    if kind == "once":
        return f"once, at {schedule.get('at')}{zone}"
    if kind == "dynamic":
        minimum = schedule.get("minIntervalMs")
        gap = f", at least {format_duration(minimum)} apart" if isinstance(minimum, int) else ""
        return f"dynamic: each run sets the next{gap}"
    return str(kind or "?")


def policies_in_words(loop: Mapping[str, Any]) -> dict[str, str]:
    """The overlap, catch-up and retry policies, each in a few words."""
    overlap = str(loop.get("overlap") or "skip")
    catch_up = str(loop.get("catchUp") or "none")
    limit = loop.get("catchUpLimit")
    catch = {"none": "none: a missed slot is not run", "latest": "latest: only the last missed slot runs",
             "all": "all: every missed slot runs"}.get(catch_up, catch_up)
    if catch_up == "all" and isinstance(limit, int):
        catch += f" (at most {limit})"
    attempts = int(loop.get("maxAttempts") or 1)
    if attempts <= 1:
        retry = "no retries (1 attempt)"
    else:
        delay = format_duration(int(loop.get("retryDelayMs") or 0))
        backoff = str(loop.get("retryBackoff") or "fixed")
        retry = f"up to {attempts} attempts, {delay} apart ({backoff})"
        if loop.get("retryMaxDelayMs"):
            retry += f", at most {format_duration(int(loop['retryMaxDelayMs']))}"
    return {"overlap": f"{overlap}: " + {"skip": "a slot due while a run goes on is skipped",
                                          "allow": "runs may overlap",
                                          "replace": "a slot due while a run goes on cancels it and runs"}.get(overlap, overlap),
            "catchUp": catch, "retry": retry}


def offset_words(ms: int) -> str:
    """An offset in hours, minutes and seconds: ``2m13.456s``, ``1h0m5s``, ``0.25s``."""
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest // 1000}.{rest % 1000:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{seconds}"
    return f"{minutes}m{seconds}" if minutes else seconds


def jitter_of(loop: Mapping[str, Any]) -> dict[str, Any] | None:
    """A jittered loop's ``jitterMs`` and its offset (``schedule.offsetMs``, ``domain/jitter.py``) in words, for
    where its next run is shown (the times shown already include the offset); None without jitter."""
    jitter = loop.get("jitterMs")
    if not isinstance(jitter, int) or isinstance(jitter, bool) or jitter <= 0:
        return None
    offset = (loop.get("schedule") or {}).get("offsetMs")
    offset = offset if isinstance(offset, int) and not isinstance(offset, bool) and offset > 0 else 0
    return {"jitterMs": jitter, "jitter": format_duration(jitter), "offsetMs": offset, "offset": offset_words(offset)}


def jitter_in_words(loop: Mapping[str, Any]) -> str:
    """``, jitter 5m: this loop's slots are 2m13.5s after the schedule's`` for a jittered loop, else empty: said
    where fire times are listed, which already include the offset."""
    jitter = jitter_of(loop)
    if jitter is None:
        return ""
    return f", jitter {jitter['jitter']}: this loop's slots are {jitter['offset']} after the schedule's"
