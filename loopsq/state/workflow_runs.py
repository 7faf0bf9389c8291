"""Workflow runs in Redis: creation (idempotent by key), step transitions, events with a gap-free sequence,
cancel, recover and the parent-lease failure — each one atomic transition with its change.

Events are a Redis list per run; an event's sequence is its position + 1, and every transition that appends one
guards the list's length, so two writers can never number two events alike or leave a gap.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import redis

from loopsq.domain.scrub import SHAPES
from loopsq.domain.text import shown
from loopsq.domain.timeutil import gen_id, to_iso, to_ms
from loopsq.errors import ConflictError, NotFoundError
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys, has_old_spelling
from loopsq.state.workflow_control import WorkflowRunControl
from loopsq.state.workflow_run_state import (
    CLAIMABLE_STEP,
    EXECUTION_FIELDS,
    MAX_RETRIES,
    StepEnd,
    WorkflowRunState,
    as_str,
    drop_none,
    dumps_compact,
    index_settled,
)


class WorkflowRunStore(WorkflowRunControl):
    """Workflow runs, step runs and events in Redis (cancel, recover and the parent failure come from
    ``WorkflowRunControl``)."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None, committer: Committer | None = None) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.committer = committer or Committer(client, self.keys)

    # -- reads ----------------------------------------------------------------------------------------------
    def load(self, run_id: str) -> WorkflowRunState | None:
        """The run with its steps and event count, or None."""
        pipe = self.client.pipeline(transaction=True)
        pipe.get(self.keys.wf_run(run_id))
        pipe.hgetall(self.keys.wf_steps(run_id))
        pipe.llen(self.keys.wf_events(run_id))
        raw, steps, events = pipe.execute()
        if not raw:
            return None
        return WorkflowRunState(run_id, str(as_str(raw)), {str(as_str(k)): str(as_str(v)) for k, v in steps.items()}, int(events))

    def require(self, run_id: str) -> WorkflowRunState:
        """Like ``load``; raises ``NotFoundError('workflow run not found: <id>')``."""
        state = self.load(run_id)
        if state is None:
            raise NotFoundError(f"workflow run not found: {shown(run_id)}")
        return state

    def events(self, run_id: str, limit: int = 200) -> list[dict[str, Any]]:
        """The first ``limit`` events of a run, by sequence."""
        return [json.loads(str(as_str(e))) for e in self.client.lrange(self.keys.wf_events(run_id), 0, limit - 1)]

    def by_idempotency(self, workflow_id: str, key: str) -> str | None:
        """The run id an idempotency key stands for: under its spelling, else under the raw spelling of versions
        before ``keys.key_part`` (a loop's ``<loopId>:<slot>:attempt:<n>`` has a ``:``), so that a run such a
        version started is resumed, not started twice."""
        if not has_old_spelling(key):
            return as_str(self.client.get(self.keys.wf_idempotency(workflow_id, key)))
        ours, earlier = self.client.mget([self.keys.wf_idempotency(workflow_id, key),
                                          self.keys.before_encoding.wf_idempotency(workflow_id, key)])
        return as_str(ours) or as_str(earlier)

    def ids(self, limit: int = 100) -> list[str]:
        """Newest workflow run ids first."""
        return [str(as_str(i)) for i in self.client.zrevrange(self.keys.wf_runs, 0, limit - 1)]

    def for_loop_run(self, loop_run_id: str) -> list[str]:
        """Workflow runs started for a loop run."""
        return sorted(str(as_str(i)) for i in self.client.smembers(self.keys.loop_run_workflows(loop_run_id)))

    # -- helpers --------------------------------------------------------------------------------------------
    def _event(self, state: WorkflowRunState, tx: Tx, event_type: str, now: datetime, *, step_id: str | None = None,
               payload: Any = None, offset: int = 0) -> dict[str, Any]:
        event = drop_none({
            "id": gen_id(), "workflowRunId": state.run_id, "sequence": state.events + offset + 1,
            "eventType": event_type, "stepId": step_id, "payload": SHAPES.tree(payload), "createdAt": to_iso(now),
        })
        tx.rpush(self.keys.wf_events(state.run_id), dumps_compact(event)).put("workflow_events", event)
        return event

    def _commit(self, tx: Tx) -> bool:
        return self.committer.commit(tx).ok

    # -- create ---------------------------------------------------------------------------------------------
    def create(
        self,
        spec: Mapping[str, Any],
        now: datetime,
        *,
        run_id: str | None = None,
        loop: Mapping[str, Any] | None = None,
        loop_run: Mapping[str, Any] | None = None,
        scheduled_for: str | None = None,
        idempotency_key: str | None = None,
        owner: str | None = None,
    ) -> tuple[WorkflowRunState, bool]:
        """Create a run (status running, one pending step run per spec step, event #1 ``created``).

        With an idempotency key, an existing run for (workflow, key) is returned unchanged, whatever its status
        (the idempotent replay); ``created`` tells which happened.
        """
        wf_id = str(spec["id"])
        for _ in range(MAX_RETRIES):
            if idempotency_key is not None:
                existing = self.by_idempotency(wf_id, idempotency_key)
                if existing:
                    state = self.load(existing)
                    if state is not None:
                        return state, False
            rid = run_id or gen_id()
            stamp = to_iso(now)
            run = drop_none({
                "id": rid, "workflowId": wf_id, "workflowName": spec["name"],
                "loopId": (loop or {}).get("id"), "loopRunId": (loop_run or {}).get("id"),
                "scheduledFor": scheduled_for or (loop_run or {}).get("scheduledFor"),
                "idempotencyKey": idempotency_key, "status": "running", "startedAt": stamp,
                "createdAt": stamp, "updatedAt": stamp, "workerId": owner,
            })
            steps: dict[str, dict[str, Any]] = {}
            for index, step in enumerate(spec["steps"]):
                account = step.get("account") or step["target"].get("account") or {}
                steps[step["id"]] = drop_none({
                    "id": gen_id(), "workflowRunId": rid, "stepId": step["id"], "sequence": index,
                    "status": "pending", "accountProfile": account.get("profile"), "accountTool": account.get("tool"),
                    "createdAt": stamp, "updatedAt": stamp,
                })
            state = WorkflowRunState(rid, dumps_compact(run), {k: dumps_compact(v) for k, v in steps.items()}, 0)
            tx = Tx("workflow_run_created", stamp).expect(self.keys.wf_run(rid), None)
            if idempotency_key is not None:
                idem = self.keys.wf_idempotency(wf_id, idempotency_key)
                tx.expect(idem, None).set(idem, rid)
            tx.set(self.keys.wf_run(rid), state.run_raw).put("workflow_runs", run)
            for step_id, raw in state.steps_raw.items():
                tx.hset(self.keys.wf_steps(rid), step_id, raw).put("workflow_step_runs", steps[step_id])
            tx.zadd(self.keys.wf_runs, to_ms(now), rid).sadd(self.keys.wf_running, rid)
            if loop_run is not None:
                tx.sadd(self.keys.loop_run_workflows(str(loop_run["id"])), rid)
            payload = drop_none({"workflowId": wf_id, "workflowName": spec["name"], "stepCount": len(steps),
                              "loopId": run.get("loopId"), "loopRunId": run.get("loopRunId")})
            self._event(state, tx, "created", now, payload=payload)
            if self._commit(tx):
                state.events = 1
                return state, True
            if run_id is not None and self.client.exists(self.keys.wf_run(run_id)):
                return self.require(run_id), False
        raise ConflictError("workflow run could not be created (too much contention); try again")

    # -- steps ----------------------------------------------------------------------------------------------
    def _step_tx(self, state: WorkflowRunState, step_id: str, new_step: dict[str, Any], change: str, now: datetime,
                 *, guard_run: bool = True) -> Tx:
        tx = Tx(change, to_iso(now))
        if guard_run:
            tx.expect(self.keys.wf_run(state.run_id), state.run_raw)
        tx.expect_field(self.keys.wf_steps(state.run_id), step_id, state.steps_raw[step_id])
        tx.expect_length(self.keys.wf_events(state.run_id), state.events)
        tx.hset(self.keys.wf_steps(state.run_id), step_id, dumps_compact(new_step)).put("workflow_step_runs", new_step)
        return tx

    def _apply_step(self, state: WorkflowRunState, step_id: str, new_step: dict[str, Any], events: int) -> None:
        state.steps_raw[step_id] = dumps_compact(new_step)
        state.steps[step_id] = new_step
        state.events += events

    def start_step(self, state: WorkflowRunState, step_id: str, now: datetime, *, after: StepEnd | None = None) -> bool:
        """pending|failed|timed_out -> running while the run is running; event ``step_started``.

        With ``after`` (the previous step of a sequential run, just ended), that step's end is recorded in the
        same transition, its event first: one round trip instead of two on a chain's critical path. Whenever the
        pair cannot go together, the end is recorded alone first, so it is never lost or reordered; and when that
        end is refused (the step run was reset by ``recover`` meanwhile), the step is not started.

        Returns False when the step was not started: the run is no longer running, or ``after`` was refused
        (``state`` is re-read either way). Raises ``ConflictError`` with the reference's text when the step itself
        is not claimable.
        """
        status = state.steps[step_id]["status"]
        if after is not None and (state.terminal or status not in CLAIMABLE_STEP
                                  or state.steps[after.step_id]["status"] != "running"):
            return self._end_then_start(state, after, step_id, now)
        if state.terminal:
            return False
        if status not in CLAIMABLE_STEP:
            raise ConflictError(f"workflow step is not claimable: {state.run_id}/{step_id} status={status}")
        stamp = to_iso(now)
        step = {k: v for k, v in state.steps[step_id].items() if k not in EXECUTION_FIELDS}
        step.update(status="running", startedAt=stamp, updatedAt=stamp)
        tx = self._step_tx(state, step_id, step, "workflow_step_started", now)
        ended: dict[str, Any] | None = None
        if after is not None:
            ended = self._ended(state, after)
            key = self.keys.wf_steps(state.run_id)
            tx.expect_field(key, after.step_id, state.steps_raw[after.step_id])
            tx.hset(key, after.step_id, dumps_compact(ended)).put("workflow_step_runs", ended)
            tx.note(f"workflow_step_{after.status}")
            self._end_event(state, tx, after)
        self._event(state, tx, "step_started", now, step_id=step_id, offset=0 if after is None else 1)
        if self._commit(tx):
            if after is not None and ended is not None:
                self._apply_step(state, after.step_id, ended, 1)
            self._apply_step(state, step_id, step, 1)
            return True
        self._reload(state)
        if state.steps[step_id]["status"] == "running" and state.steps[step_id].get("startedAt") == stamp:
            return True  # this very start, resent after Redis applied it (its reply was lost)
        if after is not None:
            return self._end_then_start(state, after, step_id, now)
        return self.start_step(state, step_id, now) if not state.terminal else False

    def _end_then_start(self, state: WorkflowRunState, after: StepEnd, step_id: str, now: datetime) -> bool:
        if not self.end_step(state, after) and not state.terminal:
            return False
        return self.start_step(state, step_id, now)

    def mark_step_pid(self, state: WorkflowRunState, step_id: str, now: datetime, *, pid: int,
                      start_time: float | None, host: str) -> bool:
        """Record a running step's pid, process start time and host (no event, as the reference)."""
        for _ in range(MAX_RETRIES):
            if state.steps[step_id]["status"] != "running":
                return False
            step = {**state.steps[step_id], "pid": pid, "pidStartTime": start_time, "host": host,
                    "updatedAt": to_iso(now)}
            tx = Tx("workflow_step_pid", to_iso(now))
            tx.expect_field(self.keys.wf_steps(state.run_id), step_id, state.steps_raw[step_id])
            tx.hset(self.keys.wf_steps(state.run_id), step_id, dumps_compact(step)).put("workflow_step_runs", step)
            if self._commit(tx):
                self._apply_step(state, step_id, step, 0)
                return True
            self._reload(state)
        return False

    def finish_step(self, state: WorkflowRunState, step_id: str, now: datetime, *, status: str,
                    exit_code: int | None, duration_ms: int, stdout: str, stderr: str, error: str | None) -> bool:
        """running -> succeeded|failed|timed_out; event ``step_<status>`` with ``{exitCode, error}``.

        False when the step is no longer running (the run was cancelled meanwhile).
        """
        return self.end_step(state, StepEnd(step_id, now, status, exit_code, duration_ms, stdout, stderr, error))

    def end_step(self, state: WorkflowRunState, end: StepEnd) -> bool:
        """``finish_step`` with the end as one value."""
        for _ in range(MAX_RETRIES):
            current = state.steps[end.step_id]
            if current["status"] != "running":
                # False, unless it is this very end, resent after Redis applied it (its reply was lost).
                return bool(current["status"] == end.status and current.get("finishedAt") == to_iso(end.at))
            step = self._ended(state, end)
            tx = self._step_tx(state, end.step_id, step, f"workflow_step_{end.status}", end.at, guard_run=False)
            self._end_event(state, tx, end)
            if self._commit(tx):
                self._apply_step(state, end.step_id, step, 1)
                return True
            self._reload(state)
        return False

    @staticmethod
    def _ended(state: WorkflowRunState, end: StepEnd) -> dict[str, Any]:
        # Scrubbed of the secret shapes here, where every step end is written (the executor has scrubbed the
        # step's own env values from its output as it read it).
        stamp = to_iso(end.at)
        return drop_none({**state.steps[end.step_id], "status": end.status, "finishedAt": stamp,
                       "exitCode": end.exit_code, "durationMs": end.duration_ms, "stdout": SHAPES.text(end.stdout),
                       "stderr": SHAPES.text(end.stderr), "error": SHAPES.optional(end.error), "pid": None,
                       "updatedAt": stamp})

    def _end_event(self, state: WorkflowRunState, tx: Tx, end: StepEnd) -> None:
        self._event(state, tx, f"step_{end.status}", end.at, step_id=end.step_id,
                    payload=drop_none({"exitCode": end.exit_code, "error": end.error}))

    def skip_steps(self, state: WorkflowRunState, step_ids: Sequence[str], reason: str, now: datetime) -> None:
        """pending|running -> skipped with ``reason``; one ``step_skipped`` event each (one transition each)."""
        for step_id in step_ids:
            for _ in range(MAX_RETRIES):
                if state.steps[step_id]["status"] not in ("pending", "running"):
                    break
                step = drop_none({**state.steps[step_id], "status": "skipped", "error": SHAPES.text(reason), "pid": None,
                               "finishedAt": to_iso(now), "updatedAt": to_iso(now)})
                tx = self._step_tx(state, step_id, step, "workflow_step_skipped", now, guard_run=False)
                self._event(state, tx, "step_skipped", now, step_id=step_id, payload={"reason": reason})
                if self._commit(tx):
                    self._apply_step(state, step_id, step, 1)
                    break
                self._reload(state)

    # -- the run --------------------------------------------------------------------------------------------
    def finish_run(self, state: WorkflowRunState, status: str, now: datetime, *, error: str | None) -> bool:
        """running -> succeeded|failed|timed_out; event named after the status with ``{error}``. Never
        overwrites a terminal run (a cancel wins)."""
        for _ in range(MAX_RETRIES):
            if state.terminal:
                return False
            started = state.run.get("startedAt")
            duration = None
            if started:
                from loopsq.domain.timeutil import from_iso

                duration = max(0, to_ms(now) - to_ms(from_iso(started)))
            run = drop_none({**state.run, "status": status, "finishedAt": to_iso(now), "durationMs": duration,
                          "error": SHAPES.optional(error), "updatedAt": to_iso(now)})
            tx = (
                Tx(f"workflow_run_{status}", to_iso(now))
                .expect(self.keys.wf_run(state.run_id), state.run_raw)
                .expect_length(self.keys.wf_events(state.run_id), state.events)
                .set(self.keys.wf_run(state.run_id), dumps_compact(run))
                .srem(self.keys.wf_running, state.run_id)
                .put("workflow_runs", run)
            )
            index_settled(tx, self.keys, run, to_ms(now))
            self._event(state, tx, status, now, payload=drop_none({"error": error}) or None)
            if self._commit(tx):
                state.run_raw, state.run = dumps_compact(run), run
                state.events += 1
                return True
            self._reload(state)
        return False

    def _reload(self, state: WorkflowRunState) -> None:
        fresh = self.require(state.run_id)
        state.run_raw, state.run = fresh.run_raw, fresh.run
        state.steps_raw, state.steps, state.events = fresh.steps_raw, fresh.steps, fresh.events
