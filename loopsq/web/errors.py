"""The HTTP boundary's one error body and one status table, for loopsq's errors and the framework's alike.

Every failure of the API is ``{"error": {"status": <int>, "code": "<code>", "message": "<one line>"}}`` with the
status of ``STATUS_CODES``: 400 bad input (the message names the field and quotes the value), 401 no or wrong
token, 404 not found (a missing entity or an unknown route), 405 method not allowed (``Allow`` lists every
method of the path), 409 conflict, 413 a request body over ``limits.MAX_BODY_BYTES``, 503 Redis unreachable,
500 anything else. Dashboard pages get the same status and message as an HTML page.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount

from loopsq.domain.text import quoted, shown
from loopsq.errors import ConflictError, LoopsqError, NotFoundError, RedisUnavailableError, ValidationError
from loopsq.state.connection import unavailable
from loopsq.state.outages import is_transient

log = logging.getLogger(__name__)

#: status -> error code: the API's one status table.
STATUS_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    500: "internal_error",
    503: "redis_unavailable",
}

_BY_CLASS: tuple[tuple[type[LoopsqError], int], ...] = (
    (ValidationError, 400),
    (NotFoundError, 404),
    (ConflictError, 409),
    (RedisUnavailableError, 503),
)


def error_body(status: int, message: str) -> dict[str, Any]:
    """The one error body: ``{"error": {"status", "code", "message"}}``."""
    return {"error": {"status": status, "code": STATUS_CODES.get(status, STATUS_CODES[500]), "message": message}}


def status_of(exc: LoopsqError) -> int:
    """The HTTP status of a loopsq error (500 for the base class and any other subclass)."""
    for cls, status in _BY_CLASS:
        if isinstance(exc, cls):
            return status
    return 500


def wants_html(request: Request) -> bool:
    """Whether to answer with an HTML page: a browser asking for a page outside ``/api`` and ``/metrics``."""
    path = request.url.path
    if path.startswith(("/api/", "/metrics")) or path == "/api":
        return False
    return "text/html" in request.headers.get("accept", "")


#: The ASGI scope key the auth middleware (``auth.TokenAuth``) sets on a request it authenticated.
AUTHENTICATED = "loopsq.authenticated"


def error_response(request: Request, status: int, message: str,
                   headers: Mapping[str, str] | None = None) -> Response:
    """The error as JSON, or as the dashboard's error page for a browser."""
    if wants_html(request):
        from loopsq.web.templating import templates

        # Only a request the auth middleware let through (not one on a public path, as /login) is logged in.
        logged_in = bool(request.scope.get(AUTHENTICATED))
        return templates.TemplateResponse(request, "error.html", {"error": error_body(status, message)["error"],
                                                                  "logged_in": logged_in},
                                          status_code=status, headers=dict(headers or {}))
    return JSONResponse(error_body(status, message), status_code=status, headers=dict(headers or {}))


def _show(value: Any) -> str:
    return quoted(value)


#: The methods a 405's ``Allow`` header may list.
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> str:
    """The ``Allow`` header of a 405: every method some route of the app takes on this path (Starlette's own
    header names only the first route that matched the path), HEAD wherever GET. Mounted apps answer their own
    405s."""
    routes = [route for route in request.app.router.routes if not isinstance(route, Mount)]
    takes = {method for method in METHODS
             if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)}
    if "GET" in takes:
        takes.add("HEAD")  # every GET route answers HEAD too (``head.HeadAsGet``)
    return ", ".join(method for method in METHODS if method in takes)


def validation_message(errors: Sequence[Any]) -> str:
    """One line for the first of FastAPI's request validation errors, naming the field and quoting the value."""
    if not errors:
        return "invalid request"
    err = errors[0] if isinstance(errors[0], Mapping) else {}
    loc = [str(part) for part in err.get("loc", ())]
    kind = str(err.get("type", ""))
    ctx = err.get("ctx") or {}
    value = err.get("input")
    where, field = (loc[0], ".".join(loc[1:])) if loc else ("", "")
    if where == "body" and not field:
        if kind == "json_invalid":
            return f"request body is not valid JSON: {ctx.get('error', 'parse error')}"
        if kind == "missing":
            return "request body is required (a JSON object)"
        return f"request body must be a JSON object, got {_show(value)}"
    if kind == "json_invalid":
        return f"request body is not valid JSON: {ctx.get('error', 'parse error')}"
    name = field or where or "request"
    if kind == "missing":
        return f"{name} is required"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"{name} must be an integer, got {_show(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"{name} must be true or false, got {_show(value)}"
    if kind == "greater_than_equal":
        return f"{name} must be >= {ctx.get('ge')}, got {_show(value)}"
    if kind == "less_than_equal":
        return f"{name} must be <= {ctx.get('le')}, got {_show(value)}"
    if kind in ("literal_error", "enum"):
        return f"{name} must be one of {ctx.get('expected')}, got {_show(value)}"
    if kind == "string_too_short":
        return f"{name} must be at least {ctx.get('min_length')} character(s), got {_show(value)}"
    if kind == "string_too_long":
        return f"{name} must be at most {ctx.get('max_length')} characters, got {_show(value)}"
    if kind == "string_type":
        return f"{name} must be a string, got {_show(value)}"
    if kind == "extra_forbidden":
        return f"{name} is not a known field"
    return f"{name}: {err.get('msg', 'invalid')}, got {_show(value)}"


def install(app: FastAPI, redis_url: str) -> None:
    """Register the handlers that turn every error into the one body and the status table."""

    async def on_loopsq(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LoopsqError)
        status = status_of(exc)
        if status == 500:
            log.error("%s %s failed: %s", request.method, request.url.path, exc.message)
        return error_response(request, status, exc.message)

    async def on_redis(request: Request, exc: Exception) -> Response:
        if is_transient(exc):  # unreachable, restarting (LOADING), failing over (READONLY)
            return error_response(request, 503, unavailable(redis_url, exc).message)
        log.error("%s %s: redis error", request.method, request.url.path, exc_info=exc)
        return error_response(request, 500, f"redis error: {unavailable(redis_url, exc).message}")

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(request, 400, validation_message(exc.errors()))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        if status == 404:
            message = f"no such endpoint: {shown(request.method)} {shown(request.url.path)}"
        elif status == 405:
            message = f"method {shown(request.method)} is not allowed on {shown(request.url.path)}"
            allow = allowed_methods(request)
            headers = {**(exc.headers or {}), **({"Allow": allow} if allow else {})}
            return error_response(request, status, message, headers)
        else:
            message = str(exc.detail)
            status = status if status in STATUS_CODES else (400 if 400 <= status < 500 else 500)
        return error_response(request, status, message, exc.headers)

    async def on_any(request: Request, exc: Exception) -> Response:
        # Starlette re-raises the exception after this response is sent, so the server logs its traceback.
        return error_response(request, 500, f"internal error: {type(exc).__name__}")

    app.add_exception_handler(LoopsqError, on_loopsq)
    app.add_exception_handler(redis.RedisError, on_redis)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_any)
