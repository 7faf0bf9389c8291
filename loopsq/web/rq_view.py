"""Hooks that fit rq-dashboard (mounted under ``/rq``, see ``app.rq_dashboard_app``) into the dashboard.

- ``/rq/`` opens on loopsq's own queue (``loopsq``, its queued jobs) rather than the overview of every queue
  the Redis holds; rq-dashboard's "Queues" tab still shows them all.
- Every rq-dashboard page carries a link back to loopsq's dashboard at the top.
"""

from __future__ import annotations

from typing import Any

from loopsq.engine.timers import QUEUE_NAME

#: Where ``/rq/`` goes: the jobs of loopsq's queue (rq-dashboard's jobs view: registry, page size, order, page).
QUEUE_VIEW = f"/0/view/jobs/{QUEUE_NAME}/queued/8/asc/1"
BACK_LINK = ('<div id="loopsq-back" style="padding:.4rem 1rem;background:#24292f;font:14px system-ui,sans-serif">'
             '<a href="/" style="color:#fff;text-decoration:none">&larr; loopsq dashboard</a></div>')


def open_on_our_queue() -> Any:
    """A ``before_request`` hook: rq-dashboard's home page redirects to loopsq's queue."""
    import flask

    if flask.request.method in ("GET", "HEAD") and flask.request.path == "/":
        return flask.redirect(flask.request.script_root + QUEUE_VIEW, code=302)
    return None


def link_back(response: Any) -> Any:
    """An ``after_request`` hook: an HTML page gets the link back to loopsq's dashboard after ``<body>``."""
    if response.mimetype == "text/html" and not response.direct_passthrough:
        body = response.get_data(as_text=True)
        if "<body>" in body and 'id="loopsq-back"' not in body:
            response.set_data(body.replace("<body>", "<body>" + BACK_LINK, 1))
    return response
