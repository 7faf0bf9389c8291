"""Hooks that fit rq-dashboard (mounted under ``/rq``, see ``app.rq_dashboard_app``) into the dashboard.

- ``/rq/`` opens on the deployment's own queue (its namespace's base queue, ``loopsq`` by default; its queued
  jobs) rather than the overview of every queue
  the Redis holds; rq-dashboard's "Queues" tab still shows them all.
- Every rq-dashboard page carries a link back to loopsq's dashboard at the top.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loopsq.engine.timers import QUEUE_NAME


def queue_view(queue: str) -> str:
    """Where ``/rq/`` goes: the jobs of ``queue`` (rq-dashboard's jobs view: registry, page size, order, page)."""
    return f"/0/view/jobs/{queue}/queued/8/asc/1"


#: Where ``/rq/`` goes in the default namespace.
QUEUE_VIEW = queue_view(QUEUE_NAME)
BACK_LINK = ('<div id="loopsq-back" style="padding:.4rem 1rem;background:#24292f;font:14px system-ui,sans-serif">'
             '<a href="/" style="color:#fff;text-decoration:none">&larr; loopsq dashboard</a></div>')


def open_on_queue(queue: str) -> Callable[[], Any]:
    """A ``before_request`` hook: rq-dashboard's home page redirects to ``queue`` (the namespace's base queue)."""
    view = queue_view(queue)

    def hook() -> Any:
        import flask

        if flask.request.method in ("GET", "HEAD") and flask.request.path == "/":
            return flask.redirect(flask.request.script_root + view, code=302)
        return None

    return hook


#: The hook of the default namespace.
open_on_our_queue = open_on_queue(QUEUE_NAME)


def link_back(response: Any) -> Any:
    """An ``after_request`` hook: an HTML page gets the link back to loopsq's dashboard after ``<body>``."""
    if response.mimetype == "text/html" and not response.direct_passthrough:
        body = response.get_data(as_text=True)
        if "<body>" in body and 'id="loopsq-back"' not in body:
            response.set_data(body.replace("<body>", "<body>" + BACK_LINK, 1))
    return response
