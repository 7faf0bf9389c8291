"""Authentication: one API token (``LOOPSQ_API_TOKEN``), checked in constant time before any route runs.

- The API (``/api/...``) and the MCP endpoint (``/mcp``) take ``Authorization: Bearer <token>`` only.
- Dashboard pages, ``/metrics`` and the queue view under ``/rq`` take the bearer header too, or the session
  cookie that ``POST /login`` sets after checking the token: HttpOnly, SameSite=Strict, Secure over https. It
  never carries the token; it expires after the session lifetime and logout revokes it in Redis
  (``loopsq/web/sessions.py``). The API does not accept the cookie, so a page can never be made to write
  through it.
- Public, without a token: ``/api/health`` (a liveness probe: Redis reachable, mirror lag; no names, no
  URLs), ``/api/openapi.json`` (the API's description), the login form and the dashboard's one script
  (``/static/live.js``, the same for everyone).
- The OAuth discovery paths (``/.well-known/oauth-protected-resource``, ``.../oauth-authorization-server``,
  ``.../openid-configuration``, and any path under them, such as ``/.well-known/oauth-protected-resource/mcp``)
  reach the app, which has no such route: 404. loopsq takes a static token, not OAuth, and an MCP client that
  gets 401 there would start an OAuth flow instead of reporting the missing token.

A request that fails is answered here, so nothing behind it runs: 401 with the one error body, or for a
browser asking for a page, a redirect to the login form.
"""

from __future__ import annotations

import hmac
from urllib.parse import quote

import redis
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from loopsq.web.errors import AUTHENTICATED, error_body
from loopsq.web.sessions import Sessions

COOKIE_NAME = "loopsq_session"
PUBLIC_PATHS = frozenset({"/api/health", "/api/openapi.json", "/login", "/logout", "/static/live.js"})
#: OAuth discovery documents (RFC 9728, RFC 8414, OpenID): answered 404 by the app, without a token.
DISCOVERY = ("/.well-known/oauth-protected-resource", "/.well-known/oauth-authorization-server",
             "/.well-known/openid-configuration")
#: Paths that take the bearer token only, never the session cookie (so a page cannot be made to write).
BEARER_ONLY = ("/api/", "/mcp")
#: Shortest token ``loopsq web`` accepts.
MIN_TOKEN_LENGTH = 16

MISSING = "missing API token: send the header 'Authorization: Bearer <LOOPSQ_API_TOKEN>'"
MALFORMED = "malformed Authorization header: expected 'Bearer <token>'"
WRONG = "invalid API token"


def same(presented: str, expected: str) -> bool:
    """Constant-time equality of two strings (``hmac.compare_digest`` on their UTF-8 bytes)."""
    return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"),
                               expected.encode("utf-8", "surrogateescape"))


EXPIRED = "session expired or logged out: log in again"
UNAVAILABLE = "redis is unreachable: sessions cannot be checked"


async def check(headers: Headers, path: str, token: str, sessions: Sessions | None = None) -> str | None:
    """Why the request is not authenticated, or None when it is (``UNAVAILABLE`` when Redis cannot say)."""
    header = headers.get("authorization")
    if header is not None:
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return MALFORMED
        return None if same(presented.strip(), token) else WRONG
    if not path.startswith(BEARER_ONLY):
        cookie = cookie_parser(headers.get("cookie", "")).get(COOKIE_NAME)
        if cookie is not None:
            if sessions is None:
                return WRONG
            try:
                return None if await run_in_threadpool(sessions.check, cookie) else EXPIRED
            except redis.RedisError:
                return UNAVAILABLE
    return MISSING


def is_discovery(path: str) -> bool:
    """Whether ``path`` is an OAuth discovery document's path, or one under it."""
    return any(path == prefix or path.startswith(prefix + "/") for prefix in DISCOVERY)


def safe_next(value: str | None) -> str:
    """A post-login redirect target: a local absolute path, else the dashboard's home."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    return value


class TokenAuth:
    """ASGI middleware that lets a request through only with the token (or the session cookie where allowed)."""

    def __init__(self, app: ASGIApp, token: str, sessions: Sessions | None = None) -> None:
        self.app = app
        self.token = token
        self.sessions = sessions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        path = str(scope["path"])
        if path in PUBLIC_PATHS or is_discovery(path):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        problem = await check(headers, path, self.token, self.sessions)
        if problem is None:
            scope[AUTHENTICATED] = True
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
            return
        response: Response
        is_page = not path.startswith((*BEARER_ONLY, "/metrics")) and path != "/api"
        if problem == UNAVAILABLE:
            response = JSONResponse(error_body(503, problem), status_code=503)
        elif (is_page and scope.get("method") in ("GET", "HEAD") and "text/html" in headers.get("accept", "")
                and "authorization" not in headers):
            query = scope.get("query_string", b"").decode("latin-1")
            target = path + (f"?{query}" if query else "")
            response = RedirectResponse(f"/login?next={quote(target, safe='/')}", status_code=303)
        else:
            response = JSONResponse(error_body(401, problem), status_code=401,
                                     headers={"WWW-Authenticate": 'Bearer realm="loopsq"'})
        await response(scope, receive, send)
