"""The dashboard: server-rendered pages (loops, a run, workflow runs with their DAG) and the login form.

Pages read the caught-up mirror like the API, refresh themselves with a meta refresh while something can still
change, and are sent with a strict Content-Security-Policy (no scripts; inline styles only). Every value is
escaped by the templates' autoescaping. Run output is redacted as in the CLI and the API unless the viewer asks
for it (``?showOutput=true``, the page's "Show output" link).
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from loopsq.domain.durations import format_duration
from loopsq.domain.redaction import public_event, public_run
from loopsq.domain.text import shown
from loopsq.errors import NotFoundError, ValidationError
from loopsq.mirror import queries
from loopsq.state.workflow_run_state import TERMINAL_RUN
from loopsq.web import auth, csrf, dag
from loopsq.web.context import WebContext
from loopsq.web.deps import Ctx, ShowOutput
from loopsq.web.templating import templates

router = APIRouter(include_in_schema=False)

STRIP_RUNS = 20
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
#: The most form data ``POST /login`` reads.
MAX_FORM_BYTES = 4096


def render(request: Request, ctx: WebContext | None, name: str, context: dict[str, Any], *,
           status: int = 200, refresh: bool = False) -> HTMLResponse:
    """A page with the security headers; ``refresh`` adds the auto-refresh."""
    refresh_s = ctx.settings.refresh_s if (ctx is not None and refresh) else None
    extra = {"refresh_s": refresh_s, "csrf_token": csrf.token_for(request) if ctx is not None else ""}
    return templates.TemplateResponse(request, name, {**context, **extra}, status_code=status,
                                      headers=PAGE_HEADERS)


def describe_schedule(schedule: dict[str, Any], timezone: str | None = None) -> str:
    """A schedule in a few words: ``every 5m``, ``cron 0 * * * * (UTC)``, ``once at …``, ``dynamic``."""
    kind = schedule.get("type")
    if kind == "interval" and isinstance(schedule.get("everyMs"), int):
        anchor = " after each run" if schedule.get("anchor") == "fixed_delay" else ""
        return f"every {format_duration(schedule['everyMs'])}{anchor}"
    if kind == "cron":
        return f"cron {schedule.get('expression')}" + (f" ({timezone})" if timezone else "")
    if kind == "once":
        return f"once at {schedule.get('at')}"
    return str(kind or "?")


# -- login -------------------------------------------------------------------------------------------------
@router.get("/login")
def login_form(request: Request, next_page: Annotated[str, Query(alias="next")] = "/") -> HTMLResponse:
    """The login form: the API token, exchanged for a session cookie."""
    return render(request, None, "login.html", {"next": auth.safe_next(next_page), "failed": False})


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the token (constant time); on success set the session cookie and go to ``next``."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_FORM_BYTES:
            raise ValidationError(f"login form is larger than {MAX_FORM_BYTES} bytes")
    body = raw.decode("utf-8", "replace")
    form = parse_qs(body, keep_blank_values=True)
    token = (form.get("token") or [""])[0].strip()
    target = auth.safe_next((form.get("next") or ["/"])[0])
    ctx: WebContext = request.app.state.ctx
    if not token or not auth.same(token, ctx.settings.token):
        return render(request, None, "login.html", {"next": target, "failed": True}, status=401)
    cookie = await run_in_threadpool(ctx.sessions.issue)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(auth.COOKIE_NAME, cookie, max_age=ctx.settings.session_ttl_s,
                        path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    """Close the session in Redis (so its cookie opens nothing anywhere any more) and forget the cookie."""
    cookie = request.cookies.get(auth.COOKIE_NAME)
    if cookie:
        request.app.state.ctx.sessions.revoke(cookie)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(auth.COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return response


# -- pages -------------------------------------------------------------------------------------------------
@router.get("/runs/{run_id}")
def run_page(request: Request, ctx: Ctx, run_id: str, show_output: ShowOutput = False) -> HTMLResponse:
    """One loop run; its output redacted as the CLI and the API do, unless ``?showOutput=true`` (then escaped)."""
    with ctx.mirror() as conn:
        run = queries.get_run(conn, run_id)
    if run is None:
        raise NotFoundError(f"run not found: {shown(run_id)}")
    return render(request, ctx, "run.html", {"run": public_run(run, show_output), "show_output": show_output},
                  refresh=run.get("status") == "running")


@router.get("/workflow-runs")
def workflow_runs_page(request: Request, ctx: Ctx) -> HTMLResponse:
    """The newest workflow runs."""
    with ctx.mirror() as conn:
        runs = queries.list_workflow_runs(conn, limit=100)
    return render(request, ctx, "workflow_runs.html", {"runs": runs}, refresh=True)


@router.get("/workflow-runs/{run_id}")
def workflow_run_page(request: Request, ctx: Ctx, run_id: str) -> HTMLResponse:
    """A workflow run: its DAG (steps coloured by status) and its event timeline."""
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
    return render(request, ctx, "workflow_run.html",
                  {"run": run, "steps": steps, "events": events, "graph": graph, "dag": dag},
                  refresh=run.get("status") not in TERMINAL_RUN)
