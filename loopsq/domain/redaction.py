"""Public (redacted) output shapes of loops, runs, workflows, step runs and events, as the reference's §7.3.

Pure functions over camelCase entity dicts; they never mutate their input. Secrets (a target's ``env``, an agent
``prompt``) and captured output are hidden; errors and reasons stay visible because they carry the messages a
user acts on. ``redact`` defaults to 0 visible characters, as in 0.3.3; prompts keep their first 80.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

PROMPT_VISIBLE_CHARS = 80
REDACTED = "[redacted]"
SENSITIVE_PAYLOAD_KEYS = frozenset({"env", "prompt", "stdout", "stderr"})


def redact(text: str, visible: int = 0) -> str:
    """Hide all but the first ``visible`` characters of ``text``.

    ``redact("abcdef")`` is ``"[redacted 6 chars]"``; ``redact("abcdef", 2)`` is ``"ab... [redacted 4 chars]"``;
    text of ``visible`` characters or fewer (the empty string included) is returned unchanged.
    """
    visible = max(visible, 0)
    if len(text) <= visible:
        return text
    hidden = f"[redacted {len(text) - visible} chars]"
    return f"{text[:visible]}... {hidden}" if visible else hidden


def public_loop(loop: Mapping[str, Any]) -> dict[str, Any]:
    """A loop for output: a command or agent target's ``env`` becomes ``"[redacted]"``, an agent prompt keeps 80 chars."""
    result = copy.deepcopy(dict(loop))
    target = result.get("target")
    if isinstance(target, dict):
        _redact_target(target)
    return result


def public_run(run: Mapping[str, Any], show_output: bool = False) -> dict[str, Any]:
    """A loop run for output: ``stdout``/``stderr`` become ``[redacted <len> chars]`` unless ``show_output``.

    As in the reference, empty output is left out rather than shown as ``[redacted 0 chars]``.
    """
    result = copy.deepcopy(dict(run))
    if not show_output:
        _redact_output(result)
        for attempt in result.get("previousAttempts") or []:
            if isinstance(attempt, dict):
                _redact_output(attempt)
    return result


def public_step_run(step: Mapping[str, Any], show_output: bool = False) -> dict[str, Any]:
    """A workflow step run for output, redacted like ``public_run``."""
    return public_run(step, show_output)


def public_workflow(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A workflow spec for output: each step's agent prompt keeps 80 chars, a step's env is hidden."""
    result = copy.deepcopy(dict(spec))
    steps = result.get("steps")
    if isinstance(steps, list):
        for step in steps:
            if isinstance(step, dict) and isinstance(step.get("target"), dict):
                _redact_target(step["target"])
    return result


def public_workflow_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """A workflow run for output: a copy, unchanged (its ``error`` is the user-facing message)."""
    return copy.deepcopy(dict(run))


def public_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """A workflow event for output: payload keys ``env``, ``prompt``, ``stdout``, ``stderr`` are redacted at any depth.

    Strings under those keys become ``[redacted <len> chars]``, other values ``"[redacted]"``; ``error`` and
    ``reason`` stay visible.
    """
    result = copy.deepcopy(dict(event))
    if "payload" in result:
        result["payload"] = _redact_payload(result["payload"])
    return result


def _redact_target(target: dict[str, Any]) -> None:
    kind = target.get("type")
    if kind in ("command", "agent") and target.get("env") is not None:
        target["env"] = REDACTED
    if kind == "agent" and isinstance(target.get("prompt"), str):
        target["prompt"] = redact(target["prompt"], PROMPT_VISIBLE_CHARS)


def _redact_output(result: dict[str, Any]) -> None:
    for key in ("stdout", "stderr"):
        value = result.get(key)
        if value is None or value == "":
            result.pop(key, None)
        elif isinstance(value, str):
            result[key] = f"[redacted {len(value)} chars]"
        else:
            result[key] = REDACTED


def _redact_payload(value: Any, key: str | None = None) -> Any:
    if key in SENSITIVE_PAYLOAD_KEYS:
        if value is None:
            return None
        return redact(value) if isinstance(value, str) else REDACTED
    if isinstance(value, list):
        return [_redact_payload(item) for item in value]
    if isinstance(value, dict):
        return {str(k): _redact_payload(v, str(k)) for k, v in value.items()}
    return value
