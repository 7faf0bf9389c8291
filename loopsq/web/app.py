"""The web application: the JSON API, the dashboard, ``/metrics`` and rq-dashboard under ``/rq``, behind the
token check, with one error body and an OpenAPI document at ``/api/openapi.json``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import redis
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi
from starlette.types import ASGIApp

from loopsq import __version__
from loopsq.domain.namespaces import DEFAULT_NAMESPACE
from loopsq.mcp.context import McpContext
from loopsq.mcp.http import PATH as MCP_PATH
from loopsq.mcp.http import HttpTransport
from loopsq.mcp.server import allowed_tools_from_env
from loopsq.state.connection import mask_url
from loopsq.web import (
    actions,
    api,
    api_apply,
    api_notify,
    api_pools,
    api_workflows,
    dashboard,
    errors,
    live,
    metrics,
    openapi,
    pages_fleet,
    pages_loops,
    pages_runs,
    rq_guard,
    rq_view,
)
from loopsq.web.auth import TokenAuth
from loopsq.web.body_limit import BodyLimit
from loopsq.web.context import WebContext, WebSettings
from loopsq.web.head import HeadAsGet

OPENAPI_PATH = "/api/openapi.json"
DESCRIPTION = """\
Loops, runs, workflow specs, workflow runs and fleet-wide pools of one loopsq deployment.

Every request carries `Authorization: Bearer <LOOPSQ_API_TOKEN>`, except `GET /api/health` and this document.
Every error is `{"error": {"status", "code", "message"}}`: 400 bad input (the message names the field),
401 missing or wrong token, 404 not found, 405 method not allowed, 409 conflict, 503 Redis unreachable,
500 anything else. A refused request changes nothing.
"""


#: rq-dashboard's connections, by the (masked) URL it is configured with (see ``rq_dashboard_app``).
_DASHBOARD_CLIENTS: dict[str, redis.Redis] = {}


def _dashboard_connect(url: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    client = _DASHBOARD_CLIENTS.get(url)
    if client is not None:
        return None, client
    connected: tuple[Any, Any] = _DASHBOARD_FROM_URL[0](url, *args, **kwargs)
    return connected


_DASHBOARD_FROM_URL: list[Any] = []


def rq_dashboard_app(redis_url: str, raw: redis.Redis, api_token: str, queue: str = DEFAULT_NAMESPACE) -> ASGIApp:
    """rq-dashboard (a Flask blueprint) on ``raw`` (the web app's bytes client), as an ASGI app through a2wsgi.

    rq-dashboard connects from its configured URL on every request, with a parser of its own that knows none of
    loopsq's URL options (Sentinel credentials, ``LOOPSQ_REDIS_SSL_CERT_REQS``) and shows the URL on its pages
    with a ``password=`` query in clear. So it is configured with the masked URL, and its connect function answers
    that URL with loopsq's own client. Deleting jobs is disabled: loopsq's timers and runs own their jobs.
    Deleting jobs is disabled: loopsq's timers and runs own their jobs. Its routes that change state (requeue,
    requeue all, empty, compact) answer GET and HEAD with 405 (``refuse_state_changes_by_get``): a link, an image
    or a prefetch cannot trigger them. ``/rq/`` opens on ``queue`` (the namespace's base queue).
    """
    import flask
    import rq_dashboard  # type: ignore[import-untyped]  # rq-dashboard ships no type information
    import rq_dashboard.web  # type: ignore[import-untyped]
    from a2wsgi import WSGIMiddleware
    from rq_dashboard.web import setup_rq_connection

    if not _DASHBOARD_FROM_URL:
        _DASHBOARD_FROM_URL.append(rq_dashboard.web.from_url)
        rq_dashboard.web.from_url = _dashboard_connect
    shown = mask_url(redis_url)
    _DASHBOARD_CLIENTS[shown] = raw
    # rq-dashboard's templates link their assets through the app's own "static" endpoint.
    static = Path(rq_dashboard.__file__).parent / "static"
    flask_app = flask.Flask("loopsq.rq_dashboard", static_folder=str(static), static_url_path="/static")
    flask_app.config.update(RQ_DASHBOARD_REDIS_URL=shown, RQ_DASHBOARD_DISABLE_DELETE=True)
    flask_app.register_blueprint(rq_dashboard.blueprint)
    flask_app.before_request(refuse_state_changes_by_get)
    flask_app.before_request(rq_view.open_on_queue(queue))
    flask_app.after_request(rq_view.link_back)
    rq_guard.install(flask_app, api_token, rq_dashboard.web.NoSuchJobError)
    # A POST-only route's GET is refused by Flask's routing, before any hook: answer it the same way.
    flask_app.register_error_handler(405, lambda exc: _rq_405(sorted(getattr(exc, "valid_methods", None) or [])))
    setup_rq_connection(flask_app)
    # a2wsgi types WSGI apps and ASGI scopes more narrowly than Flask and Starlette do; the protocols match.
    return WSGIMiddleware(flask_app)  # type: ignore[arg-type,return-value]


def refuse_state_changes_by_get() -> Any:
    """rq-dashboard's ``before_request`` hook: a GET or HEAD of a route that also takes POST (the routes that
    change state, such as "requeue all") gets 405 and the one error body, before the view runs."""
    import flask

    rule = flask.request.url_rule
    if flask.request.method in ("GET", "HEAD") and rule is not None and "POST" in (rule.methods or ()):
        return _rq_405(sorted(set(rule.methods or ()) - {"GET", "HEAD"}))
    return None


def _rq_405(allowed: list[str]) -> Any:
    """rq-dashboard's 405 in loopsq's error body (its own is an HTML page)."""
    import flask

    path = flask.request.script_root + flask.request.path
    message = f"method {flask.request.method} is not allowed on {path}: it changes state; use POST"
    response = flask.jsonify(errors.error_body(405, message))
    response.status_code = 405
    response.headers["Allow"] = ", ".join(allowed)
    return response


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document with the bearer scheme declared, and without the 422 responses FastAPI adds by
    default (request validation errors are 400 with the one error body here)."""
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = doc.setdefault("components", {})
    components.setdefault("securitySchemes", {})["bearerAuth"] = {
        "type": "http", "scheme": "bearer", "description": "The value of LOOPSQ_API_TOKEN."}
    doc["security"] = [{"bearerAuth": []}]
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    for name in ("HTTPValidationError", "ValidationError"):
        components.get("schemas", {}).pop(name, None)
    openapi.refine(doc)
    return doc


class LoopsqAPI(FastAPI):
    """FastAPI with loopsq's OpenAPI document (see ``openapi_document``)."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            self.openapi_schema = openapi_document(self)
        return self.openapi_schema


def create_app(settings: WebSettings, *, client: redis.Redis | None = None) -> FastAPI:
    """Build the app for ``settings`` (``client``: an existing Redis client to use instead of connecting)."""
    ctx = WebContext(settings, client)
    # The MCP server's streamable-HTTP transport, behind the same token as the API (auth.check).
    mcp = HttpTransport(McpContext(settings.redis_url, settings.data_dir, settings.keys, client=ctx.client,
                                   allowed_tools=allowed_tools_from_env()))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        ctx.start()
        try:
            async with mcp.run():
                yield
        finally:
            await run_in_threadpool(ctx.stop)

    app = LoopsqAPI(title="loopsq", version=__version__, description=DESCRIPTION, openapi_url=OPENAPI_PATH,
                  docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.ctx = ctx
    app.state.metrics_registry = metrics.registry_for(ctx, per_loop=settings.metrics_per_loop)
    errors.install(app, settings.redis_url)
    for router in (api.router, api_apply.router, api_workflows.router, api_pools.router, api_notify.router,
                   metrics.router, dashboard.router, pages_loops.router, pages_runs.router, pages_fleet.router,
                   live.router, actions.router):
        app.include_router(router)
    # Starlette routes an endpoint that is not a function as an ASGI app; its type hint names functions only.
    app.add_route(MCP_PATH, mcp, include_in_schema=False)  # type: ignore[arg-type]
    if settings.rq_dashboard:
        app.mount("/rq", rq_dashboard_app(settings.redis_url, ctx.raw(), settings.token,
                                               settings.keys.base_queue))
    app.add_middleware(HeadAsGet)  # innermost: a HEAD is checked and bounded as any request, then run as GET
    app.add_middleware(BodyLimit)  # inside the token check: an unauthenticated body is never read
    app.add_middleware(TokenAuth, token=settings.token, sessions=ctx.sessions)
    return app
