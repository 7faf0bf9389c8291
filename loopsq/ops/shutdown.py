"""How long a worker's current run may go on after SIGTERM: derived from the process manager's kill timeout.

Process managers send SIGTERM, then SIGKILL after a fixed time: honcho after 5 s (not configurable), a
Heroku-style platform after 30 s, systemd after ``TimeoutStopSec`` (30 s in the units ``loopsq install`` writes),
launchd after its ``ExitTimeOut`` (20 s). A worker that is still busy when SIGKILL comes leaves its run to be
recovered later; one whose grace ends in time records the run ``abandoned`` and hands it on at once. So the grace
is the kill timeout minus what the hand-over needs: ``executor.KILL_GRACE_S`` (a target that ignores SIGTERM gets
SIGKILL that much later) and half a second to record the run and exit.

The kill timeout is ``LOOPSQ_KILL_TIMEOUT`` when set (a duration with its unit, ``30s``: a bare number is refused,
since ``30`` would be 30 ms); else 30 s on Heroku (``DYNO`` is set there); else 5 s,
honcho's, the shortest of the usual ones, so that the repository's Procfile works unchanged under honcho. An
explicit ``--grace`` wins over all of this.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from loopsq.domain.durations import parse_duration
from loopsq.errors import ValidationError
from loopsq.executor.supervisor import KILL_GRACE_S

KILL_TIMEOUT_ENV = "LOOPSQ_KILL_TIMEOUT"
HEROKU_ENV = "DYNO"
HEROKU_KILL_TIMEOUT_MS = 30_000
HONCHO_KILL_TIMEOUT_MS = 5_000
#: What the hand-over takes after the grace: the target's SIGTERM-to-SIGKILL escalation, then recording and exit.
HANDOVER_MS = int(KILL_GRACE_S * 1000) + 500
MIN_GRACE_MS = 500
_BARE_NUMBER = re.compile(r"\d+(\.\d*)?|\.\d+")


def kill_timeout_ms(env: Mapping[str, str]) -> tuple[int, str]:
    """The process manager's kill timeout and where it came from (for the worker's start line).

    Raises:
        ValidationError: ``LOOPSQ_KILL_TIMEOUT`` is set but is not a positive duration with a unit (``30s``).
    """
    text = env.get(KILL_TIMEOUT_ENV, "").strip()
    if text:
        if _BARE_NUMBER.fullmatch(text):
            # A process manager's kill timeout is written in seconds (TimeoutStopSec=30); parse_duration would read
            # "30" as 30 ms and give every run a grace of nothing, silently. A unit is required.
            raise ValidationError(f"{KILL_TIMEOUT_ENV} needs a unit (a bare number would be milliseconds): write "
                                  f"{text}s, got '{text}'")
        try:
            ms = parse_duration(text)
        except ValidationError as exc:
            raise ValidationError(f"{KILL_TIMEOUT_ENV}: {exc.message}") from exc
        if ms <= 0:
            raise ValidationError(f"{KILL_TIMEOUT_ENV} must be greater than zero, got '{text}'")
        return int(ms), KILL_TIMEOUT_ENV
    if env.get(HEROKU_ENV):
        return HEROKU_KILL_TIMEOUT_MS, f"{HEROKU_ENV} is set (Heroku)"
    return HONCHO_KILL_TIMEOUT_MS, f"{KILL_TIMEOUT_ENV} unset (honcho's)"


def grace_for(kill_ms: int) -> int:
    """The grace (ms) that ends the hand-over before a kill timeout of ``kill_ms``; at least half a second."""
    return max(MIN_GRACE_MS, kill_ms - HANDOVER_MS)


