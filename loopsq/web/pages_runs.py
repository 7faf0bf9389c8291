"""Dashboard pages of one run: a loop run (its output, stored or live, and its earlier attempts) and a workflow
run (its DAG, each step's output, stored or live, and its event timeline), with their actions.

Output is shown by default: it was scrubbed of secrets before it was stored (``domain.scrub``), and control
characters in it are shown escaped (``\x1b``: ``domain.text.terminal_safe``). The viewer may hide it
(``?showOutput=false``, the page's "Hide output" link: redacted then, as the CLI and the API redact it). While a run
or step goes on, its output comes from its live stream (``web/live.py``): the page shows what the stream holds and
``/static/live.js`` appends what comes next.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from loopsq.domain.redaction import public_event, public_run, public_step_run, redact
from loopsq.domain.scrub import SHAPES
from loopsq.domain.text import shown, terminal_safe
from loopsq.engine.recovery import step_alive
from loopsq.errors import NotFoundError
from loopsq.mirror import queries
from loopsq.state.workflow_run_state import TERMINAL_RUN
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.web import dag, live
from loopsq.web.dashboard import render
from loopsq.web.deps import Ctx, ShowOutput

router = APIRouter(include_in_schema=False)

LIVE_STEP_STATUSES = ("pending", "running")


def _shown_text(text: str, show_output: bool) -> str:
    return terminal_safe(SHAPES.text(text)) if show_output else redact(text)


def _safe(record: dict[str, Any]) -> dict[str, Any]:
    """A public run or step with its output, error and earlier attempts' output shown escaped, and scrubbed of the
    secret shapes once more: a run stored before loopsq scrubbed at write is shown by default too."""
    for key in ("stdout", "stderr", "error"):
        if isinstance(record.get(key), str):
            record[key] = terminal_safe(SHAPES.text(record[key]))
    if isinstance(record.get("previousAttempts"), list):
        record["previousAttempts"] = [_safe(dict(a)) if isinstance(a, dict) else a for a in record["previousAttempts"]]
    return record


def _live_query(show_output: bool) -> str:
    return "showOutput=true" if show_output else "showOutput=false"


@router.get("/runs/{run_id}")
def run_page(request: Request, ctx: Ctx, run_id: str, show_output: ShowOutput = True) -> HTMLResponse:
    """One loop run: its output (live while it runs; redacted when hidden) and its earlier attempts."""
    with ctx.mirror() as conn:
        run = queries.get_run(conn, run_id)
        workflow_runs = queries.list_workflow_runs(conn, loop_run_id=run_id, limit=20) if run else []
    if run is None:
        raise NotFoundError(f"run not found: {shown(run_id)}")
    public = _safe(public_run(run, show_output))
    context: dict[str, Any] = {"run": public, "show_output": show_output, "live": None,
                               "workflow_runs": workflow_runs}
    if run.get("status") == "running":
        source = live.run_source(ctx, run_id)
        held = live.snapshot(ctx.raw(), source)
        public["stdout"] = _shown_text(held["stdout"], show_output)
        public["stderr"] = _shown_text(held["stderr"], show_output)
        context["live"] = {"url": f"/runs/{run_id}/live?{_live_query(show_output)}",
                           "after": json.dumps({"": source.last}), "chars": {k: len(v) for k, v in held.items()}}
    return render(request, ctx, "run.html", context, refresh=run.get("status") == "running")


def recoverable(ctx: Ctx, run_id: str) -> bool:
    """Whether Recover applies to a running workflow run, as the action decides it (``actions.py``,
    ``WorkflowRunStore.recover``): it has running steps and none of their processes (or, on another host, their
    workers) is alive any more. A finished run, or one with nothing running or something still alive, has nothing
    to recover."""
    state = WorkflowRunStore(ctx.client, ctx.keys).load(run_id)
    if state is None or state.terminal:
        return False
    running = [s for s in state.ordered_steps() if s.get("status") == "running"]
    alive = step_alive(ctx.client, ctx.keys, state.run)
    return bool(running) and not any(alive(s) for s in running)


@router.get("/workflow-runs/{run_id}")
def workflow_run_page(request: Request, ctx: Ctx, run_id: str, show_output: ShowOutput = True) -> HTMLResponse:
    """A workflow run: its DAG (steps coloured by status), each step's output (live while it runs) and its
    event timeline."""
    with ctx.mirror() as conn:
        run = queries.get_workflow_run(conn, run_id)
        if run is None:
            raise NotFoundError(f"workflow run not found: {shown(run_id)}")
        steps = queries.list_step_runs(conn, run_id)
        events = [public_event(e) for e in queries.list_events(conn, run_id, limit=10_000)]
        spec = queries.get_workflow(conn, str(run.get("workflowId")))
    spec_steps = (spec or {}).get("steps") or [{"id": s["stepId"]} for s in steps]
    graph = dag.layout(spec_steps, {s["stepId"]: s["status"] for s in steps},
                       {s["stepId"]: s.get("error") for s in steps})
    running = run.get("status") not in TERMINAL_RUN
    outputs = []
    positions: dict[str, str] = {}
    open_steps = [str(s["stepId"]) for s in steps if running and s.get("status") in LIVE_STEP_STATUSES]
    sources = {src.name: src for src in live.step_sources(ctx.client, ctx.keys, run_id, open_steps)}
    raw = ctx.raw() if sources else None
    for step in steps:
        step_id = str(step["stepId"])
        public = _safe(public_step_run(step, show_output))
        source = sources.get(step_id)
        chars = {"stdout": 0, "stderr": 0}
        if source is not None and raw is not None:
            held = live.snapshot(raw, source)
            public["stdout"], public["stderr"] = (_shown_text(held[k], show_output) for k in ("stdout", "stderr"))
            chars = {k: len(v) for k, v in held.items()}
            positions[step_id] = source.last
        outputs.append({"step": public, "live": source is not None, "chars": chars})
    live_view = ({"url": f"/workflow-runs/{run_id}/live?{_live_query(show_output)}", "after": json.dumps(positions)}
                 if sources else None)
    return render(request, ctx, "workflow_run.html",
                  {"run": run, "steps": steps, "events": events, "graph": graph, "dag": dag, "outputs": outputs,
                   "live": live_view, "show_output": show_output, "running": running,
                   "recoverable": running and recoverable(ctx, run_id)},
                  refresh=running)
