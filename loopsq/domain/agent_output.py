"""Whether an agent run said anything, judged per provider from what its CLI printed, and what makes a prompt
blank. OpenLoops 0.4.40: an agent run that produced no output fails explicitly instead of counting as a success,
and a blank prompt is refused. Pure; no I/O.

A run that exited 0 produced no output when its stdout is blank, or when the provider's own result, parsed as
``domain.usage`` parses it, holds no text:

- ``claude -p --output-format json``: the result object's ``result`` is a blank string;
- ``codex exec --json``: the stream completed a turn (``turn.completed``) and none of its events carries text
  (an ``agent_message``'s ``text``, a reasoning note, a command's output...);
- ``opencode``/``aicopilot run --format json``: the stream has finished steps (``step_finish``) and no part carries
  text.

Anything else (cursor's plain text, codewith's run summary, a stream in a shape not recognised here) is judged on
a blank stdout alone, so a format loopsq does not know is never failed for want of a field.
"""

from __future__ import annotations

import re
from typing import Any

from loopsq.domain.checks import has_visible_text
from loopsq.domain.usage import json_objects

NO_OUTPUT_ERROR = "agent produced no output"
#: Keys whose string values are what an agent said or did, at any depth of a stream's events.
TEXT_KEYS = frozenset({"text", "message", "result", "content", "output", "aggregated_output"})
#: How deep an event is searched for text.
MAX_DEPTH = 8
#: A prompt as loopsq's public output shows it (``redaction.redact``): a copy of ``show`` output sent back.
_REDACTED_PROMPT = re.compile(r"(?s)\A(?:.{0,80}\.\.\. )?\[redacted \d+ chars\]\Z")


def _has_text(value: Any, depth: int = 0) -> bool:
    if depth > MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return any((key in TEXT_KEYS and isinstance(item, str) and has_visible_text(item))
                   or _has_text(item, depth + 1) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_text(item, depth + 1) for item in value)
    return False


def produced_no_output(provider: str, stdout: str) -> bool:
    """Whether a run of ``provider`` that exited 0 with this stdout said nothing (see the module's rules)."""
    if not has_visible_text(stdout or ""):
        return True
    objects = list(json_objects(stdout))
    if provider == "claude":
        results = [o for o in objects if o.get("type") == "result" and "result" in o]
        last = results[-1]["result"] if results else None
        return isinstance(last, str) and not has_visible_text(last)
    if provider == "codex":
        finished = any(o.get("type") == "turn.completed" for o in objects)
        return finished and not any(_has_text(o) for o in objects)
    if provider in ("opencode", "aicopilot"):
        finished = any(o.get("type") == "step_finish" for o in objects)
        return finished and not any(_has_text(o) for o in objects)
    return False


def prompt_problem(prompt: str) -> str | None:
    """Why ``prompt`` cannot be sent to an agent (``has no visible character``, ``is a redacted copy ...``), or
    None when it can."""
    if not has_visible_text(prompt):
        return "must have a visible character (it is blank)"
    if _REDACTED_PROMPT.match(prompt):
        return "is a redacted copy ('[redacted N chars]', as show prints it): send the full prompt"
    return None
