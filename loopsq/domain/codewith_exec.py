"""What a ``codewith exec --json`` run said about itself: its JSON events (one object a line) read as they come,
giving the final message, the failure it reported, whether its turn completed, and its token usage. Pure.

The events are codex's ``exec --json`` events, which codewith keeps: ``thread.started``, ``turn.started``,
``item.started|updated|completed`` (an ``agent_message`` item carries the reply's ``text``), ``turn.completed``
(with ``usage``: ``input_tokens``, ``cached_input_tokens``, ``output_tokens``), ``turn.failed`` (with
``error.message``) and ``error`` (with ``message``). A run that exits 0 without a ``turn.completed`` did no work
(OpenLoops 0.4.9's lesson from codewith's durable agents, which ended "completed" after a
``context_length_exceeded``): it is a failure, never a silent success.

Memory stays bounded: a line longer than ``MAX_LINE_BYTES`` (a large command output inside an item, say) is
skipped as it streams past, and only the newest message and error are kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loopsq.domain.usage import Usage

#: A longer event line is not parsed (its bytes are dropped as they arrive).
MAX_LINE_BYTES = 1_048_576
#: The error of a run that exited 0 but never completed its turn.
NO_TURN_COMPLETED = "codewith exec ended without completing its turn (no turn.completed event)"


@dataclass(frozen=True)
class ExecOutcome:
    """What the events said: ``completed`` (the last turn event was ``turn.completed``), ``failure`` (the message
    of a ``turn.failed``, or of an ``error`` event not followed by a completed turn), the last agent message
    (``result_text``), the thread id and the usage of the completed turn."""

    completed: bool = False
    failure: str | None = None
    result_text: str | None = None
    thread_id: str | None = None
    usage: Usage | None = None


def _message(event: dict[str, Any]) -> str:
    """The text of a ``turn.failed`` (``error.message``, or ``error`` as text) or an ``error`` event."""
    detail = event.get("error")
    if isinstance(detail, dict):
        detail = detail.get("message")
    if not isinstance(detail, str) or not detail.strip():
        detail = event.get("message")
    if isinstance(detail, str) and detail.strip():
        return detail.strip()
    return "turn failed" if event.get("type") == "turn.failed" else "codewith reported an error"


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class ExecEventReader:
    """Reads a ``codewith exec --json`` stdout chunk by chunk (``feed``), then ``finish`` and ``outcome``."""

    def __init__(self) -> None:
        self._partial = bytearray()
        self._skipping = False  # inside a line longer than MAX_LINE_BYTES
        self._completed = False
        self._failure: str | None = None
        self._error: str | None = None
        self._result: str | None = None
        self._thread: str | None = None
        self._usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        """Read the complete lines of ``chunk`` (with what came before it); keep the rest for the next chunk."""
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                break
            self._take(chunk[start:end])
            start = end + 1
        self._keep(chunk[start:])

    def finish(self) -> None:
        """The stream has ended: read its last line, if it had no newline."""
        if self._partial and not self._skipping:
            self._line(bytes(self._partial))
        self._partial.clear()
        self._skipping = False

    def _keep(self, rest: bytes) -> None:
        if self._skipping:
            return
        if len(self._partial) + len(rest) > MAX_LINE_BYTES:
            self._partial.clear()
            self._skipping = True
            return
        self._partial += rest

    def _take(self, tail: bytes) -> None:
        if self._skipping:
            self._skipping = False
            self._partial.clear()
            return
        if self._partial:
            if len(self._partial) + len(tail) > MAX_LINE_BYTES:
                self._partial.clear()
                return
            self._partial += tail
            line = bytes(self._partial)
            self._partial.clear()
        else:
            if len(tail) > MAX_LINE_BYTES:
                return
            line = tail
        self._line(line)

    def _line(self, raw: bytes) -> None:
        line = raw.strip()
        if not line.startswith(b"{"):
            return
        try:
            event = json.loads(line)
        except ValueError:
            return
        if isinstance(event, dict):
            self._event(event)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "thread.started" and isinstance(event.get("thread_id"), str):
            self._thread = event["thread_id"]
        elif kind == "turn.started":
            self._completed, self._failure, self._error = False, None, None
        elif kind == "item.completed":
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                self._result = item["text"]
        elif kind == "turn.completed":
            self._completed, self._failure, self._error = True, None, None
            usage = event.get("usage")
            if isinstance(usage, dict):
                # codewith reports the thread's running total; cached input is a part of input_tokens.
                self._usage = Usage(_count(usage.get("input_tokens")), _count(usage.get("output_tokens")))
        elif kind == "turn.failed":
            self._completed, self._failure = False, _message(event)
        elif kind == "error":
            self._error = _message(event)

    def outcome(self) -> ExecOutcome:
        """What the events read so far said."""
        failure = self._failure or (None if self._completed else self._error)
        return ExecOutcome(completed=self._completed and failure is None, failure=failure, result_text=self._result,
                           thread_id=self._thread, usage=self._usage)


def read_exec_events(stdout: str) -> ExecOutcome:
    """``ExecEventReader`` over a whole stdout at once."""
    reader = ExecEventReader()
    reader.feed(stdout.encode("utf-8", "replace"))
    reader.finish()
    return reader.outcome()


def judge(exit_code: int | None, outcome: ExecOutcome) -> str | None:
    """The error of a codewith run that ended by itself with ``exit_code``, judged by its events; None when it
    succeeded. The events' own failure message wins over a bare exit code; an exit 0 needs a completed turn."""
    if outcome.failure is not None:
        return outcome.failure
    if exit_code:
        return f"process exited with code {exit_code}"
    if not outcome.completed:
        return NO_TURN_COMPLETED
    return None
