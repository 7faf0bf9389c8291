"""The dashboard: server-rendered pages (loops, a run, workflow runs with their DAG) and the login form.

Pages read the caught-up mirror like the API, refresh themselves with a meta refresh while something can still
change, and are sent with a strict Content-Security-Policy (no scripts; inline styles only). Every value is
escaped by the templates' autoescaping. Run output is shown (it was scrubbed of secrets before it was stored, and
its control characters show escaped) unless the viewer hides it (``?showOutput=false``, the page's "Hide output"
link), which redacts it as the CLI and the API do by default.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from loopsq.domain.durations import format_duration
from loopsq.errors import ValidationError
from loopsq.mirror import queries
from loopsq.ops.up import API_TOKEN_FILENAME
from loopsq.web import auth, csrf
from loopsq.web.context import WebContext
from loopsq.web.deps import Ctx
from loopsq.web.templating import templates

router = APIRouter(include_in_schema=False)

STRIP_RUNS = 20
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; "
                               "connect-src 'self'; img-src 'self' data:; "
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
    # A page rendered without a context (the login form) is shown to someone not logged in: no "Log out".
    extra = {"refresh_s": refresh_s, "csrf_token": csrf.token_for(request) if ctx is not None else "",
             "logged_in": ctx is not None, "token_file": API_TOKEN_FILENAME}
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


def next_run_of(loop: dict[str, Any]) -> str | None:
    """The next run to show: none for a loop that is not active (a paused, stopped, expired or archived loop keeps
    a ``nextRunAt`` from before, in the past by now, which it does not run at)."""
    if loop.get("status") != "active" or loop.get("archivedAt"):
        return None
    value = loop.get("nextRunAt")
    return str(value) if value else None


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
@router.get("/workflow-runs")
def workflow_runs_page(request: Request, ctx: Ctx) -> HTMLResponse:
    """The newest workflow runs."""
    with ctx.mirror() as conn:
        runs = queries.list_workflow_runs(conn, limit=100)
    return render(request, ctx, "workflow_runs.html", {"runs": runs}, refresh=True)
