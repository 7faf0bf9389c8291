"""The run control file (``$LOOPS_CONTROL_FILE``): what a target tells the scheduler about its run, parsed.

A target may write one JSON object, for example ``{"outcome": "no_op", "nextIn": "10m", "note": "nothing new"}``:

- ``outcome``: one of ``OUTCOMES`` (recorded on the run; ``done`` stops the loop, ``needs_human`` pauses it with
  the note as the reason);
- ``nextIn``: a duration (``"10m"``) or milliseconds: when the loop's next slot comes, for steerable loops,
  clamped to the loop's ``minIntervalMs``/``maxIntervalMs`` (``domain.steering``);
- ``stop``: ``true`` stops the loop after this run;
- ``note``: a short text (at most ``MAX_NOTE_LENGTH`` characters).

Anything malformed (not JSON, not an object, an unknown key, a bad value, too large) is a warning, and then
nothing of the file applies; so is a path that is not a regular file (a FIFO, a symlink, a directory: the engine
never opens those, ``engine.steering``). No I/O here: the engine reads the file and passes its text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loopsq.domain.durations import format_duration, parse_duration
from loopsq.domain.text import quoted as shown
from loopsq.errors import ValidationError

OUTCOMES = ("progress", "no_op", "done", "needs_human")
#: Read at most this much of the file; a larger one is a warning.
MAX_CONTROL_BYTES = 65_536
MAX_NOTE_LENGTH = 1_000
KEYS = ("outcome", "nextIn", "stop", "note")


@dataclass(frozen=True)
class Control:
    """A parsed control file: the directives, or the warning that voided them."""

    outcome: str | None = None
    next_in_ms: int | None = None
    stop: bool = False
    note: str | None = None
    warning: str | None = None

    @property
    def empty(self) -> bool:
        """True when the file said nothing (absent, empty, or voided by a warning)."""
        return self.outcome is None and self.next_in_ms is None and not self.stop and self.note is None

    def to_dict(self) -> dict[str, Any] | None:
        """The run's ``control`` field (camelCase, absent keys dropped); None when nothing applies."""
        if self.empty:
            return None
        out: dict[str, Any] = {"outcome": self.outcome, "nextInMs": self.next_in_ms,
                               "stop": True if self.stop else None, "note": self.note}
        return {k: v for k, v in out.items() if v is not None}


def ignored(reason: str) -> Control:
    """A ``Control`` voided for ``reason``: its warning is ``control file ignored: <reason>``."""
    return Control(warning=f"control file ignored: {reason}")


def _next_in(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValidationError(f"nextIn must be a duration such as \"10m\" or milliseconds, got {shown(value)}")
    ms = value if isinstance(value, int) else parse_duration(value)
    if ms <= 0:
        raise ValidationError(f"nextIn must be greater than zero, got {shown(value)}")
    return ms


def parse_control(text: str | None, *, truncated: bool = False) -> Control:
    """Parse the control file's text (None or blank: the target wrote nothing).

    Args:
        text: what the file held (at most ``MAX_CONTROL_BYTES`` of it).
        truncated: the file was larger than ``MAX_CONTROL_BYTES``.

    Returns:
        The directives, or a ``Control`` with only ``warning`` set. Never raises.
    """
    if truncated:
        return ignored(f"larger than {MAX_CONTROL_BYTES} bytes")
    if text is None or not text.strip():
        return Control()
    try:
        data = json.loads(text)
    except ValueError as exc:
        return ignored(f"not JSON ({exc.__class__.__name__}: {exc})")
    if not isinstance(data, dict):
        return ignored(f"expected one JSON object, got {shown(data)}")
    unknown = [key for key in data if key not in KEYS]
    if unknown:
        return ignored(f"unknown key {shown(unknown[0])} (expected {', '.join(KEYS)})")
    outcome = data.get("outcome")
    if outcome is not None and outcome not in OUTCOMES:
        return ignored(f"outcome must be one of {', '.join(OUTCOMES)}, got {shown(outcome)}")
    stop = data.get("stop")
    if stop is not None and not isinstance(stop, bool):
        return ignored(f"stop must be true or false, got {shown(stop)}")
    note = data.get("note")
    if note is not None and not isinstance(note, str):
        return ignored(f"note must be a string, got {shown(note)}")
    if note is not None and len(note) > MAX_NOTE_LENGTH:
        return ignored(f"note must be at most {MAX_NOTE_LENGTH} characters, got {len(note)}")
    next_in: int | None = None
    if data.get("nextIn") is not None:
        try:
            next_in = _next_in(data["nextIn"])
        except ValidationError as exc:
            return ignored(exc.message if exc.message.startswith("nextIn") else f"nextIn: {exc.message}")
    return Control(outcome=outcome, next_in_ms=next_in, stop=bool(stop), note=note or None)


def describe(control: dict[str, Any] | None) -> str:
    """A run's control in a few words, for ``show`` and ``runs``: ``no_op, next in 10m, stop: <note>``."""
    if not control:
        return "-"
    parts = [str(control["outcome"])] if control.get("outcome") else []
    if control.get("nextInMs"):
        parts.append(f"next in {format_duration(int(control['nextInMs']))}")
    if control.get("stop"):
        parts.append("stop")
    text = ", ".join(parts) or "-"
    return f"{text}: {control['note']}" if control.get("note") else text
