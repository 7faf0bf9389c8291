"""One clock: measure this process's offset to Redis's clock (``TIME``) and make ``timeutil.now()`` apply it.

Due slots, lease expiry, recovery and lag are judged against timestamps that many hosts write; judged on each
host's own clock, a host 30 s fast runs slots 30 s early and one 30 s slow misses them. So every long-running
process (scheduler, worker, web) measures the offset at start and again every ``MEASURE_EVERY_S`` (a few ``TIME``
round trips, the offset taken at the middle of the fastest, so its error is at most half that round trip), and
publishes it in its liveness record (``clockOffsetMs``: how far the host's clock is ahead of Redis's) for
``status`` and ``doctor``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis

from loopsq.domain import timeutil

log = logging.getLogger(__name__)

#: How often a process measures its offset again (host clocks drift, and NTP steps them).
MEASURE_EVERY_S = 30.0
#: ``TIME`` round trips per measurement; the fastest one is kept.
SAMPLES = 3
#: From this offset (either way) ``doctor`` warns and the process logs a warning.
WARN_MS = 1_000
#: The field of a liveness record that carries its process's offset.
OFFSET_FIELD = "clockOffsetMs"


@dataclass(frozen=True)
class Reading:
    """One measurement: Redis's clock less this host's, and the round trip it was taken over (ms)."""

    offset_ms: float
    rtt_ms: float


def read_offset(client: redis.Redis, samples: int = SAMPLES) -> Reading:
    """Measure Redis's clock against this host's: ``samples`` ``TIME`` round trips, the fastest kept, the host's
    time taken as the middle of it. Raises what the client raises (the caller rides outages)."""
    best: Reading | None = None
    for _ in range(max(1, samples)):
        before = timeutil.host_now().timestamp() * 1000.0
        mono = time.monotonic()
        seconds, micros = client.time()
        rtt_ms = (time.monotonic() - mono) * 1000.0
        server_ms = int(seconds) * 1000.0 + int(micros) / 1000.0
        reading = Reading(server_ms - (before + rtt_ms / 2), rtt_ms)
        if best is None or reading.rtt_ms < best.rtt_ms:
            best = reading
    assert best is not None
    return best


class RedisClock:
    """This process's measurement of Redis's clock; ``measure`` sets the offset ``timeutil.now()`` applies."""

    def __init__(self, every_s: float = MEASURE_EVERY_S) -> None:
        self.every_s = every_s
        self.reading: Reading | None = None
        self._next_at = 0.0
        self._warned = False

    def measure(self, client: redis.Redis) -> Reading:
        """Measure now and apply the offset (rounded to the millisecond, the timestamps' resolution; zero when it is
        within the measurement's own error, half the round trip, so a host in sync keeps its clock untouched and
        its timestamps never step back by a jitter); one warning line when it goes over ``WARN_MS``, one when it
        comes back."""
        reading = read_offset(client)
        noise = abs(reading.offset_ms) <= reading.rtt_ms / 2 + 1
        timeutil.set_clock_offset(0 if noise else round(reading.offset_ms))
        self.reading = reading
        self._next_at = time.monotonic() + self.every_s
        off = abs(reading.offset_ms) > WARN_MS
        if off and not self._warned:
            log.warning("this host's clock is %s off Redis's; loopsq uses Redis's clock (fix the host's time sync)",
                        offset_text(-reading.offset_ms))
        elif not off and self._warned:
            log.info("this host's clock is within %s of Redis's again", offset_text(WARN_MS).lstrip("+"))
        self._warned = off
        return reading

    def measure_if_due(self, client: redis.Redis) -> Reading | None:
        """``measure`` when ``every_s`` has passed since the last try (or none was made); else None. A failed try
        (Redis away) waits its turn as well: the last offset stands meanwhile."""
        if time.monotonic() < self._next_at:
            return None
        self._next_at = time.monotonic() + self.every_s
        return self.measure(client)



def published_offset_ms() -> int:
    """What a liveness record publishes (``OFFSET_FIELD``): how far this host's clock is ahead of Redis's, in ms
    (negative: behind), as last measured; 0 before a measurement."""
    return -round(timeutil.clock_offset_ms())


def offset_text(ms: float) -> str:
    """An offset for people: ``+30.0 s``, ``-0.012 s``."""
    return f"{ms / 1000.0:+.3f} s" if abs(ms) < 1000 else f"{ms / 1000.0:+.1f} s"
