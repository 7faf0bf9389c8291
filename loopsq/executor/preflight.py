"""Preflight: can a loop's target (or every step of a workflow) start here? Checked without running it.

``create … --preflight`` and ``workflows validate --preflight`` use it to refuse, before anything is stored, a
target whose executable is missing or whose account cannot be resolved (§4.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from loopsq.domain.models import Loop
from loopsq.domain.workflow_spec import execution_order
from loopsq.errors import LoopsqError, ValidationError
from loopsq.executor import RunMetadata, preflight_target


class WorkflowSource(Protocol):
    """Where a workflow loop's spec comes from (the workflow store)."""

    def require(self, id_or_name: str) -> dict[str, Any]: ...


class _App(Protocol):
    def workflows(self) -> WorkflowSource: ...


def step_target(step: Mapping[str, Any]) -> dict[str, Any]:
    """A step's effective target: the step's ``account`` and ``timeoutMs`` override the target's."""
    target = dict(step["target"])
    if step.get("account") is not None:
        target["account"] = step["account"]
    if "timeoutMs" in step:
        target["timeoutMs"] = step["timeoutMs"]
    return target


def preflight_workflow_body(body: Mapping[str, Any], workflow_id: str | None = None) -> list[dict[str, Any]]:
    """Preflight every step in execution order; the first failure raises ``ValidationError`` naming the step."""
    steps = {str(step["id"]): step for step in body["steps"]}
    results: list[dict[str, Any]] = []
    for step_id in execution_order(list(body["steps"])):
        metadata = RunMetadata(
            workflow_id=workflow_id, workflow_name=str(body["name"]), workflow_step_id=step_id
        )
        try:
            result = preflight_target(step_target(steps[step_id]), metadata)
        except LoopsqError as exc:
            raise ValidationError(f"preflight failed for workflow step {step_id}: {exc.message}") from exc
        results.append({"stepId": step_id, **result})
    return results


def preflight_loop_target(target: Mapping[str, Any], loop: Loop, app: _App) -> list[dict[str, Any]]:
    """Preflight a new loop's target; raise ``ValidationError('preflight failed: …')`` if it cannot start."""
    if target.get("type") == "workflow":
        spec = app.workflows().require(str(target["workflowId"]))
        return preflight_workflow_body(spec, str(spec["id"]))
    try:
        return [preflight_target(target, RunMetadata(loop_id=loop.id, loop_name=loop.name))]
    except LoopsqError as exc:
        raise ValidationError(f"preflight failed: {exc.message}") from exc
