"""Ending or resetting a workflow run from outside its execution: cancel (§5.6), the parent loop run's
failure (§3.8) and recover (§5.7). Each is one atomic transition with its change and event."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import redis

from loopsq.domain.timeutil import from_iso, to_iso, to_ms
from loopsq.errors import ConflictError
from loopsq.state.commit import Tx
from loopsq.state.keys import Keys
from loopsq.state.workflow_run_state import (
    EXECUTION_FIELDS,
    MAX_RETRIES,
    WorkflowRunState,
    drop_none,
    dumps_compact,
    index_settled,
)


def _elapsed_ms(step: dict[str, Any], now: datetime) -> int | None:
    """How long a running step ran until ``now`` (None for a step that never started)."""
    started = step.get("startedAt")
    if step.get("status") != "running" or not started:
        return None
    return max(0, to_ms(now) - to_ms(from_iso(str(started))))


class WorkflowRunControl:
    """Cancel, parent failure and recover (mixed into ``WorkflowRunStore``, which provides these members)."""

    client: redis.Redis
    keys: Keys

    def require(self, run_id: str) -> WorkflowRunState:
        raise NotImplementedError

    def _event(self, state: WorkflowRunState, tx: Tx, event_type: str, now: datetime, *, step_id: str | None = None,
               payload: Any = None, offset: int = 0) -> dict[str, Any]:
        raise NotImplementedError

    def _commit(self, tx: Tx) -> bool:
        raise NotImplementedError

    def _end_run(self, run_id: str, now: datetime, *, status: str, error: str, step_status: str, change: str,
                 event_type: str, payload: dict[str, Any]) -> WorkflowRunState:
        """A run and its pending|running steps end together (cancel, parent-lease failure)."""
        for _ in range(MAX_RETRIES):
            state = self.require(run_id)
            if state.terminal:
                return state
            stamp = to_iso(now)
            run = {**state.run, "status": status, "finishedAt": stamp, "error": error, "updatedAt": stamp}
            tx = (
                Tx(change, stamp)
                .expect(self.keys.wf_run(run_id), state.run_raw)
                .expect_length(self.keys.wf_events(run_id), state.events)
                .set(self.keys.wf_run(run_id), dumps_compact(run))
                .srem(self.keys.wf_running, run_id)
                .put("workflow_runs", run)
            )
            index_settled(tx, self.keys, run, to_ms(now))
            ended = 0
            for step in state.ordered_steps():
                if step["status"] not in ("pending", "running"):
                    continue
                # Every end of a step has a finish time and its step event, a cancel's as much as an exit's.
                step_id = str(step["stepId"])
                new = drop_none({**step, "status": step_status, "error": error, "pid": None, "finishedAt": stamp,
                                 "durationMs": _elapsed_ms(step, now), "updatedAt": stamp})
                tx.expect_field(self.keys.wf_steps(run_id), step_id, state.steps_raw[step_id])
                tx.hset(self.keys.wf_steps(run_id), step_id, dumps_compact(new)).put("workflow_step_runs", new)
                self._event(state, tx, f"step_{step_status}", now, step_id=step_id, payload={"reason": error},
                            offset=ended)
                ended += 1
            self._event(state, tx, event_type, now, payload=payload, offset=ended)
            tx.set(self.keys.cancel(run_id), error, px=3_600_000)
            if self._commit(tx):
                return self.require(run_id)
        raise ConflictError(f"workflow run {run_id} kept changing; try again")

    def cancel(self, run_id: str, now: datetime, reason: str = "cancelled by user") -> WorkflowRunState:
        """Cancel a running workflow run (§5.6); a terminal run is returned unchanged. The executing process
        sees the cancel key within its beat and kills the running step's process group."""
        return self._end_run(run_id, now, status="cancelled", error=reason, step_status="cancelled",
                             change="workflow_run_cancelled", event_type="cancelled", payload={"reason": reason})

    def fail_for_parent(self, run_id: str, loop_run_id: str, now: datetime, error: str) -> WorkflowRunState:
        """The parent loop run was abandoned: fail the run, skip its open steps (§3.8)."""
        return self._end_run(run_id, now, status="failed", error=error, step_status="skipped",
                             change="workflow_run_failed", event_type="failed",
                             payload={"error": error, "loopRunId": loop_run_id})

    def fail_for_owner(self, run_id: str, now: datetime, error: str) -> WorkflowRunState:
        """The worker executing a workflow run of its own (no parent loop run) died: fail the run, skip its open
        steps. Nothing would ever end it otherwise."""
        return self._end_run(run_id, now, status="failed", error=error, step_status="skipped",
                             change="workflow_run_failed", event_type="failed", payload={"error": error})

    def recover(self, run_id: str, now: datetime, reason: str, alive: Any) -> tuple[WorkflowRunState, list[str]]:
        """Reset running steps to pending so a re-execution resumes (§5.7). ``alive(step) -> bool`` tells whether
        a step's process still lives (host, pid and start time); any live one refuses with the reference's text."""
        for _ in range(MAX_RETRIES):
            state = self.require(run_id)
            running = [s for s in state.ordered_steps() if s["status"] == "running"]
            live = [s for s in running if alive(s)]
            if live:
                detail = ", ".join(f"{s['stepId']} pid={s.get('pid')}" for s in live)
                raise ConflictError(f"cannot recover workflow run while step processes are still alive: {detail}")
            if not running:
                return state, []
            stamp = to_iso(now)
            tx = Tx("workflow_run_recovered", stamp).expect_length(self.keys.wf_events(run_id), state.events)
            for step in running:
                new = {k: v for k, v in step.items() if k not in EXECUTION_FIELDS}
                new.update(status="pending", error=reason, updatedAt=stamp)
                tx.expect_field(self.keys.wf_steps(run_id), step["stepId"], state.steps_raw[step["stepId"]])
                tx.hset(self.keys.wf_steps(run_id), step["stepId"], dumps_compact(new)).put("workflow_step_runs", new)
            ids = [s["stepId"] for s in running]
            self._event(state, tx, "recovered", now, payload={"reason": reason, "recoveredSteps": ids})
            if self._commit(tx):
                return self.require(run_id), ids
        raise ConflictError(f"workflow run {run_id} kept changing; try again")

