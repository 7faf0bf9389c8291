"""Workspace leases of workflow steps (``steps[].workspace``): a step and every loop or step sharing its key never
run at once, across all hosts (``state.workspaces``).

A step is not a loop run, so it has no run lease to follow: it holds a lease of its own, ``keys.lease(holder)``
for the holder ``step:<workflow run>:<step>``, set before it asks for the workspace and beaten by a thread every
third of ``STEP_LEASE_MS`` while it waits and while it runs. The workspace lease names that holder, so it is live
exactly while the step's lease is: a worker killed mid-step stops beating, and ``STEP_LEASE_MS`` later the next
contender takes the workspace over (a fence one higher). A busy workspace is waited for in the key's fair queue,
up to the step's ``workspaceWaitMs`` (10 minutes by default); a step that cannot get it fails with ``workspace
busy: KEY (held by …; waited …)``, as any failed step (``continueOnFailure`` applies).

A step run by another worker than its workflow run's (``remote_steps``) holds that same lease from its claim on,
beaten by ``beaten_lease``; its workspace is held under it (``step_workspace(..., lease_token=...)``).

A step whose own lease is lost all the same (its worker frozen, or cut off from Redis, for longer than the lease)
never runs without the workspace: it is not started, or it is stopped (its cancel event set), as a loop run that
loses its lease is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
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
def beaten_lease(leases: WorkspaceLeases, holder: str, token: str, *,
                 on_lost: Callable[[], None] | None = None) -> Iterator[None]:
    """Renew ``holder``'s own lease (held as ``token``) every third of ``STEP_LEASE_MS`` while the block runs;
    ``on_lost`` is called once if it is lost. The lease is left as it is at the end (the caller drops it)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(STEP_LEASE_MS / 3000):
            try:
                if not leases.renew_own_lease(holder, token, STEP_LEASE_MS):
                    log.warning("step %s lost its own lease", holder)
                    if on_lost is not None:
                        on_lost()
                    return
            except redis.RedisError as exc:  # an outage: the lease outlives a short one; try again next beat
                log.warning("step %s could not renew its own lease: %s", holder, exc)

    beater = threading.Thread(target=beat, name=f"step-lease-{holder}", daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join(timeout=5)


@contextmanager
def step_workspace(store: RunStore, key: str, workflow_run_id: str, step_id: str, *, wait_ms: int | None,
                   cancel: threading.Event, lease_token: str | None = None) -> Iterator[str | None]:
    """Hold ``key`` for the step while the block runs. Yields None when held, or the error the step fails with.

    ``lease_token``: the step's own lease is held already, as that token, and beaten by the caller (a step run
    for another worker's workflow run, ``remote_steps``); otherwise it is taken here, beaten and dropped.
    """
    holder = holder_id(workflow_run_id, step_id)
    leases = WorkspaceLeases(store)
    if lease_token is not None:
        with _held_workspace(leases, key, holder, lease_token, wait_ms, cancel) as busy:
            yield busy
        return
    token = gen_id()
    if not leases.take_own_lease(holder, token, STEP_LEASE_MS):
        yield f"workspace {key}: could not take the step's own lease"
        return
    lost = threading.Event()

    def on_lost() -> None:
        # The workspace is anyone's now: the step must not go on (or start) without it.
        log.warning("step %s lost its workspace lease of %s; stopping it", holder, key)
        lost.set()
        cancel.set()

    try:
        with beaten_lease(leases, holder, token, on_lost=on_lost), \
                _held_workspace(leases, key, holder, token, wait_ms, cancel, lost) as busy:
            yield busy
    finally:
        leases.drop_own_lease(holder, token)


@contextmanager
def _held_workspace(leases: WorkspaceLeases, key: str, holder: str, token: str, wait_ms: int | None,
                    cancel: threading.Event, lost: threading.Event | None = None) -> Iterator[str | None]:
    """``key`` held for ``holder``, whose own lease is ``token``, while the block runs (waiting in the key's fair
    queue while it is busy); yields None when held, or the error the step fails with."""
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
            gone = lost is not None and lost.is_set()
            yield (busy_error(key, busy.run_id)[:-1] + waited + ")") if busy is not None and not gone else \
                f"workspace {key}: the step's own lease was lost"
            return
        log.info("step %s holds workspace %s (fence %d)", holder, key, fence)
        yield None
    finally:
        leases.release(key, holder, token)
