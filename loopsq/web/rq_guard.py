"""rq-dashboard (under ``/rq``) held to the rest of the web app's security rules.

rq-dashboard 0.9 renders job descriptions, arguments, results and exception texts into its pages with
underscore's ``<%= %>``, which does not escape: a job whose description carries ``<img src=x onerror=...>`` ran
a script on ``/rq/0/view/job/<id>``. Its pages carry no security headers, its POSTs take no CSRF token and its
errors are HTML pages. Here, as Flask hooks on the app that serves it (``app.rq_dashboard_app``):

- **Escaping**: its templates are loaded through ``EscapingLoader``, which turns ``<%=`` into underscore's escaping
  ``<%-`` (the two places that already escape with jQuery keep ``<%=``): a description shows as text.
- **Content-Security-Policy** with a fresh nonce per response: scripts only from ``/rq/static`` and the page's
  own inline block (rq-dashboard's pages need one), which gets the nonce; an injected inline script or event
  handler (``onerror=``) is refused by the browser even if something escaped the escaping. ``'unsafe-eval'``
  stays: underscore compiles rq-dashboard's own templates with ``new Function``; no job data reaches that
  compiler (it gets the templates' text, data goes in as values). A ``sandbox`` without ``allow-same-origin``
  was not chosen: the pages would lose their origin, and with it the session cookie their XHRs need.
  ``frame-ancestors 'none'`` and ``X-Frame-Options: DENY``, ``nosniff``, ``no-referrer``, ``no-store``.
- **CSRF**: a request other than GET, HEAD or OPTIONS needs the session's CSRF token (``web/csrf.py``) in the
  ``X-CSRF-Token`` header, else 403 in the one error body, before rq-dashboard runs. Its pages send it: the
  nonce'd block sets it as a jQuery default header.
- **Errors**: every error rq-dashboard raises is answered in the one error body (JSON), 503 when Redis is
  unreachable, never an HTML 500.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any

import redis
from jinja2 import BaseLoader, Environment

from loopsq.domain.text import shown
from loopsq.state.outages import is_transient
from loopsq.web import auth, csrf
from loopsq.web.errors import STATUS_CODES, error_body

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: rq-dashboard's one inline script block (``base.html``); every other script of its pages has a ``src``.
INLINE_OPENING = '<script type="text/javascript">'
_UNESCAPED = re.compile(r"<%=(?!\s*\$\('<div/>'\)\.text\()")


def policy(nonce: str) -> str:
    """The Content-Security-Policy of an ``/rq`` response whose inline block carries ``nonce``."""
    return (f"default-src 'none'; script-src 'self' 'nonce-{nonce}' 'unsafe-eval'; "
            "style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; font-src 'self'; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


HEADERS = {
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class EscapingLoader(BaseLoader):
    """A Jinja loader over rq-dashboard's own that makes its underscore templates escape what they insert."""

    def __init__(self, inner: BaseLoader) -> None:
        self.inner = inner

    def get_source(self, environment: Environment, template: str) -> tuple[str, str | None,
                                                                           Callable[[], bool] | None]:
        source, filename, uptodate = self.inner.get_source(environment, template)
        if template.startswith("rq_dashboard/"):
            source = _UNESCAPED.sub("<%-", source)
        return source, filename, uptodate

    def list_templates(self) -> list[str]:
        return self.inner.list_templates()


def install(flask_app: Any, api_token: str, no_such_job: type[Exception]) -> None:
    """Put ``flask_app`` (rq-dashboard's) under the rules above; ``api_token`` keys the CSRF tokens;
    ``no_such_job`` is RQ's error for a missing job (a 404; this layer does not import RQ)."""
    flask_app.jinja_env.loader = EscapingLoader(flask_app.jinja_env.loader)
    flask_app.before_request(lambda: refuse_without_csrf(api_token))
    flask_app.after_request(lambda response: secure(response, api_token))
    flask_app.register_error_handler(Exception, lambda exc: answer_error(exc, no_such_job))


def _token(api_token: str) -> str:
    import flask

    bound = csrf.binding_of(flask.request.headers.get("Authorization"),
                            flask.request.cookies.get(auth.COOKIE_NAME))
    return "" if bound is None else csrf.token_of(api_token, bound)


def json_error(status: int, message: str) -> Any:
    """A Flask response with the one error body."""
    import flask

    response = flask.jsonify(error_body(status, message))
    response.status_code = status
    return response


def refuse_without_csrf(api_token: str) -> Any:
    """``before_request``: a state-changing request without this session's CSRF token is 403, unread."""
    import flask

    if flask.request.method in SAFE_METHODS:
        return None
    presented = flask.request.headers.get(csrf.HEADER)
    expected = _token(api_token)
    if not presented:
        return json_error(403, csrf.MISSING)
    if not expected or not auth.same(presented, expected):
        return json_error(403, csrf.WRONG)
    return None


def secure(response: Any, api_token: str) -> Any:
    """``after_request``: the headers on every response; an HTML page's inline block gets the nonce and the
    CSRF header default."""
    nonce = secrets.token_urlsafe(18)
    if response.mimetype == "text/html" and not response.direct_passthrough:
        body = response.get_data(as_text=True)
        if INLINE_OPENING in body:
            setup = f"$.ajaxSetup({{headers: {{{json.dumps(csrf.HEADER)}: {json.dumps(_token(api_token))}}}}});"
            body = body.replace(INLINE_OPENING, f'<script type="text/javascript" nonce="{nonce}">{setup}', 1)
            response.set_data(body)
    response.headers["Content-Security-Policy"] = policy(nonce)
    response.headers.update(HEADERS)
    return response


def answer_error(exc: Exception, no_such_job: type[Exception]) -> Any:
    """Flask's handler of every error: the one error body (rq-dashboard's own are HTML pages)."""
    import flask
    from werkzeug.exceptions import HTTPException

    path = flask.request.script_root + flask.request.path
    if isinstance(exc, HTTPException):
        status = exc.code or 500
        message = f"no such page: {shown(path)}" if status == 404 else (exc.description or exc.name)
        status = status if status in STATUS_CODES else (400 if 400 <= status < 500 else 500)
        response = json_error(status, message)
        allowed = dict(exc.get_headers()).get("Allow")
        if allowed:
            response.headers["Allow"] = allowed
        return response
    if isinstance(exc, no_such_job):
        job_id = str((flask.request.view_args or {}).get("job_id", ""))
        return json_error(404, f"no such job: {shown(job_id)}")
    if isinstance(exc, redis.RedisError) and is_transient(exc):
        return json_error(503, "redis is unreachable: the queue view cannot be read")
    log.error("%s %s failed", flask.request.method, path, exc_info=exc)
    return json_error(500, f"internal error: {type(exc).__name__}")
