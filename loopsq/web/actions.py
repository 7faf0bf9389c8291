"""The dashboard's actions: HTML form POSTs, each checked against the session's CSRF token (``web/csrf.py``).

``POST /loops/{idOrName}/pause|resume|stop|run-now|trigger``, ``POST /runs/{id}/cancel`` and
``POST /workflow-runs/{id}/cancel|recover``. Each calls what the CLI and the API call (the loop store's
lifecycle, ``trigger_with``, the ``worker.jobs.run_now`` job, ``cancel_run``, the workflow run store) and answers
303 to the page that shows the result. Without the session's token: 403 and nothing is changed. A refusal of
the action itself (409 a paused loop's pause is a no-op, a stopped run's cancel is a conflict, ...) is the
dashboard's error page with the same status and message as the API.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response

from loopsq.domain.lifecycle import ensure_not_archived
from loopsq.domain.timeutil import gen_id
from loopsq.engine.cancel import cancel_run
from loopsq.engine.recovery import step_alive
from loopsq.engine.routing import enqueue_for_loop
from loopsq.engine.triggers import trigger_with
from loopsq.errors import ConflictError, ValidationError
from loopsq.state.loops import LoopStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.web import csrf
from loopsq.web.context import WebContext
from loopsq.web.errors import error_response

router = APIRouter(include_in_schema=False)

#: The most form data an action reads.
MAX_FORM_BYTES = 4096
#: How long ``run-now`` waits for a worker to take the run before it answers with the loop page.
PICKUP_S = 5.0
#: A run-now request's answer when the worker refused the run (``worker.jobs.REFUSED``).
REFUSED = "!"
LOOP_VERBS = ("pause", "resume", "stop", "run-now", "trigger")


async def _form(request: Request) -> dict[str, str]:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_FORM_BYTES:
            raise ValidationError(f"form is larger than {MAX_FORM_BYTES} bytes")
    return {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True).items()}


async def _checked(request: Request) -> tuple[dict[str, str], Response | None]:
    """The form, and the 403 to answer instead when its CSRF token is not this session's."""
    form = await _form(request)
    problem = csrf.problem(request, form.get(csrf.FIELD) or request.headers.get(csrf.HEADER))
    return form, (error_response(request, 403, problem) if problem else None)


def _see(path: str) -> RedirectResponse:
    return RedirectResponse(path, status_code=303)


def _reason(form: dict[str, str]) -> str | None:
    reason = (form.get("reason") or "").strip()
    if len(reason) > 500:
        raise ValidationError(f"reason must be at most 500 characters, got {len(reason)}")
    return reason or None


def _loop_action(ctx: WebContext, loop: str, verb: str) -> str:
    """Do ``verb`` to the loop; the page to show next."""
    store = LoopStore(ctx.client, ctx.keys)
    if verb in ("pause", "resume", "stop"):
        found = {"pause": store.pause, "resume": store.resume, "stop": store.stop}[verb](loop, ctx.now())
        return f"/loops/{quote(found.id, safe='')}?done={verb}"
    found = store.require(loop)
    ensure_not_archived(found, loop)
    base = f"/loops/{quote(found.id, safe='')}"
    if verb == "trigger":
        run_id, _created = trigger_with(ctx.client, ctx.keys, found.id, None)
        return f"{base}?done=trigger&run={quote(run_id, safe='')}"
    started = _run_now(ctx, found.id)
    return f"/runs/{quote(started, safe='')}" if started else f"{base}?done=run-now-queued"


def _run_now(ctx: WebContext, loop_id: str) -> str | None:
    """Hand a run-now to a worker (as ``loopsq run-now``); the run id once one took it, None if none did yet."""
    request_id = gen_id()
    enqueue_for_loop(ctx.client, ctx.keys, loop_id, "worker.jobs.run_now", loop_id, request_id)
    deadline = time.monotonic() + PICKUP_S
    while time.monotonic() < deadline:
        value: Any = ctx.client.get(ctx.keys.run_request(request_id))
        text = value.decode() if isinstance(value, bytes) else value
        if text:
            if text.startswith(REFUSED):
                raise ConflictError(text[len(REFUSED):])
            return str(text)
        time.sleep(0.05)
    return None


@router.post("/loops/{loop}/{verb}")
async def loop_action(request: Request, loop: str, verb: str) -> Response:
    """pause, resume, stop, run-now or trigger a loop."""
    if verb not in LOOP_VERBS:
        return error_response(request, 404, f"no such action: {verb!r} (one of {', '.join(LOOP_VERBS)})")
    _form_data, refused = await _checked(request)
    if refused is not None:
        return refused
    return _see(await run_in_threadpool(_loop_action, request.app.state.ctx, loop, verb))


@router.post("/runs/{run_id}/cancel")
async def cancel_loop_run(request: Request, run_id: str) -> Response:
    """Cancel a running loop run (as ``loopsq cancel``)."""
    form, refused = await _checked(request)
    if refused is not None:
        return refused
    ctx: WebContext = request.app.state.ctx
    await run_in_threadpool(cancel_run, ctx.client, ctx.keys, run_id, ctx.now(), _reason(form))
    return _see(f"/runs/{quote(run_id, safe='')}")


@router.post("/workflow-runs/{run_id}/{verb}")
async def workflow_run_action(request: Request, run_id: str, verb: str) -> Response:
    """Cancel or recover a workflow run (as ``loopsq workflows cancel|recover``)."""
    if verb not in ("cancel", "recover"):
        return error_response(request, 404, f"no such action: {verb!r} (one of cancel, recover)")
    form, refused = await _checked(request)
    if refused is not None:
        return refused
    ctx: WebContext = request.app.state.ctx
    reason = _reason(form)

    def act() -> None:
        store = WorkflowRunStore(ctx.client, ctx.keys)
        if verb == "cancel":
            store.cancel(run_id, ctx.now(), reason or "cancelled by user")
        else:
            state = store.require(run_id)
            store.recover(run_id, ctx.now(), reason or "manual recovery", step_alive(ctx.client, ctx.keys, state.run))

    await run_in_threadpool(act)
    return _see(f"/workflow-runs/{quote(run_id, safe='')}")
