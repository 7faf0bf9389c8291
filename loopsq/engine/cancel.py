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


def cancel_run(client: redis.Redis, keys: Keys, run_id: str, now: datetime, reason: str | None = None) -> LoopRun:
    """Ask the worker executing ``run_id`` to stop it; returns the run as it stands (still ``running``).

    Raises:
        NotFoundError: ``run not found: <id>``.
        ConflictError: ``run <id> is not running (<status>)``.
    """
    runs = RunStore(client, keys)
    run = runs.get(run_id)
    if run is None:
        raise NotFoundError(f"run not found: {run_id}")
    if run.status != "running":
        raise ConflictError(f"run {run_id} is not running ({run.status})")
    error = rules.user_cancel_error(reason)
    runs.request_cancel(run_id, error)
    workflows = WorkflowRunStore(client, keys)
    for wf_run_id in workflows.for_loop_run(run_id):
        state = workflows.load(wf_run_id)
        if state is not None and not state.terminal:
            workflows.cancel(wf_run_id, now, error)
    return run
