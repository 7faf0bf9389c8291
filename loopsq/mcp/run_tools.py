"""The mutation tools that start a run on a worker and may wait for it: ``loop_run_now`` and ``workflow_run``.

Unlike the reference's ``loop_run_now`` (which only marks the loop due), loopsq's hands the run to a worker, as
``loopsq run-now`` does: its due retry, its due slot, or an ad-hoc slot. With ``wait`` (seconds, bounded) the
call returns once the run ended, and until then sends MCP progress notifications carrying the run's status and
the tail of its output; a run still going when ``wait`` is up is returned as it is (``finished: false``).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.to_thread

from loopsq.domain.redaction import public_run, public_step_run, public_workflow_run
from loopsq.domain.run_rules import TERMINAL, LoopRun
from loopsq.domain.timeutil import gen_id
from loopsq.engine.routing import enqueue_for_loop, enqueue_for_workflow
from loopsq.errors import LoopsqError
from loopsq.mcp import schemas as s
from loopsq.mcp.context import McpContext
from loopsq.mcp.output import progress_tail
from loopsq.mcp.registry import Call, Tool
from loopsq.state.loops import LoopStore
from loopsq.state.runs import RunStore
from loopsq.state.workflow_run_state import WorkflowRunState
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore

#: How long a worker has to take a run-now request (as ``loopsq run-now``'s default ``--wait``).
PICKUP_S = 30.0
POLL_S = 0.1
#: A progress notification at least this often while waiting, and on every change of status or output.
PROGRESS_EVERY_S = 1.0
#: Prefix of a run-now request's answer when the worker refused the run (``worker.jobs.REFUSED``).
REFUSED = "!"


class _Reporter:
    """Progress notifications with a strictly increasing progress value (elapsed seconds), sent when the message
    changes or ``PROGRESS_EVERY_S`` passed."""

    def __init__(self, call: Call, wait_s: float) -> None:
        self.call, self.total = call, wait_s or None
        self.started = time.monotonic()
        self.last_value = -1.0
        self.last_message: str | None = None
        self.last_sent = 0.0

    async def report(self, message: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and message == self.last_message and now - self.last_sent < PROGRESS_EVERY_S:
            return
        value = max(round(now - self.started, 3), self.last_value + 0.001)
        self.last_value, self.last_message, self.last_sent = value, message, now
        await self.call.progress(value, self.total, message)


def _status_message(kind: str, run_id: str, status: str, tail: str) -> str:
    return f"{kind} {run_id} {status}" + (f"\n{tail}" if tail else "")


def _str(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else (None if value is None else str(value))


async def _await_pickup(ctx: McpContext, request_id: str, reporter: _Reporter) -> str:
    """The run id a worker published for the request; an error when it refused, or none took it in time."""
    deadline = time.monotonic() + PICKUP_S
    while True:
        value = _str(await anyio.to_thread.run_sync(ctx.client.get, ctx.keys.run_request(request_id)))
        if value is not None:
            if value.startswith(REFUSED):
                raise LoopsqError(value[len(REFUSED):])
            return value
        if time.monotonic() > deadline:
            raise LoopsqError(f"no worker picked up the run within {PICKUP_S:g}s; is `loopsq worker` running?")
        await reporter.report("queued: waiting for a worker")
        await anyio.sleep(POLL_S)


def _read_loop_run(ctx: McpContext, request_id: str, run_id: str) -> tuple[str, LoopRun | None, str]:
    # The request may be answered again with another run id (the worker moved on to the next slot); follow it.
    latest = _str(ctx.client.get(ctx.keys.run_request(request_id)))
    if latest and not latest.startswith(REFUSED):
        run_id = latest
    run = RunStore(ctx.client, ctx.keys).get(run_id)
    tail = progress_tail(ctx, run_id) if run is not None and run.status == "running" else ""
    return run_id, run, tail


async def loop_run_now(call: Call) -> dict[str, Any]:
    ctx, args = call.ctx, call.args
    wait_s, show_output = float(args.get("wait", 0)), bool(args.get("showOutput", False))
    reporter = _Reporter(call, wait_s)
    deadline = reporter.started + wait_s
    loop = await anyio.to_thread.run_sync(LoopStore(ctx.client, ctx.keys).require, args["idOrName"])
    request_id = gen_id()
    await anyio.to_thread.run_sync(
        lambda: enqueue_for_loop(ctx.client, ctx.keys, loop, "worker.jobs.run_now", loop.id, request_id))
    run_id = await _await_pickup(ctx, request_id, reporter)
    while True:
        run_id, run, tail = await anyio.to_thread.run_sync(_read_loop_run, ctx, request_id, run_id)
        status = run.status if run is not None else "starting"
        finished = run is not None and run.status in TERMINAL
        if finished or time.monotonic() >= deadline:
            if wait_s:
                await reporter.report(_status_message("run", run_id, status, tail), force=True)
            break
        await reporter.report(_status_message("run", run_id, status, tail))
        await anyio.sleep(POLL_S)
    if run is None:  # published but not readable yet: the worker is recording it
        return {"id": run_id, "status": "running", "loopId": loop.id, "loopName": loop.name,
                "runNow": {"source": None, "advancesLoop": None, "finished": False}}
    source = run.source or "ad_hoc"
    return {**public_run(run.to_dict(), show_output),
            "runNow": {"source": source, "advancesLoop": source in ("due_slot", "retry_slot"), "finished": finished}}


def _workflow_progress(ctx: McpContext, state: WorkflowRunState) -> str:
    running = [step for step in state.ordered_steps() if step.get("status") == "running"]
    if not running:
        return _status_message("workflow run", state.run_id, str(state.run.get("status")), "")
    step = str(running[0]["stepId"])
    return _status_message("workflow run", state.run_id, f"{state.run.get('status')} step={step}",
                           progress_tail(ctx, state.run_id, step))


async def workflow_run(call: Call) -> dict[str, Any]:
    ctx, args = call.ctx, call.args
    wait_s, show_output = float(args.get("wait", 0)), bool(args.get("showOutput", False))
    reporter = _Reporter(call, wait_s)
    deadline = reporter.started + wait_s
    spec = await anyio.to_thread.run_sync(WorkflowStore(ctx.client, ctx.keys).require, args["idOrName"])
    run_id = gen_id()
    await anyio.to_thread.run_sync(lambda: enqueue_for_workflow(ctx.client, ctx.keys, spec, run_id))
    result: dict[str, Any] = {"runId": run_id, "workflowId": spec["id"], "workflowName": spec["name"],
                              "status": "queued", "finished": False}
    store = WorkflowRunStore(ctx.client, ctx.keys)
    state: WorkflowRunState | None = None
    while wait_s:
        state = await anyio.to_thread.run_sync(store.load, run_id)
        message = (await anyio.to_thread.run_sync(_workflow_progress, ctx, state) if state is not None
                   else _status_message("workflow run", run_id, "queued: waiting for a worker", ""))
        if (state is not None and state.terminal) or time.monotonic() >= deadline:
            await reporter.report(message, force=True)
            break
        await reporter.report(message)
        await anyio.sleep(POLL_S)
    if state is not None:
        result.update(status=state.run.get("status"), finished=state.terminal,
                      workflowRun=public_workflow_run(state.run),
                      steps=[public_step_run(step, show_output) for step in state.ordered_steps()])
    return result


TOOLS = (
    Tool("loop_run_now", "Run a loop now on a worker (its due retry, its due slot, or an ad-hoc slot), unlike the "
         "reference, which only marks it due. With wait, return the finished run, sending progress notifications "
         "(status and output tail) meanwhile. Output redacted unless showOutput.",
         s.obj({"idOrName": s.LOOP_REF, "wait": s.WAIT, "showOutput": s.SHOW_OUTPUT}, ("idOrName",)),
         loop_run_now, mutation=True),
    Tool("workflow_run", "Run a workflow on a worker (every call makes a new run). With wait, return the ended "
         "run with its steps, sending progress notifications (status, running step, output tail) meanwhile.",
         s.obj({"idOrName": s.WORKFLOW_REF, "wait": {**s.WAIT, "description": s.WAIT["description"].replace(
             "0 returns once it has started", "0 returns at once, queued")},
                "showOutput": s.SHOW_OUTPUT}, ("idOrName",)),
         workflow_run, mutation=True),
)
