"""Running a claimed loop run's target to its end (a command or agent, with its control file; or a workflow), under
the run's ``loopsq.execute`` span, whose W3C context the target gets as ``TRACEPARENT``."""

from __future__ import annotations

import threading
from collections.abc import Callable

from loopsq.domain import run_rules as rules
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.engine.faults import crash_point
from loopsq.engine.live import LiveWriter
from loopsq.engine.runtime import SHUTTING_DOWN, Held, Runtime
from loopsq.engine.steering import execute_with_control
from loopsq.engine.workflow_runner import execute_workflow
from loopsq.executor import RunMetadata, SpawnInfo
from loopsq.state.runs import Claim
from loopsq.system import tracing


def run_target(rt: Runtime, claim: Claim, held: Held, traced: tracing.Span) -> tuple[
        str, int | None, str, str, str | None, int | None, int, dict[str, object]]:
    """Run the claimed run's target to its end under ``traced`` (the execute span, whose context the target gets
    as ``TRACEPARENT``); returns its outcome as the finalize records it, with the target's control fields."""
    run, loop = claim.run, claim.loop

    def on_spawn(info: SpawnInfo) -> None:
        # No Redis here: the beat records the start, or the finalize does if the run ends first (``Held``).
        held.started = info
        crash_point("after_spawn")

    error: str | None
    control: dict[str, object] = {}
    if loop.target.get("type") == "workflow":
        status, exit_code, stdout, stderr, error, pid, duration = _run_workflow_target(rt, loop, run, held.cancel,
                                                                                      on_spawn)
        if held.cancel.is_set() and held.reason and status != "succeeded":
            status, error = "failed", held.reason  # replaced, or shutting down: say so, not "step x failed"
    else:
        metadata = RunMetadata(loop_id=loop.id, loop_name=loop.name, run_id=run.id,
                               scheduled_for=run.scheduled_for, attempt=run.attempt, **traced.carrier())
        output = LiveWriter(rt.direct, rt.keys, run.id)
        result, control = execute_with_control(loop.target, metadata, cancel=held.cancel, on_spawn=on_spawn,
                                               on_output=output)
        output.close(result.status)
        status, exit_code, stdout, stderr, error, pid, duration = (
            result.status, result.exit_code, result.stdout, result.stderr, result.error, result.pid,
            result.duration_ms,
        )
        status, error = rules.finished_status(loop, status, exit_code, error)  # exit 75: nothing to do
        if status == "cancelled":
            # loop_runs has no "cancelled": a cancelled run failed, with the reason of the cancel.
            status, error = "failed", held.reason or "cancelled"
    if held.reason == SHUTTING_DOWN and status != "succeeded":
        status, error = "abandoned", rules.SHUTDOWN_ERROR  # retried elsewhere (runs.after_finish)
    traced.set("loopsq.status", status)
    traced.set("loopsq.exit_code", exit_code)
    if status != "succeeded":
        traced.fail(error)
    return status, exit_code, stdout, stderr, error, pid, duration, control


def run_attributes(run: LoopRun) -> dict[str, str | int | bool | None]:
    """A run's span attributes."""
    return {"loopsq.loop.id": run.loop_id, "loopsq.run.id": run.id, "loopsq.attempt": run.attempt,
            "loopsq.slot": run.scheduled_for, "loopsq.source": run.source}


def _run_workflow_target(
    rt: Runtime, loop: Loop, run: LoopRun, cancel: threading.Event, on_spawn: Callable[[SpawnInfo], None]
) -> tuple[str, int | None, str, str, str | None, int | None, int]:
    """A workflow loop target (§5.5): idempotent per slot attempt, with the target's timeout for the whole run."""
    workflow_id = str(loop.target.get("workflowId"))
    spec = rt.workflows.get(workflow_id)
    if spec is None:
        return "failed", None, "", "", f"workflow not found: {workflow_id}", None, 0
    outcome = execute_workflow(
        rt, spec, loop=loop.to_dict(), loop_run=run.to_dict(),
        idempotency_key=f"{loop.id}:{run.scheduled_for}:attempt:{run.attempt}",
        timeout_ms=loop.target.get("timeoutMs"), cancel=cancel, on_spawn=on_spawn,
    )
    return outcome.status, outcome.exit_code, outcome.stdout, "", outcome.error, None, outcome.duration_ms

