"""Cancelling a running loop run from any host: the executing worker's beat sees the request within a second
and kills the run's process group; the run is recorded ``failed`` with the reason and is not retried. A workflow
loop's run cancels its workflow run too (its running step is killed, its open steps end ``cancelled``)."""

from __future__ import annotations

from datetime import datetime

import redis

from loopsq.domain import run_rules as rules
from loopsq.domain.run_rules import LoopRun
from loopsq.errors import ConflictError, NotFoundError
from loopsq.state.keys import Keys
from loopsq.state.runs import RunStore
from loopsq.state.workflow_runs import WorkflowRunStore


def request_run_cancel(client: redis.Redis, keys: Keys, run_id: str, now: datetime,
                       reason: str | None = None) -> tuple[LoopRun, bool] | None:
    """Ask the worker executing a running loop run to stop it (``cancelled by user[: reason]``), and cancel the
    workflow run of a workflow loop's run. Returns the run as read and whether it was still running (only then is
    anything requested); None when Redis holds no such run."""
    error = rules.user_cancel_error(reason)
    found = RunStore(client, keys).request_cancel_if_running(run_id, error)
    if found is None or not found[1]:
        return found
    workflows = WorkflowRunStore(client, keys)
    for wf_run_id in workflows.for_loop_run(run_id):
        state = workflows.load(wf_run_id)
        if state is not None and not state.terminal:
            workflows.cancel(wf_run_id, now, error)
    return found


def cancel_run(client: redis.Redis, keys: Keys, run_id: str, now: datetime, reason: str | None = None) -> LoopRun:
    """``request_run_cancel`` for a run that must be running; returns the run as it stands (still ``running``).

    Raises:
        NotFoundError: ``run not found: <id>``.
        ConflictError: ``run <id> is not running (<status>)``.
    """
    found = request_run_cancel(client, keys, run_id, now, reason)
    if found is None:
        raise NotFoundError(f"run not found: {run_id}")
    run, requested = found
    if not requested:
        raise ConflictError(f"run {run_id} is not running ({run.status})")
    return run
