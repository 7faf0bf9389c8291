"""Workflow steps that run on another worker: a step whose requirements the worker executing its workflow run
lacks is handed, as an RQ job of its own, to a worker that has them; the workflow run waits for it.

- **Which steps** (``step_requirements``): a step needs its own ``requires``, or its workflow's when it names
  none, plus, for an agent step, ``provider:<its provider>`` unless those name a provider
  (``labels.requirement_set``). A step runs where its workflow run executes when that worker has every label (or
  is no fleet worker: ``Runtime.labels`` None), as always; otherwise it is dispatched.
- **Dispatch** (the workflow run's worker, ``RemoteStep``): the step run records the dispatch under a fresh token
  (``state.remote_steps``: event ``step_queued`` with the requirements, the queue and, when no live worker has
  them, what is missing), then ``worker.jobs.run_step(run, step, token, assignment)`` goes on the queue of the
  requirement set. The job carries the step's effective target and ``LOOPS_*`` metadata (``StepAssignment``).
- **The run** (the worker that takes the job, ``run_remote_step``): it claims the step (``pending`` under that
  token -> ``running``, event ``step_started`` with its worker id and host) and sets the step's own lease
  ``keys.lease("step:<run>:<step>")`` in the same transition, only if absent: a duplicate job runs nothing. It
  executes the step as a local one is executed (``step_exec``: workspace, live output, idle timeouts), beats the
  lease (``step_workspaces.beaten_lease``), watches the step's cancel key and its workflow run's (``Runtime.watch``
  with ``also``: a cancel reaches it within a beat), and records the end, fenced by the lease, which it drops in
  the same transition.
- **The wait** (the workflow run's worker): it polls the step run and its lease every ``POLL_S`` and goes on
  when the step ended, keeping its own duties meanwhile (its run's lease is beaten by its runtime; the workflow
  timeout and cancels stop the wait). A step whose worker died, its lease expired or its liveness gone (not in the
  grace after a Redis outage: ``grace.recovery_paused``), is failed by the workflow run's worker with the error a
  loop run gets (``worker W died before completion``, ``step lease expired before completion``): it is not run
  again. Stopping a remote step (timeout, cancel, a dead worker) sets the step's cancel key first, which the claim
  refuses, then records the end; its worker writes nothing after a cancel request.
- **A step nobody may run** waits in its queue, its ``step_queued`` event saying which labels no live worker has,
  until the workflow's timeout or a cancel; the job then finds the step ended and runs nothing.

If the workflow run's worker dies, its recovery is as before (``recovery.recover_workflow_runs`` and the loop
run's): the run's end sets its cancel key, which the step's worker heeds.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis

from loopsq.domain import labels, timeutil
from loopsq.domain.timeutil import from_iso, gen_id, to_ms
from loopsq.engine import routing, timers
from loopsq.engine.grace import recovery_paused
from loopsq.engine.runtime import SHUTTING_DOWN, Runtime
from loopsq.engine.step_exec import StepAssignment, execute_step
from loopsq.engine.step_workspaces import STEP_LEASE_MS, beaten_lease, holder_id
from loopsq.executor import SpawnInfo
from loopsq.executor.preflight import step_target
from loopsq.state.outages import is_transient
from loopsq.state.remote_steps import RemoteStepStore, dispatch_token
from loopsq.state.workflow_run_state import StepEnd, WorkflowRunState
from loopsq.state.workspaces import WorkspaceLeases
from loopsq.system.procs import is_process_alive, kill_process_group

log = logging.getLogger("loopsq.workflows")

#: How often the workflow run's worker looks at a step another worker runs (one round trip).
POLL_S = 0.2
#: How long a step's cancel key stays (as a run's).
CANCEL_KEEP_MS = 3_600_000
#: The RQ entry point of a step run for another worker's workflow run.
RUN_STEP = "worker.jobs.run_step"
WORKER_DIED = "worker {} died before completion"
LEASE_EXPIRED = "step lease expired before completion"


def step_requirements(spec: Mapping[str, Any], step: Mapping[str, Any]) -> tuple[str, ...]:
    """What a worker needs to run ``step`` of ``spec``: the step's own ``requires``, or the workflow's when the step
    names none (as CI runners' per-job tags replace the pipeline's default), plus an agent's provider unless those
    name a provider."""
    declared = step.get("requires")
    if not declared:
        declared = spec.get("requires")
    return labels.requirement_set(step_target(step), declared or ())


def runs_here(worker_labels: Iterable[str] | None, requirements: Iterable[str]) -> bool:
    """Whether a step needing ``requirements`` runs on the worker executing its workflow run (``worker_labels``:
    its ``Runtime.labels``; None outside a fleet worker, which runs every step itself)."""
    return worker_labels is None or labels.satisfies(worker_labels, requirements)


def remote_requirements(worker_labels: Iterable[str] | None, spec: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The steps of ``spec`` that must run on another worker, with what they need."""
    have = None if worker_labels is None else list(worker_labels)
    out: dict[str, tuple[str, ...]] = {}
    for step in spec["steps"]:
        needs = step_requirements(spec, step)
        if not runs_here(have, needs):
            out[str(step["id"])] = needs
    return out


@dataclass(frozen=True)
class Dispatch:
    """A step handed to another worker: the token its claim must show, and where it went."""

    token: str
    requirements: tuple[str, ...]
    queue: str


def dispatch(rt: Runtime, store: RemoteStepStore, state: WorkflowRunState, step_id: str,
             requirements: tuple[str, ...]) -> Dispatch | None:
    """Record the dispatch of a step to the queue of ``requirements`` (``state``: the run as its execution knows
    it); None when the run is over. Says so in the event and the log when no live worker has the labels."""
    queue = labels.queue_name(requirements, rt.keys.base_queue)
    try:
        lacking = routing.unserved(rt.client, rt.keys, requirements)
    except redis.RedisError:
        lacking = None  # (only a note)
    waiting = f"no live worker has labels {', '.join(lacking)}" if lacking else None
    found = Dispatch(gen_id(), requirements, queue)
    if not store.dispatch_step(state, step_id, timeutil.now(), token=found.token, requires=requirements,
                               queue=queue, waiting=waiting):
        return None
    if waiting:
        log.warning("workflow run %s step %s waits in queue %s: %s", state.run_id, step_id, queue, waiting)
    else:
        log.info("workflow run %s step %s queued on %s", state.run_id, step_id, queue)
    return found


class RemoteStep:
    """The workflow run's side of one step run by another worker: dispatch, hand-over, wait, stop."""

    def __init__(self, rt: Runtime, run_id: str, step_id: str, dispatched: Dispatch) -> None:
        self.rt, self.run_id, self.step_id, self.dispatched = rt, run_id, step_id, dispatched
        self.store = RemoteStepStore(rt.client, rt.keys, rt.committer)
        self.holder = holder_id(run_id, step_id)

    def hand_over(self, assignment: StepAssignment) -> None:
        """Enqueue the step's job on its requirement set's queue."""
        token = self.dispatched.token
        timers.enqueue(self.rt.raw, RUN_STEP, self.run_id, self.step_id, token, assignment.to_json(),
                       queue_name=self.dispatched.queue, keys=self.rt.keys, job_id=f"loopsq-step-{token}")

    def wait(self, cancel: threading.Event, stop_end: Callable[[], tuple[str, str]]) -> None:
        """Until the step ended (or is no longer this dispatch's: reset by ``recover``). ``cancel`` set (the
        workflow's timeout, a cancel): the step is stopped and recorded as ``stop_end()`` says."""
        token, worker = self.dispatched.token, None
        while True:
            if cancel.wait(POLL_S):
                self.stop(*stop_end())
                return
            pipe = self.rt.client.pipeline(transaction=False)
            pipe.hget(self.rt.keys.wf_steps(self.run_id), self.step_id)
            pipe.get(self.rt.keys.lease(self.holder))
            pipe.exists(self.rt.keys.worker(worker or "-"))
            raw, lease, alive = pipe.execute()
            step = json.loads(raw) if raw else None
            if step is None or dispatch_token(step) != token or step["status"] not in ("pending", "running"):
                return
            if step["status"] == "pending":
                continue  # in its queue
            claimed_by = step.get("workerId")
            if claimed_by != worker:
                worker = claimed_by  # (its liveness is read from the next poll on)
                continue
            if lease is not None and (worker is None or alive):
                continue
            if recovery_paused(self.rt):
                continue  # Redis was away: a live worker's keys may have expired meanwhile
            dead = worker is not None and not alive
            self.stop("failed", WORKER_DIED.format(worker) if dead else LEASE_EXPIRED, dead=dead)
            return

    def stop(self, status: str, error: str, *, dead: bool = False, queued_too: bool = False) -> None:
        """Stop the step and record its end as ``status`` with ``error``, unless it ended meanwhile. Its cancel
        key goes first: no claim is made after it, and a claimed step's worker kills its process within a beat and
        records nothing. A queued step stays pending (it never started: the run's end skips it), unless
        ``queued_too`` (its dispatch itself failed). ``dead``: its worker died, whose process group, if it lives
        on this host, is killed."""
        self.rt.client.set(self.rt.keys.cancel(self.holder), error, px=CANCEL_KEEP_MS)
        state = self.store.load(self.run_id)
        if state is None or dispatch_token(state.steps[self.step_id]) != self.dispatched.token:
            return
        now = timeutil.now()
        queued = state.steps[self.step_id]["status"] == "pending" and queued_too
        if queued and self.store.end_queued_step(state, StepEnd(self.step_id, now, status, None, 0, "", "", error)):
            return
        # (Not ended as queued: claimed just before the cancel key was set, ``state`` re-read; ended below.)
        step = state.steps[self.step_id]
        if step["status"] != "running" or dispatch_token(step) != self.dispatched.token:
            return
        if dead:
            _kill_orphan(self.rt, step)
        elapsed = max(0, to_ms(now) - to_ms(from_iso(str(step["startedAt"])))) if step.get("startedAt") else 0
        if self.store.end_step(state, StepEnd(self.step_id, now, status, None, elapsed, "", "", error)):
            log.warning("workflow run %s step %s %s: %s", self.run_id, self.step_id, status, error)


def _kill_orphan(rt: Runtime, step: Mapping[str, Any]) -> None:
    pid = step.get("pid")
    if pid and step.get("host") == rt.owner.host and is_process_alive(int(pid), step.get("pidStartTime")):
        log.warning("killing orphaned process group %d of step %s (its worker died)", int(pid), step.get("stepId"))
        kill_process_group(int(pid), signal.SIGKILL)


# -- the worker that runs the step --------------------------------------------------------------------------------
#: ``run_remote_step``'s answer when it ran nothing.
NOT_CLAIMED = "not claimed"


def run_remote_step(rt: Runtime, run_id: str, step_id: str, token: str, assignment: Mapping[str, Any]) -> str:
    """Claim and run a step of another worker's workflow run (``worker.jobs.run_step``); returns how it ended,
    ``NOT_CLAIMED`` when there was nothing to run (a duplicate or stale job, a run that is over)."""
    store = RemoteStepStore(rt.client, rt.keys, rt.committer)
    holder, lease_token = holder_id(run_id, step_id), gen_id()
    state = store.claim_step(run_id, step_id, token, timeutil.now(), holder=holder, lease_token=lease_token,
                             lease_ms=STEP_LEASE_MS, worker_id=rt.owner.worker_id, host=rt.owner.host)
    if state is None:
        log.info("workflow run %s step %s: nothing to run for dispatch %s (claimed already, ended or stale)",
                 run_id, step_id, token)
        return NOT_CLAIMED
    log.info("workflow run %s step %s claimed", run_id, step_id)
    held = rt.watch(holder, also=(run_id,))
    leases = WorkspaceLeases(rt.runs)
    lost = threading.Event()
    direct = RemoteStepStore(rt.direct, rt.keys)

    def on_lost() -> None:
        lost.set()
        held.reason = LEASE_EXPIRED
        held.cancel.set()

    def spawned(info: SpawnInfo) -> None:
        # Never waits for Redis, as a local step's: while Redis is away the pid goes unrecorded.
        try:
            direct.mark_step_pid(state, step_id, timeutil.now(), pid=info.pid, start_time=info.start_time,
                                 host=info.host)
        except redis.RedisError as exc:
            if not is_transient(exc):
                raise
            rt.outage.failed(exc)

    try:
        with beaten_lease(leases, holder, lease_token, on_lost=on_lost):
            result = execute_step(rt, StepAssignment.from_json(assignment), held.cancel, spawned,
                                  lease_token=lease_token)
    finally:
        rt.release(holder)
    status, error = result.status, result.error
    if status == "cancelled" and (lost.is_set() or held.reason != SHUTTING_DOWN):
        # Stopped by a cancel request (whoever made it records the end) or with its lease lost (the workflow run's
        # worker fails it): nothing to write.
        leases.drop_own_lease(holder, lease_token)
        log.info("workflow run %s step %s stopped: %s", run_id, step_id, held.reason or error)
        return "cancelled"
    if status == "cancelled":
        status, error = "failed", SHUTTING_DOWN
    end = StepEnd(step_id, timeutil.now(), status, result.exit_code, result.duration_ms, result.stdout,
                  result.stderr, error)
    if not store.end_claimed_step(state, end, holder=holder, lease_token=lease_token):
        leases.drop_own_lease(holder, lease_token)
        log.warning("workflow run %s step %s ended %s but was no longer this worker's to record", run_id, step_id,
                    status)
        return "not recorded"
    log.info("workflow run %s step %s %s", run_id, step_id, status)
    return status
