"""Executing a workflow run (§5.4): steps in the reference's order, the dependency gate, continueOnFailure,
cancel, the workflow timeout, idempotent replay and resume — and, beyond the reference, up to ``maxParallel``
independent steps at once.

With ``maxParallel`` 1 (the default) steps run one at a time in the deterministic execution order, exactly as
the reference. With more, every step whose dependencies have ended may start while fewer than ``maxParallel``
run; after a blocking failure no new step starts, and the running ones finish.

A step whose requirements this worker lacks runs on a worker that has them (``remote_steps``): it is dispatched
instead of started, and waited for on its own thread as a local step is; its end, recorded by that worker (or by
the wait, when that worker died or the step was stopped), decides what follows as a local step's does.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import redis

from loopsq.domain import timeutil
from loopsq.domain.workflow_spec import execution_order
from loopsq.engine import remote_steps
from loopsq.engine.remote_steps import Dispatch, RemoteStep
from loopsq.engine.runtime import Runtime
from loopsq.engine.step_exec import StepAssignment, execute_step
from loopsq.executor import ExecutorResult, RunMetadata, SpawnInfo
from loopsq.executor.gate import probe
from loopsq.executor.preflight import step_target
from loopsq.state.outages import is_transient
from loopsq.state.remote_steps import RemoteStepStore, dispatch_token
from loopsq.state.workflow_run_state import DONE_STEP, StepEnd, WorkflowRunState
from loopsq.system import tracing

log = logging.getLogger("loopsq.workflows")

POLL_S = 0.05


@dataclass(frozen=True)
class WorkflowOutcome:
    """What a workflow run means for the loop run that started it (an ExecutorResult's fields)."""

    run_id: str
    status: str  # succeeded | failed | timed_out (cancelled shows as failed, as the reference)
    exit_code: int
    stdout: str
    error: str | None
    duration_ms: int
    replayed: bool = False


def summary(state: WorkflowRunState) -> str:
    """The loop run's stdout for a workflow: run id, status and each step's status and error.

    The reference stored the whole ``{workflowRun, steps}`` with every step's full output, unbounded and
    unredacted (defect §10.10); loopsq keeps the outputs in the step runs only.
    """
    steps = [{k: s[k] for k in ("stepId", "status", "exitCode", "error") if k in s} for s in state.ordered_steps()]
    return json.dumps({"workflowRunId": state.run_id, "status": state.run.get("status"), "steps": steps}, indent=2)


def outcome_of(state: WorkflowRunState, replayed: bool = False) -> WorkflowOutcome:
    """The loop-run outcome of a terminal workflow run."""
    status = str(state.run.get("status"))
    started = state.run.get("startedAt")
    duration = 0
    if started:
        duration = max(0, timeutil.to_ms(timeutil.now()) - timeutil.to_ms(timeutil.from_iso(started)))
    duration = int(state.run.get("durationMs", duration))
    mapped = status if status in ("succeeded", "timed_out") else "failed"
    return WorkflowOutcome(state.run_id, mapped, 0 if status == "succeeded" else 1, summary(state),
                           state.run.get("error"), duration, replayed)


class _Execution:
    """One execution of a workflow run by this process."""

    def __init__(self, rt: Runtime, spec: Mapping[str, Any], state: WorkflowRunState, *, timeout_ms: int | None,
                 cancel: threading.Event | None, on_spawn: Callable[[SpawnInfo], None] | None,
                 loop: Mapping[str, Any] | None) -> None:
        self.rt, self.spec, self.state = rt, spec, state
        self.store = RemoteStepStore(rt.client, rt.keys, rt.committer)
        self.direct_store = RemoteStepStore(rt.direct, rt.keys)
        self.steps = {str(s["id"]): s for s in spec["steps"]}
        #: Steps this worker lacks labels for, with what they need: each runs on a worker that has them.
        self.remote = remote_steps.remote_requirements(rt.labels, spec)
        self.dispatched: dict[str, Dispatch] = {}
        self.order = execution_order(list(spec["steps"]))
        self.max_parallel = max(1, int(spec.get("maxParallel") or 1))
        self.deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else None
        self.timeout_ms = timeout_ms
        self.outer_cancel = cancel
        self.on_spawn = on_spawn
        self.loop = loop or {}
        self.loop_run_attempt: int | None = None
        self.lock = threading.RLock()  # guards self.state: steps finish on pool threads
        self.watch = rt.watch(state.run_id)
        self.step_cancels: dict[str, threading.Event] = {}
        self.attempted: set[str] = set()
        #: Steps skipped by their own closed change gate, or by one upstream (``_gate_closed``).
        self.gated: set[str] = set()
        self.terminal = "succeeded"
        self.blocking: str | None = None
        self.halted = False
        self.timed_out = False
        self.cancelled = False
        self.done = threading.Event()
        self.pending_end: StepEnd | None = None  # one step at a time: the last end, written with the next start
        #: The ``loopsq.workflow`` span's context: the parent of the step spans, which start on pool threads.
        self.trace = tracing.current()

    # -- the monitor: cancel requests and the workflow timeout reach the running steps ---------------------------
    def _monitor(self) -> None:
        while not self.done.wait(POLL_S):
            if not self.cancelled and (self.watch.cancel.is_set() or (self.outer_cancel and self.outer_cancel.is_set())):
                self.cancelled = True
                self._stop_running()
            if not self.timed_out and self.deadline is not None and time.monotonic() >= self.deadline:
                self.timed_out = True
                self._stop_running()

    def _stop_running(self) -> None:
        for event in list(self.step_cancels.values()):
            event.set()

    # -- one step -------------------------------------------------------------------------------------------
    def _assignment(self, step_id: str, traced: tracing.Span) -> StepAssignment:
        """What executing the step takes, here or on another worker (its target continues ``traced``)."""
        step = self.steps[step_id]
        target = step_target(step)
        loop_target = self.loop.get("target")
        if isinstance(loop_target, dict) and isinstance(loop_target.get("preflight"), dict):
            target.setdefault("preflight", loop_target["preflight"])  # a workflow loop's --preflight-each-run
        metadata = RunMetadata(
            loop_id=self.loop.get("id"), loop_name=self.loop.get("name"), run_id=self.state.run.get("loopRunId"),
            scheduled_for=self.state.run.get("scheduledFor"), workflow_id=str(self.spec["id"]),
            workflow_name=str(self.spec["name"]), workflow_run_id=self.state.run_id, workflow_step_id=step_id,
            attempt=self.loop_run_attempt, **traced.carrier(),
        )
        workspace = step.get("workspace")
        pool = step.get("pool") or self.spec.get("pool")  # (a step's own pool, else its workflow's)
        return StepAssignment(self.state.run_id, step_id, target, metadata,
                              str(workspace) if workspace is not None else None, step.get("workspaceWaitMs"),
                              str(pool) if pool else None)

    def _run_step(self, step_id: str, cancel: threading.Event) -> ExecutorResult | None:
        """Execute the step to its end, in a ``loopsq.step`` span; None when another worker ran it (and recorded
        its end)."""
        with tracing.span("loopsq.step", parent=self.trace, attributes={
                "loopsq.workflow.id": str(self.spec["id"]), "loopsq.workflow_run.id": self.state.run_id,
                "loopsq.step.id": step_id, "loopsq.remote": step_id in self.dispatched}) as traced:
            result = self._run_step_traced(step_id, cancel, traced)
            if result is not None:
                traced.set("loopsq.status", result.status)
                traced.set("loopsq.exit_code", result.exit_code)
                if result.status != "succeeded":
                    traced.fail(result.error)
            return result

    def _run_step_traced(self, step_id: str, cancel: threading.Event,
                         traced: tracing.Span) -> ExecutorResult | None:
        if step_id in self.dispatched:
            self._run_remote(step_id, cancel, traced)
            return None

        def spawned(info: SpawnInfo) -> None:
            # Never waits for Redis (the executor reads the step's output only after this returns): while Redis
            # is away the pid goes unrecorded, the step's end still is.
            with self.lock:
                try:
                    self.direct_store.mark_step_pid(self.state, step_id, timeutil.now(), pid=info.pid,
                                                    start_time=info.start_time, host=info.host)
                except redis.RedisError as exc:
                    if not is_transient(exc):
                        raise
                    self.rt.outage.failed(exc)
            if self.on_spawn is not None:
                self.on_spawn(info)

        return execute_step(self.rt, self._assignment(step_id, traced), cancel, spawned)

    def _run_remote(self, step_id: str, cancel: threading.Event, traced: tracing.Span) -> None:
        """Hand the step to a worker that has its labels and wait for its end (``remote_steps``)."""
        remote = RemoteStep(self.rt, self.state.run_id, step_id, self.dispatched[step_id])
        try:
            remote.hand_over(self._assignment(step_id, traced))
            remote.wait(cancel, self._stop_end)
        except Exception as exc:  # as an executor exception: the step fails, the workflow goes on deciding
            log.exception("workflow run %s step %s: handing it to another worker failed", self.state.run_id, step_id)
            remote.stop("failed", f"could not hand the step to a worker: {exc}", queued_too=True)

    def _stop_end(self) -> tuple[str, str]:
        """How a step this execution stops ends: timed out by the workflow's timeout, else failed (cancelled)."""
        if self.timed_out:
            return "timed_out", f"workflow timed out after {self.timeout_ms}ms"
        return "failed", "cancelled"

    def _finish_step(self, step_id: str, result: ExecutorResult | None, *, defer: bool = False) -> None:
        """Record how a step ended and whether it stops the run. With ``defer`` (one step at a time), the end is
        kept to be written with the next step's start, or alone by ``_flush`` if nothing starts next. ``result``
        None: another worker ran the step and recorded its end (``_finish_remote``)."""
        if result is None:
            self._finish_remote(step_id)
            return
        status, error = result.status, result.error
        if status == "cancelled":
            if self.timed_out:
                status, error = "timed_out", f"workflow timed out after {self.timeout_ms}ms"
            else:
                status = "failed"
        with self.lock:
            self.step_cancels.pop(step_id, None)
            end = StepEnd(step_id, timeutil.now(), status, result.exit_code, result.duration_ms, result.stdout,
                          result.stderr, error)
            if defer:
                # Whether the write applies only matters when the run was cancelled or failed meanwhile, and
                # then the run's stored outcome is what this execution reports anyway.
                self.pending_end = end
            elif not self.store.end_step(self.state, end):
                return  # cancelled meanwhile: the cancel set the step's status
            if status != "succeeded" and not self.steps[step_id].get("continueOnFailure") and not self.halted:
                self.halted = True
                self.terminal = status
                self.blocking = f"step {step_id} {status}" + (f": {error}" if error else "")

    def _finish_remote(self, step_id: str) -> None:
        """Whether a step another worker ran stops the run, from its recorded end. A step that did not end under
        this dispatch (stopped while queued, reset by ``recover``, cancelled with the run) decides nothing, as a
        refused local end."""
        with self.lock:
            self.step_cancels.pop(step_id, None)
            self.store.refresh(self.state)
            step = self.state.steps[step_id]
            status, error = str(step["status"]), step.get("error")
            if dispatch_token(step) != self.dispatched[step_id].token or status not in ("failed", "timed_out"):
                return
            if not self.steps[step_id].get("continueOnFailure") and not self.halted:
                self.halted = True
                self.terminal = status
                self.blocking = f"step {step_id} {status}" + (f": {error}" if error else "")

    def _flush(self) -> None:
        """Write the deferred end of the last step, if any."""
        with self.lock:
            end, self.pending_end = self.pending_end, None
            if end is not None:
                self.store.end_step(self.state, end)

    # -- scheduling -----------------------------------------------------------------------------------------
    def _status(self, step_id: str) -> str:
        """A step run's status as this execution knows it (including the end not written yet)."""
        end = self.pending_end
        return end.status if end is not None and end.step_id == step_id else str(self.state.steps[step_id]["status"])

    def _ready(self, step_id: str) -> tuple[bool, str | None]:
        """(ready, blocking dependency): not ready while a dependency may still run in this execution.

        A dependency this execution already ran that is pending or running again was reset by ``recover`` while
        it ran: its end was not recorded, so it did not succeed (as in the reference, where its dependents are
        then gated), rather than something to wait for.
        """
        blocked = None
        for dep in self.steps[step_id].get("dependsOn") or []:
            dep_status = self._status(dep)
            if dep in self.step_cancels:
                return False, None  # running here
            if dep not in self.attempted and dep_status in ("pending", "running", "failed", "timed_out"):
                return False, None  # it may still run here
            if dep_status != "succeeded" and not self.steps[dep].get("continueOnFailure") and blocked is None:
                blocked = dep
        return True, blocked

    def _start_ready(self, futures: dict[Future[ExecutorResult | None], str], pool: ThreadPoolExecutor | None) -> bool:
        """Start (or gate-skip) the steps that can go now, in execution order; True when anything happened."""
        changed = False
        for step_id in self.order:
            if self.halted or self.cancelled or self.timed_out or len(futures) >= self.max_parallel:
                break
            if step_id in self.attempted or self._status(step_id) in DONE_STEP:
                continue  # done here, or succeeded/skipped/cancelled before (a resumed run)
            ready, blocked = self._ready(step_id)
            if not ready:
                continue
            self.attempted.add(step_id)
            changed = True
            if blocked is not None and blocked in self.gated:
                self._flush()  # a closed change gate upstream: skipped too, and the run does not fail for it
                self.gated.add(step_id)
                with self.lock:
                    self.store.skip_steps(self.state, [step_id], f"dependency gate closed: {blocked}", timeutil.now())
                continue
            if blocked is None and self._gate_closed(step_id):
                continue
            if blocked is not None:
                # The dependency gate skips the step and fails the run, but does not stop the others.
                self._flush()
                with self.lock:
                    self.store.skip_steps(self.state, [step_id], f"dependency did not succeed: {blocked}",
                                          timeutil.now())
                    self.blocking = self.blocking or f"step {step_id} blocked by dependency {blocked}"
                    self.terminal = "failed"
                continue
            needs = self.remote.get(step_id)
            if needs is not None:
                self._flush()
                with self.lock:
                    found = remote_steps.dispatch(self.rt, self.store, self.state, step_id, needs)
                    if found is None:
                        self.halted = True
                        return changed
                    self.dispatched[step_id] = found
            with self.lock:
                after, self.pending_end = self.pending_end, None
                if needs is None and not self.store.start_step(self.state, step_id, timeutil.now(), after=after):
                    if self.state.terminal:
                        self.halted = True
                        return changed
                    # The previous step's end was refused (recover reset it meanwhile): decide again, with it.
                    self.attempted.discard(step_id)
                    return True
                cancel = threading.Event()
                self.step_cancels[step_id] = cancel
                # The monitor may have fired between the checks above and this registration (it stops only the
                # steps it sees): a step started then is stopped at once, as the reference's per-step
                # controller that is born aborted.
                if self.cancelled or self.timed_out:
                    cancel.set()
            if pool is None:
                self._finish_step(step_id, self._run_step(step_id, cancel), defer=True)
                return True
            futures[pool.submit(self._run_step, step_id, cancel)] = step_id
        return changed

    def _gate_closed(self, step_id: str) -> bool:
        """Probe the step's change gate, if it has one; a closed gate skips the step (its dependents follow) with
        ``gate closed (exit N)``, and the run does not fail for it."""
        gate = self.steps[step_id].get("gate")
        if not gate:
            return False
        metadata = RunMetadata(loop_id=self.loop.get("id"), loop_name=self.loop.get("name"),
                               workflow_id=str(self.spec["id"]), workflow_name=str(self.spec["name"]),
                               workflow_run_id=self.state.run_id, workflow_step_id=step_id)
        result = probe(gate, step_target(self.steps[step_id]), metadata)
        if result.open:
            return False
        self._flush()
        self.gated.add(step_id)
        with self.lock:
            self.store.skip_steps(self.state, [step_id], str(result.reason), timeutil.now())
        return True

    def run(self) -> WorkflowOutcome:
        futures: dict[Future[ExecutorResult | None], str] = {}
        pool = ThreadPoolExecutor(max_workers=self.max_parallel) if self.max_parallel > 1 else None
        monitor = threading.Thread(target=self._monitor, name="loopsq-wf-monitor", daemon=True)
        monitor.start()
        try:
            while True:
                started = self._start_ready(futures, pool)
                if not futures:
                    if started and not (self.halted or self.cancelled or self.timed_out):
                        continue
                    break
                done, _ = wait(list(futures), timeout=POLL_S, return_when=FIRST_COMPLETED)
                for future in done:
                    self._finish_step(futures.pop(future), future.result())
            self._flush()
        finally:
            self.done.set()
            if pool is not None:
                pool.shutdown(wait=True)
            self.rt.release(self.state.run_id)
        return self._conclude()

    def _conclude(self) -> WorkflowOutcome:
        now = timeutil.now()
        with self.lock:
            fresh = self.store.load(self.state.run_id)
            if fresh is not None and fresh.terminal:  # cancelled (from any host) while it ran
                self.state.run_raw, self.state.run = fresh.run_raw, fresh.run
                self.state.steps_raw, self.state.steps, self.state.events = fresh.steps_raw, fresh.steps, fresh.events
                return outcome_of(self.state)
            if self.timed_out and not self.halted:
                self.terminal, self.blocking = "timed_out", f"workflow timed out after {self.timeout_ms}ms"
            elif self.cancelled and not self.halted:
                self.terminal, self.blocking = "failed", self.blocking or "cancelled"
            if self.terminal != "succeeded":
                open_steps = [s["stepId"] for s in self.state.ordered_steps() if s["status"] in ("pending", "running")]
                self.store.skip_steps(self.state, open_steps, self.blocking or "workflow stopped before step could run",
                                      now)
            self.store.finish_run(self.state, self.terminal, now, error=self.blocking)
        return outcome_of(self.state)


def execute_workflow(
    rt: Runtime,
    spec: Mapping[str, Any],
    *,
    run_id: str | None = None,
    loop: Mapping[str, Any] | None = None,
    loop_run: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    timeout_ms: int | None = None,
    cancel: threading.Event | None = None,
    on_spawn: Callable[[SpawnInfo], None] | None = None,
) -> WorkflowOutcome:
    """Create (or find, by idempotency key) a workflow run and execute it to its end.

    A run found by key that is already terminal is returned without executing anything (the idempotent replay);
    one still running resumes, skipping the steps that succeeded (after ``recover`` reset its running steps).
    """
    store = RemoteStepStore(rt.client, rt.keys, rt.committer)
    state, _created = store.create(spec, timeutil.now(), run_id=run_id, loop=loop, loop_run=loop_run,
                                   idempotency_key=idempotency_key, owner=rt.owner.worker_id)
    if state.terminal:
        return outcome_of(state, replayed=True)
    log.info("workflow run %s started workflow=%s", state.run_id, spec["name"])
    with tracing.span("loopsq.workflow", attributes={"loopsq.workflow.id": str(spec["id"]),
                                                     "loopsq.workflow_run.id": state.run_id}) as traced:
        execution = _Execution(rt, spec, state, timeout_ms=timeout_ms, cancel=cancel, on_spawn=on_spawn, loop=loop)
        execution.loop_run_attempt = int(loop_run["attempt"]) if loop_run and loop_run.get("attempt") else None
        outcome = execution.run()
        traced.set("loopsq.status", outcome.status)
        if outcome.status != "succeeded":
            traced.fail(outcome.error)
    log.info("workflow run %s %s workflow=%s", state.run_id, state.run.get("status"), spec["name"])
    return outcome
