"""Executing one workflow step's target on this worker: under its workspace lease when it has one, its output
streamed live, an executor exception turned into a failed step (as the reference). The same path whether the step
runs where its workflow run executes or on another worker (``remote_steps``), which gets the step as a
``StepAssignment`` in its job.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from loopsq.domain import timeutil
from loopsq.engine import live, pool_slots
from loopsq.engine.runtime import Runtime
from loopsq.engine.step_workspaces import step_workspace
from loopsq.executor import ExecutorResult, RunMetadata, SpawnInfo, execute_target

_METADATA_FIELDS = frozenset(f.name for f in dataclasses.fields(RunMetadata))


@dataclass(frozen=True)
class StepAssignment:
    """What executing one step of a workflow run takes: its effective target and ``LOOPS_*`` metadata, its
    workspace lease (``workspace``, ``workspaceWaitMs``) and its fleet-wide pool (the step's, else its workflow's)."""

    workflow_run_id: str
    step_id: str
    target: dict[str, Any]
    metadata: RunMetadata
    workspace: str | None = None
    workspace_wait_ms: int | None = None
    pool: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (an RQ job's argument: nothing of loopsq's classes is pickled into it)."""
        return {"workflowRunId": self.workflow_run_id, "stepId": self.step_id, "target": self.target,
                "metadata": {k: v for k, v in dataclasses.asdict(self.metadata).items() if v is not None},
                "workspace": self.workspace, "workspaceWaitMs": self.workspace_wait_ms, "pool": self.pool}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StepAssignment:
        """The assignment ``to_json`` gave (metadata fields this version does not know are left out)."""
        metadata = {k: v for k, v in dict(value.get("metadata") or {}).items() if k in _METADATA_FIELDS}
        wait = value.get("workspaceWaitMs")
        return cls(str(value["workflowRunId"]), str(value["stepId"]), dict(value["target"]), RunMetadata(**metadata),
                   value.get("workspace"), int(wait) if wait is not None else None, value.get("pool") or None)


def failed_result(error: str) -> ExecutorResult:
    """A step that failed before (or instead of) running its target."""
    now = timeutil.to_iso(timeutil.now())
    return ExecutorResult("failed", None, "", "", error, None, now, now, 0)


def execute_step(rt: Runtime, assignment: StepAssignment, cancel: threading.Event,
                 spawned: Callable[[SpawnInfo], None], *, lease_token: str | None = None) -> ExecutorResult:
    """Run the step's target here to its end. With a pool, holding one of its slots (waited for here, on the
    workflow run's worker slot; ``pool_slots.hold_for_step``): a pool that is gone or stays full fails the step.
    With a workspace, under its lease: a busy one that stays busy fails the step (``lease_token``: the step's own
    lease, held already by the caller)."""
    if assignment.pool is None:
        return _in_workspace(rt, assignment, cancel, spawned, lease_token)
    held = pool_slots.hold_for_step(rt, assignment.pool, f"step:{assignment.workflow_run_id}:{assignment.step_id}",
                                    cancel)
    if isinstance(held, str):
        return failed_result(held)
    try:
        return _in_workspace(rt, assignment, cancel, spawned, lease_token)
    finally:
        pool_slots.give_back(rt, held)


def _in_workspace(rt: Runtime, assignment: StepAssignment, cancel: threading.Event,
                  spawned: Callable[[SpawnInfo], None], lease_token: str | None) -> ExecutorResult:
    if assignment.workspace is None:
        return _execute(rt, assignment, cancel, spawned)
    with step_workspace(rt.runs, str(assignment.workspace), assignment.workflow_run_id, assignment.step_id,
                        wait_ms=assignment.workspace_wait_ms, cancel=cancel, lease_token=lease_token) as busy:
        if busy is not None:
            return failed_result(busy)
        return _execute(rt, assignment, cancel, spawned)


def _execute(rt: Runtime, assignment: StepAssignment, cancel: threading.Event,
             spawned: Callable[[SpawnInfo], None]) -> ExecutorResult:
    on_output = live.LiveWriter(rt.direct, rt.keys, assignment.workflow_run_id, assignment.step_id)
    try:
        result = execute_target(assignment.target, assignment.metadata, cancel=cancel, on_spawn=spawned,
                                on_output=on_output)
    except Exception as exc:  # the reference turns any executor exception into a failed step
        result = failed_result(str(exc))
    on_output.close(result.status)
    return result
