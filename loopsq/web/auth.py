"""Authentication: one API token (``LOOPSQ_API_TOKEN``), checked in constant time before any route runs.

- The API (``/api/...``) and the MCP endpoint (``/mcp``) take ``Authorization: Bearer <token>`` only.
- Dashboard pages, ``/metrics`` and the queue view under ``/rq`` take the bearer header too, or the session
  cookie that ``POST /login`` sets after checking the token: HttpOnly, SameSite=Strict, Secure over https. Its
  value is an HMAC of the token, not the token itself. The API does not accept the cookie, so a page can never
  be made to write through it.
- Public, without a token: ``/api/health`` (a liveness probe: Redis reachable, mirror lag; no names, no
  URLs), ``/api/openapi.json`` (the API's description) and the login form.

A request that fails is answered here, so nothing behind it runs: 401 with the one error body, or for a
browser asking for a page, a redirect to the login form.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote

from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from loopsq.web.errors import error_body

COOKIE_NAME = "loopsq_session"
SESSION_MAX_AGE_S = 12 * 3600
PUBLIC_PATHS = frozenset({"/api/health", "/api/openapi.json", "/login", "/logout"})
#: Paths that take the bearer token only, never the session cookie (so a page cannot be made to write).
BEARER_ONLY = ("/api/", "/mcp")
#: Shortest token ``loopsq web`` accepts.
MIN_TOKEN_LENGTH = 16

MISSING = "missing API token: send the header 'Authorization: Bearer <LOOPSQ_API_TOKEN>'"
MALFORMED = "malformed Authorization header: expected 'Bearer <token>'"
WRONG = "invalid API token"


def session_value(token: str) -> str:
    """The session cookie's value for ``token``: an HMAC, so the cookie never carries the token itself."""
    return hmac.new(token.encode(), b"loopsq dashboard session v1", hashlib.sha256).hexdigest()


def same(presented: str, expected: str) -> bool:
    """Constant-time equality of two strings (``hmac.compare_digest`` on their UTF-8 bytes)."""
    return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"),
                               expected.encode("utf-8", "surrogateescape"))


def check(headers: Headers, path: str, token: str) -> str | None:
    """Why the request is not authenticated, or None when it is."""
    header = headers.get("authorization")
    if header is not None:
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return MALFORMED
        return None if same(presented.strip(), token) else WRONG
    if not path.startswith(BEARER_ONLY):
        cookie = cookie_parser(headers.get("cookie", "")).get(COOKIE_NAME)
        if cookie is not None:
            return None if same(cookie, session_value(token)) else WRONG
    return MISSING


def safe_next(value: str | None) -> str:
    """A post-login redirect target: a local absolute path, else the dashboard's home."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


class TokenAuth:
    """ASGI middleware that lets a request through only with the token (or the session cookie where allowed)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        path = str(scope["path"])
        if path in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        problem = check(headers, path, self.token)
        if problem is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        response: Response
        is_page = not path.startswith((*BEARER_ONLY, "/metrics")) and path != "/api"
        if (is_page and scope.get("method") in ("GET", "HEAD") and "text/html" in headers.get("accept", "")
                and "authorization" not in headers):
            query = scope.get("query_string", b"").decode("latin-1")
            target = path + (f"?{query}" if query else "")
            response = RedirectResponse(f"/login?next={quote(target, safe='/')}", status_code=303)
        else:
            response = JSONResponse(error_body(401, problem), status_code=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="loopsq"'})
        await response(scope, receive, send)
