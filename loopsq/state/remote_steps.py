"""Transitions of a workflow step that another worker than its workflow run's runs (``engine.remote_steps``): its
dispatch, its claim by the worker that runs it, and that worker's record of its end. Each is one atomic transition
with its change and its event.

- **Dispatch** (by the workflow run's worker): the step run stays ``pending`` and records the dispatch under
  ``remote``: a token naming this dispatch, the requirement set and the RQ queue it went to. Event
  ``step_queued``.
- **Claim** (by the worker that runs it): ``pending`` with that token -> ``running``, with ``workerId`` and
  ``host``; in the same transition the step's own lease (``keys.lease(holder)``, ``step:<run>:<step>``) is set
  only if it is absent, and only while the step's cancel key is absent and the run is running. A duplicate job
  (RQ delivers at least once), or one of an older dispatch, finds the step claimed, ended or dispatched again
  under another token, and runs nothing. Event ``step_started`` with ``{workerId, host}``.
- **End** (by that worker): as ``finish_step``, fenced by the lease, which goes in the same transition. A worker
  whose lease expired writes nothing: the workflow run's worker fails the step then (``step lease expired``).
  A dispatch that failed (its job could not be enqueued) ends the step from ``pending`` (``end_queued_step``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from loopsq.domain.timeutil import to_iso
from loopsq.errors import ConflictError
from loopsq.state.workflow_run_state import (
    CLAIMABLE_STEP,
    EXECUTION_FIELDS,
    MAX_RETRIES,
    StepEnd,
    WorkflowRunState,
    as_str,
    drop_none,
)
from loopsq.state.workflow_runs import WorkflowRunStore

#: The step-run field that records a dispatch: ``{"token", "requires", "queue"}``.
REMOTE = "remote"


def dispatch_token(step: dict[str, Any]) -> str | None:
    """The token of the dispatch a step run records, if any."""
    remote = step.get(REMOTE)
    return str(remote["token"]) if isinstance(remote, dict) and remote.get("token") else None


class RemoteStepStore(WorkflowRunStore):
    """``WorkflowRunStore`` with the transitions of a step run by another worker."""

    def refresh(self, state: WorkflowRunState) -> None:
        """Re-read ``state`` (after another worker wrote to the run)."""
        self._reload(state)

    def read_step(self, run_id: str, step_id: str) -> dict[str, Any] | None:
        """One step run as stored now, or None."""
        raw = as_str(self.client.hget(self.keys.wf_steps(run_id), step_id))
        return dict(json.loads(raw)) if raw else None

    def dispatch_step(self, state: WorkflowRunState, step_id: str, now: datetime, *, token: str,
                      requires: Sequence[str], queue: str, waiting: str | None = None) -> bool:
        """pending|failed|timed_out -> pending, dispatched under ``token`` to ``queue``, while the run is running;
        event ``step_queued`` with ``{requires, queue, waiting?}`` (``waiting``: why nobody may take it now).

        Returns False when the run is no longer running. Raises ``ConflictError`` with ``start_step``'s text when
        the step is not claimable.
        """
        for _ in range(MAX_RETRIES):
            if state.terminal:
                return False
            status = state.steps[step_id]["status"]
            if status not in CLAIMABLE_STEP:
                raise ConflictError(f"workflow step is not claimable: {state.run_id}/{step_id} status={status}")
            stamp = to_iso(now)
            step = {k: v for k, v in state.steps[step_id].items() if k not in EXECUTION_FIELDS}
            step.update(status="pending", updatedAt=stamp,
                        **{REMOTE: {"token": token, "requires": list(requires), "queue": queue}})
            tx = self._step_tx(state, step_id, step, "workflow_step_queued", now)
            payload = drop_none({"requires": list(requires), "queue": queue, "waiting": waiting})
            self._event(state, tx, "step_queued", now, step_id=step_id, payload=payload)
            if self._commit(tx):
                self._apply_step(state, step_id, step, 1)
                return True
            self._reload(state)
        raise ConflictError(f"workflow run {state.run_id} kept changing; try again")

    def claim_step(self, run_id: str, step_id: str, token: str, now: datetime, *, holder: str, lease_token: str,
                   lease_ms: int, worker_id: str, host: str) -> WorkflowRunState | None:
        """pending (dispatched under ``token``) -> running on ``worker_id``, the step's own lease (``holder``'s)
        set to ``lease_token`` for ``lease_ms`` if absent; event ``step_started`` with ``{workerId, host}``.

        Returns the run as claimed, or None when there is nothing to run: the run is over or gone, the step is
        not pending under this token (claimed already, ended, or dispatched again), its lease is held, or its
        cancel key is set.
        """
        lease_key, cancel_key = self.keys.lease(holder), self.keys.cancel(holder)
        for _ in range(MAX_RETRIES):
            state = self.load(run_id)
            if state is None or state.terminal or step_id not in state.steps:
                return None
            current = state.steps[step_id]
            if current["status"] != "pending" or dispatch_token(current) != token:
                return None
            if self.client.exists(lease_key, cancel_key):
                return None
            stamp = to_iso(now)
            step = {**current, "status": "running", "startedAt": stamp, "updatedAt": stamp, "workerId": worker_id,
                    "host": host}
            tx = self._step_tx(state, step_id, step, "workflow_step_started", now)
            tx.expect(lease_key, None).expect(cancel_key, None).set(lease_key, lease_token, px=lease_ms)
            self._event(state, tx, "step_started", now, step_id=step_id, payload={"workerId": worker_id, "host": host})
            if self._commit(tx):
                self._apply_step(state, step_id, step, 1)
                return state
        return None

    def end_claimed_step(self, state: WorkflowRunState, end: StepEnd, *, holder: str, lease_token: str) -> bool:
        """``end_step`` for the worker that claimed the step: only while its lease (``holder``'s) is still
        ``lease_token``, and the lease is dropped in the same transition. False when not recorded (the lease was
        lost, or the step no longer runs: cancelled, or failed by the workflow run's worker)."""
        lease_key = self.keys.lease(holder)
        for _ in range(MAX_RETRIES):
            current = state.steps[end.step_id]
            if current["status"] != "running":
                return bool(current["status"] == end.status and current.get("finishedAt") == to_iso(end.at))
            step = self._ended(state, end)
            tx = self._step_tx(state, end.step_id, step, f"workflow_step_{end.status}", end.at, guard_run=False)
            tx.expect(lease_key, lease_token).delete_key(lease_key)
            self._end_event(state, tx, end)
            if self._commit(tx):
                self._apply_step(state, end.step_id, step, 1)
                return True
            if as_str(self.client.get(lease_key)) != lease_token:
                # Lost, or dropped by this very end resent after Redis applied it (its reply was lost).
                self._reload(state)
                now = state.steps[end.step_id]
                return bool(now["status"] == end.status and now.get("finishedAt") == to_iso(end.at))
            self._reload(state)
        return False

    def end_queued_step(self, state: WorkflowRunState, end: StepEnd) -> bool:
        """pending, dispatched and never claimed -> ended (its dispatch itself failed): as ``end_step``. False when
        it is no longer pending (claimed meanwhile, or ended with the run)."""
        for _ in range(MAX_RETRIES):
            if state.steps[end.step_id]["status"] != "pending":
                return False
            step = self._ended(state, end)
            tx = self._step_tx(state, end.step_id, step, f"workflow_step_{end.status}", end.at, guard_run=False)
            self._end_event(state, tx, end)
            if self._commit(tx):
                self._apply_step(state, end.step_id, step, 1)
                return True
            self._reload(state)
        return False
