"""Validation of a create request's beyond-the-reference fields: steering bounds (``steerable``,
``minIntervalMs``, ``maxIntervalMs``), the change gate (``gate``), the workspace, budgets, and where runs may go
(``requires``, ``pool``: ``domain.placement``).

Each problem raises ``ValidationError`` naming the field and quoting the value; ``loop_spec.new_loop`` calls
``feature_fields`` and stores what it returns on the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loopsq.domain import limits
from loopsq.domain.budget import validate_budget
from loopsq.domain.checks import check_length, check_visible, whole
from loopsq.domain.durations import format_duration
from loopsq.domain.placement import placement_fields
from loopsq.domain.text import quoted
from loopsq.errors import ValidationError

#: A gate's own timeout when it names none.
DEFAULT_GATE_TIMEOUT_MS = 60_000
#: How long a run of an overlap-allow loop waits for its busy workspace when the loop names no wait.
DEFAULT_WORKSPACE_WAIT_MS = 600_000


def _ms(body: Mapping[str, Any], key: str, minimum: int, label: str | None = None) -> int | None:
    value = whole(body.get(key))
    key = label or key
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValidationError(f"{key} must be a positive integer, got {quoted(value)}")
    if value < minimum:
        raise ValidationError(f"{key} must be at least {minimum} ({format_duration(minimum)}), got {quoted(value)}")
    if value > limits.MAX_MS:
        raise ValidationError(f"{key} must be at most {limits.MAX_MS}, got {quoted(value)}")
    return value


def steering_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """``steerable``, ``min_interval_ms`` and ``max_interval_ms`` of a create request (absent ones left out)."""
    steerable = body.get("steerable")
    if steerable is not None and not isinstance(steerable, bool):
        raise ValidationError(f"steerable must be true or false, got {quoted(steerable)}")
    low = _ms(body, "minIntervalMs", limits.MIN_EVERY_MS)
    high = _ms(body, "maxIntervalMs", limits.MIN_EVERY_MS)
    for key, value in (("minIntervalMs", low), ("maxIntervalMs", high)):
        if value is not None and steerable is not True:
            raise ValidationError(f"{key} requires steerable: true, got {quoted(value)}")
    # A maxIntervalMs below minIntervalMs is taken as minIntervalMs (``steering.bounds_ms``): JSON Schema cannot
    # compare two fields, and the API's document must call valid exactly what is accepted. The CLI refuses it.
    out: dict[str, Any] = {}
    if steerable:
        out.update(steerable=True, min_interval_ms=low, max_interval_ms=high)
    return out


def validate_gate(value: Any, field: str = "gate") -> dict[str, Any] | None:
    """A gate: ``{"command": <shell command>, "timeoutMs"?: <ms>}`` or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValidationError(f"{field} must be an object with a command, got {quoted(value)}")
    unknown = [key for key in value if key not in ("command", "timeoutMs")]
    if unknown:
        raise ValidationError(f"{field} has an unknown field {quoted(unknown[0])} (expected command, timeoutMs)")
    command = value.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ValidationError(f"{field}.command must be a non-empty command, got {quoted(command)}")
    if len(command) > limits.MAX_COMMAND_LENGTH:
        raise ValidationError(f"{field}.command must be at most {limits.MAX_COMMAND_LENGTH} characters, "
                              f"got {len(command)}")
    if "\0" in command:
        raise ValidationError(f"{field}.command must not contain NUL, got {quoted(command)}")
    gate: dict[str, Any] = {"command": command}
    timeout = _ms(value, "timeoutMs", 1, f"{field}.timeoutMs") if value.get("timeoutMs") is not None else None
    if timeout is not None:
        gate["timeoutMs"] = timeout
    return gate


def workspace_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """``workspace`` (a key of at most ``MAX_WORD_LENGTH`` visible characters) and ``workspaceWaitMs`` (with a
    workspace only)."""
    key = body.get("workspace")
    wait = _ms(body, "workspaceWaitMs", 1)
    if key is None:
        if wait is not None:
            raise ValidationError(f"workspaceWaitMs requires a workspace, got {quoted(wait)}")
        return {}
    if not isinstance(key, str) or not key.strip():
        raise ValidationError(f"workspace must be a non-empty string, got {quoted(key)}")
    check_length(key, "workspace", limits.MAX_WORD_LENGTH)
    out: dict[str, Any] = {"workspace": check_visible(key.strip(), "workspace")}
    if wait is not None:
        out["workspace_wait_ms"] = wait
    return out


def step_workspace_fields(step: dict[str, Any], label: str) -> dict[str, Any]:
    """A workflow step's ``workspace`` and ``workspaceWaitMs``, checked as a loop's are and named by the step
    (``steps[0].workspace must be …``); absent ones are dropped from ``step``."""
    for name in ("workspace", "workspaceWaitMs"):
        if step.get(name) is None:
            step.pop(name, None)
    try:
        fields = workspace_fields(step)
    except ValidationError as exc:
        raise ValidationError(f"{label}.{exc}") from None
    return {"workspace": fields["workspace"], **({"workspaceWaitMs": fields["workspace_wait_ms"]}
                                                  if "workspace_wait_ms" in fields else {})} if fields else {}


def feature_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """Every beyond-the-reference field of a create request, as ``Loop`` keyword arguments."""
    out = steering_fields(body)
    out.update(workspace_fields(body))
    for key, attr, cost in (("budgetRuns", "budget_runs", False), ("budgetCost", "budget_cost", True)):
        budget = validate_budget(body.get(key), key, cost=cost)
        if budget is not None:
            out[attr] = budget
    gate = validate_gate(body.get("gate"))
    if gate is not None:
        out["gate"] = gate
    out.update(placement_fields(body))
    return out
