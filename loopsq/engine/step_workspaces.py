"""Workspace leases of workflow steps (``steps[].workspace``): a step and every loop or step sharing its key never
run at once, across all hosts (``state.workspaces``).

A step is not a loop run, so it has no run lease to follow: it holds a lease of its own, ``keys.lease(holder)``
for the holder ``step:<workflow run>:<step>``, set before it asks for the workspace and beaten by a thread every
third of ``STEP_LEASE_MS`` while it waits and while it runs. The workspace lease names that holder, so it is live
exactly while the step's lease is: a worker killed mid-step stops beating, and ``STEP_LEASE_MS`` later the next
contender takes the workspace over (a fence one higher). A busy workspace is waited for in the key's fair queue,
up to the step's ``workspaceWaitMs`` (10 minutes by default); a step that cannot get it fails with ``workspace
busy: KEY (held by …; waited …)``, as any failed step (``continueOnFailure`` applies).

A step whose own lease is lost all the same (its worker frozen, or cut off from Redis, for longer than the lease)
never runs without the workspace: it is not started, or it is stopped (its cancel event set), as a loop run that
loses its lease is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from loopsq.domain import timeutil
from loopsq.domain.durations import format_duration
from loopsq.domain.loop_features import DEFAULT_WORKSPACE_WAIT_MS
from loopsq.domain.timeutil import gen_id
from loopsq.engine.workspaces import POLL_S, busy_error
from loopsq.state.runs import RunStore
from loopsq.state.workspaces import WorkspaceLeases

log = logging.getLogger("loopsq.workflows")

#: A step holder's own lease: how long a killed worker's step keeps its workspace before the next takes it over.
STEP_LEASE_MS = 10_000


def holder_id(workflow_run_id: str, step_id: str) -> str:
    """The holder a step's workspace lease names."""
    return f"step:{workflow_run_id}:{step_id}"


@contextmanager
def step_workspace(store: RunStore, key: str, workflow_run_id: str, step_id: str, *, wait_ms: int | None,
                   cancel: threading.Event) -> Iterator[str | None]:
    """Hold ``key`` for the step while the block runs. Yields None when held, or the error the step fails with."""
    holder, token = holder_id(workflow_run_id, step_id), gen_id()
    leases = WorkspaceLeases(store)
    if not leases.take_own_lease(holder, token, STEP_LEASE_MS):
        yield f"workspace {key}: could not take the step's own lease"
        return
    stop, lost = threading.Event(), threading.Event()

    def beat() -> None:
        while not stop.wait(STEP_LEASE_MS / 3000):
            try:
                if not leases.renew_own_lease(holder, token, STEP_LEASE_MS):
                    # The workspace is anyone's now: the step must not go on (or start) without it.
                    log.warning("step %s lost its workspace lease of %s; stopping it", holder, key)
                    lost.set()
                    cancel.set()
                    return
            except redis.RedisError as exc:  # an outage: the lease outlives a short one; try again next beat
                log.warning("step %s could not renew its workspace lease: %s", holder, exc)

    beater = threading.Thread(target=beat, name=f"workspace-{step_id}", daemon=True)
    beater.start()
    try:
        fence, busy = leases.acquire_as(key, holder, token, timeutil.now())
        waited = ""
        if fence is None and busy is not None:
            wait = wait_ms or DEFAULT_WORKSPACE_WAIT_MS
            leases.enqueue(key, holder, timeutil.now())
            deadline = time.monotonic() + wait / 1000
            try:
                while fence is None and busy is not None and time.monotonic() < deadline and not cancel.is_set():
                    if leases.first_waiting(key) == holder:
                        fence, busy = leases.acquire_as(key, holder, token, timeutil.now())
                    if fence is None:
                        time.sleep(POLL_S)
            finally:
                leases.leave(key, holder)
            waited = f"; waited {format_duration(wait)}" if not cancel.is_set() else "; cancelled"
        if fence is None:
            yield (busy_error(key, busy.run_id)[:-1] + waited + ")") if busy is not None and not lost.is_set() else \
                f"workspace {key}: the step's own lease was lost"
            return
        log.info("step %s holds workspace %s (fence %d)", holder, key, fence)
        yield None
    finally:
        stop.set()
        beater.join(timeout=5)
        leases.release(key, holder, token)
        leases.drop_own_lease(holder, token)
