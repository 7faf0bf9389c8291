"""Workspace leases at run time (``--workspace KEY``, ``state.workspaces``): before a slot is claimed, and once it
is, with the run's lease held.

Before the claim (``busy_slot``), a loop whose overlap is not ``allow`` that finds its workspace held by a live
run records the slot ``skipped`` with ``workspace busy: KEY (held by run <id>)``, or defers a pending retry (a
busy workspace consumes no attempt). After the claim (``hold_workspace``) the run takes the lease; ``allow``
waits in the workspace's fair queue up to ``workspaceWaitMs`` (10 minutes by default). A run that cannot get it
is ended ``skipped`` with the same reason (``state.feature_skips.end_skipped``), never failed nor retried.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from loopsq.domain import timeutil
from loopsq.domain.durations import format_duration
from loopsq.domain.loop_features import DEFAULT_WORKSPACE_WAIT_MS
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import to_iso
from loopsq.engine.runtime import Held, Runtime
from loopsq.state.feature_skips import end_skipped, skip_slot
from loopsq.state.runs import Claim
from loopsq.state.workspaces import WorkspaceLeases

log = logging.getLogger("loopsq.runs")

WORKSPACE_BUSY = "workspace_busy"
POLL_S = 0.2
RETRY_DEFER = timedelta(seconds=1)


def busy_error(key: str, holder_run: str) -> str:
    """``workspace busy: KEY (held by run <id>)``, or ``(held by step <step> of workflow run <id>)`` when a workflow
    step holds it (``engine.step_workspaces``)."""
    if holder_run.startswith("step:") and holder_run.count(":") >= 2:
        _, workflow_run, step = holder_run.split(":", 2)
        return f"workspace busy: {key} (held by step {step} of workflow run {workflow_run})"
    return f"workspace busy: {key} (held by run {holder_run})"


def busy_slot(rt: Runtime, loop: Loop, slot: datetime, now: datetime, *, is_retry: bool,
              ends_backlog: bool = False) -> tuple[bool, LoopRun | None]:
    """``(True, skipped row or None)`` when the slot must not be claimed because the loop's workspace is busy
    (overlap ``skip``/``replace``); ``(False, None)`` otherwise."""
    if loop.workspace is None or loop.overlap == "allow":
        return False, None
    holder = WorkspaceLeases(rt.runs).live_holder(loop.workspace)
    if holder is None:
        return False, None
    if is_retry:
        rt.runs.defer_retry(loop.id, now + RETRY_DEFER, now)
        return True, None
    error = busy_error(loop.workspace, holder.run_id)
    log.info("slot %s of loop=%s skipped: %s", to_iso(slot), loop.name, error)
    return True, skip_slot(rt.runs, loop.id, slot, now, error=error, note=WORKSPACE_BUSY, ends_backlog=ends_backlog)


def hold_workspace(rt: Runtime, claim: Claim, held: Held) -> LoopRun | None:
    """Take the claimed run's workspace lease (waiting in the fair queue for overlap ``allow``). None: taken (or
    the loop has none): execute the run. Otherwise the run as ended (``skipped``), or as last seen when our own
    lease was lost meanwhile."""
    loop, run = claim.loop, claim.run
    key = loop.workspace
    if key is None:
        return None
    leases = WorkspaceLeases(rt.runs)
    got = leases.acquire(key, run.id, claim.token, timeutil.now())
    if got.run is not None:
        return None
    holder = got.holder
    waited = ""
    if holder is not None and loop.overlap == "allow":
        wait_ms = loop.workspace_wait_ms or DEFAULT_WORKSPACE_WAIT_MS
        leases.enqueue(key, run.id, timeutil.now())
        deadline = time.monotonic() + wait_ms / 1000
        try:
            while time.monotonic() < deadline and not held.cancel.is_set():
                if leases.first_waiting(key) == run.id:
                    got = leases.acquire(key, run.id, claim.token, timeutil.now())
                    if got.run is not None:
                        return None
                    holder = got.holder
                    if holder is None:
                        break
                time.sleep(POLL_S)
        finally:
            leases.leave(key, run.id)
        waited = f"; waited {format_duration(wait_ms)}" if not held.cancel.is_set() else f"; {held.reason}"
    if holder is None:
        return rt.runs.get(run.id) or run  # our lease is lost: whoever has the run now records it
    error = busy_error(key, holder.run_id)[:-1] + waited + ")"
    log.info("run %s of loop=%s skipped: %s", run.id, loop.name, error)
    ended = end_skipped(rt.runs, run.id, claim.token, timeutil.now(), error=error, note=WORKSPACE_BUSY)
    return ended[0] if ended is not None else (rt.runs.get(run.id) or run)


def release_workspace(rt: Runtime, claim: Claim) -> None:
    """Drop the run's workspace lease if it still holds it (a finalized run's lease is dead anyway)."""
    if claim.loop.workspace is not None:
        WorkspaceLeases(rt.runs).release(claim.loop.workspace, claim.run.id, claim.token)
