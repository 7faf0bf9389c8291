"""CSRF tokens of the dashboard's actions, bound to the session.

A page's action forms carry ``csrf``, the HMAC-SHA256 (keyed with the API token) of the session id of the cookie
the page was served with; a request authenticated by ``Authorization: Bearer`` instead binds it to the constant
``bearer`` (a page cannot be made to send that header). An action (``POST /loops/...``, ``/runs/.../cancel``,
``/workflow-runs/.../cancel|recover``) recomputes it from the request's own session and compares in constant
time: a missing or wrong token, or one of another session, is 403 before anything is read or changed. A token
dies with its session (logout, expiry) and with the API token. It is sent as the form field ``csrf`` or the
header ``X-CSRF-Token``.
"""

from __future__ import annotations

import hashlib
import hmac

from fastapi import Request

from loopsq.web import auth

FIELD = "csrf"
HEADER = "X-CSRF-Token"
_PURPOSE = "loopsq dashboard csrf v1"

MISSING = "missing CSRF token: reload the page and submit its form again"
WRONG = "invalid CSRF token: reload the page and submit its form again"


def binding_of(authorization: str | None, cookie: str | None) -> str | None:
    """What a request's token is bound to, from its ``Authorization`` header and session cookie: ``bearer``,
    ``session:<id>``, or None (no credentials)."""
    if authorization is not None:
        return "bearer"
    if not cookie:
        return None
    parts = cookie.split(".")
    return f"session:{parts[1]}" if len(parts) == 4 else None


def binding(request: Request) -> str | None:
    """What the request's token is bound to (``binding_of`` its header and cookie)."""
    return binding_of(request.headers.get("authorization"), request.cookies.get(auth.COOKIE_NAME))


def token_of(secret: str, bound: str) -> str:
    """The CSRF token of binding ``bound`` under the API token ``secret``."""
    return hmac.new(secret.encode("utf-8", "surrogateescape"), f"{_PURPOSE}|{bound}".encode(),
                    hashlib.sha256).hexdigest()


def token_for(request: Request) -> str:
    """The CSRF token for this request's session (empty when it has none: no form then works)."""
    bound = binding(request)
    return "" if bound is None else token_of(request.app.state.ctx.settings.token, bound)


def problem(request: Request, presented: str | None) -> str | None:
    """Why ``presented`` is not this session's token (``MISSING``/``WRONG``), or None when it is."""
    if not presented:
        return MISSING
    expected = token_for(request)
    return None if expected and auth.same(presented, expected) else WRONG
