"""Commands that run things or read run history: run-now, tick, runs, trigger."""

from __future__ import annotations

import time
from typing import Any

import click

from loopsq.cli.app import App, echo_err, get_app, json_flag
from loopsq.cli.feature_flags import tag_filter_option, tags_flag
from loopsq.cli.options import bounded_flag, limit_flag, quote
from loopsq.cli.run_lines import feature_lines, missed_head, usage_total
from loopsq.domain import limits, timeutil
from loopsq.domain.checks import check_visible
from loopsq.domain.control import OUTCOMES
from loopsq.domain.lifecycle import ensure_not_archived
from loopsq.domain.redaction import public_run
from loopsq.domain.run_rules import (
    MISSED,
    RETRYABLE,
    RUN_STATUSES,
    TERMINAL,
    LoopRun,
    attempt_label,
    is_nothing_to_do,
)
from loopsq.domain.text import shown
from loopsq.domain.timeutil import gen_id
from loopsq.engine.routing import enqueue_for_loop
from loopsq.errors import LoopsqError, NotFoundError, ValidationError
from loopsq.mirror import queries
from loopsq.system.tracing import env_carrier

SHOW_OUTPUT_LIMIT = 32 * 1024


def _runtime(app: App, role: str) -> Any:
    from loopsq.engine.runtime import Runtime

    return Runtime(client=app.client(), keys=app.keys, role=role).start()


def _print_output(run: dict[str, Any]) -> str:
    lines: list[str] = []
    for stream in ("stdout", "stderr"):
        text = run.get(stream) or ""
        if len(text) > SHOW_OUTPUT_LIMIT:
            text = f"[truncated {len(text) - SHOW_OUTPUT_LIMIT} chars]\n" + text[-SHOW_OUTPUT_LIMIT:]
        lines.append(f"{stream}:")
        lines.append(text.rstrip("\n"))
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.split("\n"))


@click.command("run-now")
@click.argument("id_or_name")
@click.option("--local", is_flag=True, help="Run in this process instead of on a worker.")
@click.option("--show-output", is_flag=True, help="Print the run's stdout and stderr.")
@click.option("--wait", "wait_s", default=30.0, show_default=True, metavar="SECONDS",
              help="How long to wait for a worker to pick the run up.")
@click.option("--no-retry", is_flag=True, help="Do not retry this run if it fails (the loop's --attempts otherwise).")
@json_flag
def run_now(id_or_name: str, local: bool, show_output: bool, wait_s: float, no_retry: bool) -> None:
    """Run a loop now: its due retry, its due slot, or an ad-hoc slot. Exit 1 unless it succeeds (a failed run is
    retried later as the loop's retry policy says, unless --no-retry)."""
    app = get_app()
    loop = app.loops().require(id_or_name)
    ensure_not_archived(loop, id_or_name)
    if local:
        from loopsq.engine.runner import run_now as execute_now

        rt = _runtime(app, "manual")
        try:
            final = execute_now(rt, loop.id, retry=not no_retry, trace=env_carrier())
        finally:
            rt.stop()
    else:
        final = _run_on_worker(app, loop.id, wait_s, retry=not no_retry)
    source = final.source or "ad_hoc"
    advances = source in ("due_slot", "retry_slot")
    payload = {**public_run(final.to_dict(), show_output), "runNow": {"source": source, "advancesLoop": advances}}
    line = f"{final.id} {final.status} source={source} slot={final.scheduled_for}"
    app.emit(payload, (line + "\n" + _print_output(final.to_dict())) if show_output else line)
    if final.status != "succeeded" and not is_nothing_to_do(final):  # (exit 75: a normal outcome)
        if final.error and not app.json:
            echo_err(f"error: run {final.id} {final.status}: {final.error}")
        raise click.exceptions.Exit(1)


def _run_on_worker(app: App, loop_id: str, wait_s: float, *, retry: bool = True) -> LoopRun:
    from loopsq.state.runs import RunStore

    client = app.client()
    request_id = gen_id()
    # Positional: RQ's enqueue keeps a keyword named ``retry`` for itself.
    # A traced caller's context (TRACEPARENT) rides in the job's meta, which a worker without tracing ignores.
    trace = env_carrier()
    enqueue_for_loop(client, app.keys, loop_id, "worker.jobs.run_now", loop_id, request_id,
                     *(() if retry else (False,)), **({"meta": trace} if trace else {}))
    deadline = time.monotonic() + wait_s
    run_id = None
    while run_id is None:
        value = client.get(app.keys.run_request(request_id))
        run_id = value.decode() if isinstance(value, bytes) else value
        if run_id is not None and run_id.startswith("!"):
            raise LoopsqError(run_id[1:])
        if run_id is None:
            if time.monotonic() > deadline:
                raise LoopsqError(_not_picked_up(app, loop_id, wait_s))
            time.sleep(0.05)
    store = RunStore(client, app.keys)
    while True:
        run = store.get(str(run_id))
        if run is not None and run.status in TERMINAL:
            value = client.get(app.keys.run_request(request_id))
            latest = value.decode() if isinstance(value, bytes) else value
            if latest and latest != run.id:
                run_id = latest
                continue
            return run
        time.sleep(0.05)


def _not_picked_up(app: App, loop_id: str, wait_s: float) -> str:
    """Why a run-now waited in vain: no worker can run the loop's runs (naming the labels), or none took it."""
    from loopsq.engine.routing import waiting_note
    from loopsq.state.loops import LoopStore

    loop = LoopStore(app.client(), app.keys).get(loop_id)
    note = waiting_note(app.client(), app.keys, loop) if loop is not None else None
    if note is not None:
        return f"no worker picked up the run within {wait_s:g}s: {note}; the run waits in its queue (--local runs it here)"
    return f"no worker picked up the run within {wait_s:g}s; is `loopsq worker` running? (--local runs it here)"


@click.command("tick")
@json_flag
def tick() -> None:
    """One scheduler pass here: recover, expire, and run every due loop in this process."""
    from loopsq.domain import run_rules as rules
    from loopsq.engine.maintenance import maintain
    from loopsq.engine.runner import fire

    app = get_app()
    rt = _runtime(app, "manual-tick")
    try:
        report = maintain(rt, timeutil.now(), full=True)
        completed = skipped = 0
        now = timeutil.now()
        for loop in rt.loops.all():
            if rules.due(loop, now):
                result = fire(rt, loop.id)
                completed += result.completed
                skipped += result.skipped
    finally:
        rt.stop()
    counts = {"completed": completed, "skipped": skipped, "recovered": len(report.recovered),
              "expired": report.expired}
    app.emit(counts, f"completed={completed} skipped={skipped} recovered={len(report.recovered)}")


@click.command("runs")
@click.argument("id_or_name", required=False)
@click.option("--limit", default=50, show_default=True, metavar="N",
              help=f"At most N runs (1 to {limits.MAX_PAGE_LIMIT}).")
@click.option("--status", metavar="STATUS", help=f"Only runs with this status ({', '.join(RUN_STATUSES)}).")
@click.option("--outcome", metavar="OUTCOME",
              help=f"Only runs whose control file said this outcome ({', '.join(OUTCOMES)}).")
@click.option("--show-output", is_flag=True, help="Show stdout and stderr (redacted otherwise).")
@tag_filter_option
@json_flag
def runs(id_or_name: str | None, limit: int, status: str | None, outcome: str | None, show_output: bool,
         tags: tuple[str, ...]) -> None:
    """Run history, newest first, from the mirror (runs past Redis's window and of removed loops too); with
    --tag, the runs of loops carrying every tag given."""
    wanted = tags_flag(tags)
    if status is not None and status not in RUN_STATUSES:
        raise ValidationError(f"--status must be one of {', '.join(RUN_STATUSES)}, got {quote(status)}")
    if outcome is not None and outcome not in OUTCOMES:
        raise ValidationError(f"--outcome must be one of {', '.join(OUTCOMES)}, got {quote(outcome)}")
    limit_flag("--limit", limit, limits.MAX_PAGE_LIMIT)
    app = get_app()
    conn = app.mirror()
    owner: dict[str, str] = {}
    if id_or_name is not None:
        found = queries.run_filter(conn, id_or_name)  # a removed loop's runs too, by its id or name
        if found is None:
            raise NotFoundError(f"loop not found: {shown(id_or_name)}")
        owner = found
    rows = queries.list_runs(conn, status=status, limit=limit, outcome=outcome, tags=wanted, **owner)

    def human() -> str:
        lines = []
        for r in rows:
            attempt = attempt_label(r["attempt"], r.get("rerun")) if r.get("rerun") else f"attempt={r['attempt']}"
            if r["status"] == MISSED:  # a streak of slots that did not run: its range and count, not an attempt
                lines.append(missed_head(r))
            else:
                lines.append(f"{r['id']}  {r['status']:<10}  {attempt}  slot={r['scheduledFor']}  {r['loopName']}")
            if r.get("error") and r["status"] in RETRYABLE:
                lines.append(f"  error: {r['error']}")
            lines.extend(feature_lines(r))
            if show_output:
                lines.append(_print_output(r))
            for a in r.get("previousAttempts") or []:
                exit_code = f"  exit={a['exitCode']}" if a.get("exitCode") is not None else ""
                lines.append(f"  {attempt_label(a['attempt'], a.get('rerun'))} {a['status']}{exit_code}  "
                             f"finished={a.get('finishedAt', '-')}"
                             f"  {a.get('error') or ''}".rstrip())
                if show_output:
                    lines.append(_indent(_print_output(a)))
        total = usage_total(rows)
        if total is not None:
            lines.append(total)
        return "\n".join(lines)

    app.emit([public_run(r, show_output) for r in rows], human)


@click.command("trigger")
@click.argument("id_or_name")
@click.option("--key", metavar="KEY", help="Idempotency key: the same key within 24 h returns the same run.")
@click.option("--no-retry", is_flag=True, help="Do not retry this run if it fails (the loop's --attempts otherwise).")
@json_flag
def trigger(id_or_name: str, key: str | None, no_retry: bool) -> None:
    """Start a run of a loop on a worker now; prints its run id."""
    from loopsq.engine.triggers import trigger_with

    if key is not None and not key.strip():
        raise ValidationError(f"--key must not be empty, got {quote(key)}")
    if key is not None:
        check_visible(bounded_flag("--key", key, limits.MAX_IDEMPOTENCY_KEY_LENGTH), "--key", quote)
    app = get_app()
    run_id, created = trigger_with(app.client(), app.keys, id_or_name, key, retry=not no_retry,
                                   trace=env_carrier())
    app.emit({"runId": run_id, "created": created}, f"{run_id} {'created' if created else 'duplicate'}")


@click.command("cancel")
@click.argument("run_id")
@click.option("--reason", metavar="TEXT", help="Recorded on the run: 'cancelled by user: TEXT'.")
@click.option("--wait", "wait_s", default=10.0, show_default=True, metavar="SECONDS",
              help="How long to wait for the worker to record the cancelled run.")
@json_flag
def cancel(run_id: str, reason: str | None, wait_s: float) -> None:
    """Cancel a running loop run from any host: its process group is killed within a second, and it is recorded
    failed with the reason and not retried (a workflow loop's run cancels its workflow run too)."""
    from loopsq.domain import run_rules as rules
    from loopsq.engine.cancel import cancel_run
    from loopsq.state.runs import RunStore

    app = get_app()
    cancel_run(app.client(), app.keys, run_id, app.now(), reason)
    store = RunStore(app.client(), app.keys)
    deadline = time.monotonic() + max(0.0, wait_s)
    run = store.get(run_id)
    while run is not None and run.status == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
        run = store.get(run_id)
    if run is None or run.status == "running":
        app.emit({"runId": run_id, "status": "running", "cancelRequested": True}, f"{run_id} cancel requested")
        return
    if not (run.error or "").startswith(rules.USER_CANCEL_ERROR):
        raise LoopsqError(f"run {run_id} ended {run.status} before the cancel reached it")
    app.emit(public_run(run.to_dict(), False), f"{run_id} {run.status}  {run.error}")
