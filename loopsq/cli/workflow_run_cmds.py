"""Workflow run commands (§7.2): ``workflows run|runs|events|inspect|cancel|recover``."""

from __future__ import annotations

import time
from typing import Any

import click

from loopsq.cli.app import App, echo_err, get_app, json_flag
from loopsq.cli.options import bounded_flag, limit_flag
from loopsq.cli.workflows_cmds import workflows
from loopsq.domain import limits, timeutil
from loopsq.domain.redaction import public_event, public_step_run, public_workflow_run
from loopsq.domain.text import shown
from loopsq.domain.timeutil import gen_id
from loopsq.engine.recovery import step_alive
from loopsq.engine.routing import enqueue_for_workflow
from loopsq.errors import NotFoundError, ValidationError
from loopsq.mirror import queries
from loopsq.state.workflow_runs import WorkflowRunStore


def _store(app: App) -> WorkflowRunStore:
    return WorkflowRunStore(app.client(), app.keys)


def _run_error(run: dict[str, Any]) -> list[str]:
    """The line just under a run's own line that says why it did not succeed (none when it has no error)."""
    return [f"  error: {run['error']}"] if run.get("error") and run.get("status") != "succeeded" else []


def _step_lines(steps: list[dict[str, Any]]) -> list[str]:
    return [f"  {int(s['sequence']):02d}  {s['status']:<10}  {s['stepId']}  {s.get('error') or ''}".rstrip()
            for s in steps]


@workflows.command("run")
@click.argument("id_or_name")
@click.option("--local", is_flag=True, help="Run in this process instead of on a worker.")
@click.option("--show-output", is_flag=True, help="Include each step's stdout and stderr.")
@click.option("--wait", "wait_s", default=30.0, show_default=True, metavar="SECONDS",
              help="How long to wait for a worker to pick the run up (it stays queued after that).")
@click.option("--no-wait", is_flag=True,
              help="Queue the run for a worker, print its id and return (exit 0), as the API's 202 does.")
@json_flag
def run(id_or_name: str, local: bool, show_output: bool, wait_s: float, no_wait: bool) -> None:
    """Run a workflow now and print the run it created (exit 1 unless it succeeds)."""
    if no_wait and local:
        raise ValidationError("--no-wait runs the workflow on a worker; drop --local or --no-wait")
    app = get_app()
    spec = app.workflows().require(id_or_name)
    run_id = gen_id()
    if no_wait:
        enqueue_for_workflow(app.client(), app.keys, spec, run_id)
        app.emit({"runId": run_id, "workflowId": spec["id"], "workflowName": spec["name"], "status": "queued"},
                 f"{run_id} queued")
        return
    if local:
        from loopsq.engine.runtime import Runtime
        from loopsq.engine.workflow_runner import execute_workflow

        rt = Runtime(client=app.client(), keys=app.keys, role="manual").start()
        try:
            execute_workflow(rt, spec, run_id=run_id)
        finally:
            rt.stop()
    else:
        enqueue_for_workflow(app.client(), app.keys, spec, run_id)
        if not app.json:  # its id first, so a wait that ends (or an interrupt) still leaves the run findable
            echo_err(f"workflow run {run_id} queued")
        _wait_terminal(app, run_id, wait_s)
    state = _store(app).require(run_id)
    steps = state.ordered_steps()
    result = {"status": state.run["status"], "error": state.run.get("error")}
    payload = {"result": result, "workflowRun": public_workflow_run(state.run),
               "steps": [public_step_run(s, show_output) for s in steps]}
    lines = [f"{run_id} {state.run['status']}", *_run_error(state.run), *_step_lines(steps)]
    if show_output:
        for s in steps:
            lines += [f"--- {s['stepId']} stdout:", (s.get("stdout") or "").rstrip("\n"),
                      f"--- {s['stepId']} stderr:", (s.get("stderr") or "").rstrip("\n")]
    app.emit(payload, "\n".join(lines))
    if state.run["status"] != "succeeded":
        raise click.exceptions.Exit(1)


def _wait_terminal(app: App, run_id: str, wait_s: float) -> None:
    store = _store(app)
    deadline = time.monotonic() + wait_s
    while True:
        state = store.load(run_id)
        if state is None and time.monotonic() > deadline:
            from loopsq.errors import LoopsqError

            raise LoopsqError(f"no worker picked up workflow run {run_id} within {wait_s:g}s; it stays queued "
                              "for a worker (is `loopsq worker` running? --no-wait returns at once; --local runs "
                              "it here)")
        if state is not None and state.terminal:
            return
        if state is not None and _owner_gone(app, state.run):
            from loopsq.errors import LoopsqError

            raise LoopsqError(f"the worker running workflow run {run_id} died; maintenance (`loopsq scheduler`) "
                              "records the run failed; run the workflow again")
        time.sleep(0.05)


def _owner_gone(app: App, run: dict[str, Any]) -> bool:
    """True once the worker executing ``run`` has lost its liveness key (checked at most every 2 s)."""
    worker = run.get("workerId")
    now = time.monotonic()
    if not worker or now < _owner_checks.get(str(worker), 0.0):
        return False
    _owner_checks[str(worker)] = now + 2.0
    return not app.client().exists(app.keys.worker(str(worker)))


_owner_checks: dict[str, float] = {}


@workflows.command("runs")
@click.argument("id_or_name", required=False)
@click.option("--limit", default=50, show_default=True, metavar="N",
              help=f"At most N runs (1 to {limits.MAX_PAGE_LIMIT}).")
@json_flag
def runs(id_or_name: str | None, limit: int) -> None:
    """Workflow runs, newest first."""
    limit_flag("--limit", limit, limits.MAX_PAGE_LIMIT)
    app = get_app()
    conn = app.mirror()
    workflow_id = None
    if id_or_name is not None:
        spec = queries.find_workflow(conn, id_or_name)
        if spec is None:
            raise NotFoundError(f"workflow not found: {shown(id_or_name)}")
        workflow_id = spec["id"]
    rows = queries.list_workflow_runs(conn, workflow_id=workflow_id, limit=limit)
    app.emit([public_workflow_run(r) for r in rows], lambda: "\n".join(
        f"{r['id']}  {r['status']:<10}  {r['workflowName']}  started={r.get('startedAt') or '-'}" for r in rows))


@workflows.command("events")
@click.argument("run_id")
@click.option("--limit", default=200, show_default=True, metavar="N",
              help=f"At most N events (1 to {limits.MAX_EVENT_PAGE_LIMIT}).")
@json_flag
def events(run_id: str, limit: int) -> None:
    """A workflow run's events in sequence order."""
    limit_flag("--limit", limit, limits.MAX_EVENT_PAGE_LIMIT)
    app = get_app()
    conn = app.mirror()
    if queries.get_workflow_run(conn, run_id) is None:
        raise NotFoundError(f"workflow run not found: {shown(run_id)}")
    rows = queries.list_events(conn, run_id, limit=limit)
    app.emit([public_event(e) for e in rows], lambda: "\n".join(
        f"{int(e['sequence']):03d}  {e['eventType']:<14}  {e.get('stepId') or '-'}  {e['createdAt']}" for e in rows))


@workflows.command("inspect")
@click.argument("run_id")
@json_flag
def inspect(run_id: str) -> None:
    """A workflow run with its steps and events (outputs redacted)."""
    app = get_app()
    conn = app.mirror()
    run_row = queries.get_workflow_run(conn, run_id)
    if run_row is None:
        raise NotFoundError(f"workflow run not found: {shown(run_id)}")
    steps = queries.list_step_runs(conn, run_id)
    evts = queries.list_events(conn, run_id, limit=100_000)
    payload = {"workflowRun": public_workflow_run(run_row), "steps": [public_step_run(s) for s in steps],
               "events": [public_event(e) for e in evts]}
    lines = [f"{run_id}  {run_row['status']}  {run_row['workflowName']}", *_run_error(run_row), *_step_lines(steps),
             f"  events={len(evts)}"]
    app.emit(payload, "\n".join(lines))


@workflows.command("cancel")
@click.argument("run_id")
@click.option("--reason", default="cancelled by user", show_default=True, help="Recorded on the run and steps.")
@json_flag
def cancel(run_id: str, reason: str) -> None:
    """Cancel a running workflow run from any host; its running step is killed within a second."""
    app = get_app()
    bounded_flag("--reason", reason, limits.MAX_REASON_LENGTH)
    state = _store(app).cancel(run_id, timeutil.now(), reason)
    app.emit(public_workflow_run(state.run), f"{run_id} {state.run['status']}")


@workflows.command("recover")
@click.argument("run_id")
@click.option("--reason", default="manual recovery", show_default=True, help="Recorded on the reset steps.")
@json_flag
def recover(run_id: str, reason: str) -> None:
    """Reset the running steps of a run whose process died, so a re-execution resumes it."""
    bounded_flag("--reason", reason, limits.MAX_REASON_LENGTH)
    app = get_app()
    store = _store(app)
    state = store.require(run_id)
    state, recovered = store.recover(run_id, timeutil.now(), reason, step_alive(app.client(), app.keys, state.run))
    app.emit({"workflowRun": public_workflow_run(state.run), "recoveredSteps": recovered},
             f"{run_id} recovered={len(recovered)}")
