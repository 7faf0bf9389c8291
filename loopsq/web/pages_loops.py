"""Dashboard pages for loops and their run history: the loops list (filtered by name and status), a loop's page
(``/loops/{idOrName}``) and the run list (``/runs``, by loop, status and creation time).

Lists are keyset pages over the mirror (``mirror/pages.py``): an "Older"/"Next" link carries the cursor, never
an offset. A filter value that is not valid is one 400 naming the parameter and quoting the value, in the one
error body (an HTML page for a browser), as the API answers.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from loopsq.domain.checks import check_visible
from loopsq.domain.models import LOOP_STATUSES
from loopsq.domain.redaction import public_loop
from loopsq.domain.run_rules import RUN_STATUSES
from loopsq.domain.text import shown
from loopsq.domain.timeutil import from_iso
from loopsq.domain.upcoming import fire_times, jitter_of, policies_in_words, schedule_in_words
from loopsq.errors import NotFoundError, ValidationError
from loopsq.executor.digest import command_fields
from loopsq.mirror import pages, queries
from loopsq.web import filters, run_chart
from loopsq.web.dashboard import STRIP_RUNS, describe_schedule, next_run_of, render
from loopsq.web.deps import Ctx

router = APIRouter(include_in_schema=False)

#: How many recent runs the loop page's chart draws.
CHART_RUNS = 50
HISTORY_PAGE = 25
LIST_PAGE = 100

Text = Annotated[str | None, Query()]
Cursor = Annotated[str | None, Query(max_length=400)]

#: What a loop page says after an action redirected to it (a fixed text per action; never the query's text).
DONE = {"pause": "Paused.", "resume": "Resumed.", "stop": "Stopped.", "trigger": "Triggered run",
        "run-now-queued": "Run-now requested; no worker has taken it yet."}


def loop_actions(loop: dict[str, Any], now: datetime) -> list[str]:
    """The actions that apply to the loop as it is (``domain/lifecycle.py``): none on an archived loop (it must be
    unarchived first); pause an active loop; resume a paused, stopped or expired one (not one whose ``expiresAt``
    has passed); stop an active or paused one; run-now and trigger any other."""
    if loop.get("archivedAt"):
        return []
    status = loop.get("status")
    expires = loop.get("expiresAt")
    past_expiry = isinstance(expires, str) and bool(expires) and from_iso(expires) <= now
    shown_verbs = []
    if status == "active":
        shown_verbs.append("pause")
    if status in ("paused", "stopped") or (status == "expired" and not past_expiry):
        shown_verbs.append("resume")
    if status in ("active", "paused"):
        shown_verbs.append("stop")
    return [*shown_verbs, "run-now", "trigger"]


def run_filters(status: str | None, since: str | None, until: str | None) -> dict[str, str | None]:
    """Validated run filters (``status``, ``since``, ``until``); 400 for the first bad one."""
    start, end = filters.time_range(since, until)
    return {"status": filters.choice("status", status, RUN_STATUSES), "since": start, "until": end}


@router.get("/loops/{loop}")
def loop_page(request: Request, ctx: Ctx, loop: str, status: Text = None, since: Text = None, until: Text = None,
              cursor: Cursor = None, done: Text = None, run: Text = None) -> HTMLResponse:
    """One loop: its definition (redacted as ``show``), schedule, next fire times, policies, failure streak,
    a chart of its recent runs and its run history."""
    wanted = run_filters(status, since, until)
    with ctx.mirror() as conn:
        found = queries.find_loop(conn, loop)
        if found is None:
            raise NotFoundError(f"loop not found: {shown(loop)}")
        history = pages.runs_page(conn, loop_id=str(found["id"]), cursor=cursor, limit=HISTORY_PAGE, **wanted)
        recent = queries.list_runs(conn, loop_id=str(found["id"]), limit=CHART_RUNS)
    zone = str(found.get("timezone") or "UTC")
    notice = DONE.get(done or "")
    if notice and done == "trigger" and run:
        notice = f"{notice} {run}."
    context = {
        "loop": found, "definition": json.dumps(public_loop(found), indent=2, ensure_ascii=False),
        "schedule_words": schedule_in_words(found.get("schedule") or {}, zone), "zone": zone,
        "fire_times": fire_times(found), "policies": policies_in_words(found), "history": history,
        "chart": run_chart.layout(list(reversed(recent))), "filters": wanted, "notice": notice,
        "query": {k: v for k, v in wanted.items() if v}, "command": command_fields(found.get("target")),
        "actions": loop_actions(found, ctx.now()), "jitter": jitter_of(found),
    }
    return render(request, ctx, "loop.html", context)


@router.get("/runs")
def runs_page(request: Request, ctx: Ctx, loop: Text = None, status: Text = None, since: Text = None,
              until: Text = None, cursor: Cursor = None, limit: Text = None, tag: Text = None) -> HTMLResponse:
    """Loop runs, newest first, by loop (id or name; a removed loop's too), status, creation time and the tags of
    their loops (``key:value`` pairs separated by spaces, all of which a run's loop must carry)."""
    wanted = run_filters(status, since, until)
    tag_shown, tags = filters.tag_text(tag)
    size = filters.page_size(limit, HISTORY_PAGE * 2)
    with ctx.mirror() as conn:
        owner: dict[str, str] = {}
        if loop:
            matched = queries.run_filter(conn, loop)
            if matched is None:
                raise NotFoundError(f"loop not found: {shown(loop)}")
            owner = matched
        page = pages.runs_page(conn, tags, cursor=cursor, limit=size, **owner, **wanted)
    query = {k: v for k, v in {"loop": loop or None, **wanted, "tag": tag_shown, "limit": limit or None}.items()
             if v}
    return render(request, ctx, "runs.html", {"page": page, "filters": {**wanted, "loop": loop or "",
                                                                        "tag": tag_shown},
                                               "query": query, "statuses": RUN_STATUSES})


def loops_list(ctx: Ctx, name: str | None, status: str | None, cursor: str | None,
               tag: str | None = None) -> tuple[pages.Page, dict[str, Any]]:
    """The loops list's page and its validated filters (``tag``: ``key:value`` pairs separated by spaces, all of
    which a loop must carry)."""
    wanted = (name or "").strip() or None
    if wanted and len(wanted) > 200:
        raise ValidationError(f"name must be at most 200 characters, got {len(wanted)}")
    if wanted:
        check_visible(wanted, "name")  # no name holds one; SQLite's LIKE stops at a NUL
    chosen = filters.choice("status", status, LOOP_STATUSES)
    tag_text, tags = filters.tag_text(tag)
    with ctx.mirror() as conn:
        page = pages.loops_page(conn, name=wanted, status=chosen, cursor=cursor, limit=LIST_PAGE, tags=tags)
    return page, {"name": wanted, "status": chosen, "tag": tag_text}


@router.get("/")
def loops_page(request: Request, ctx: Ctx, name: Annotated[str | None, Query()] = None,
               status: Annotated[str | None, Query()] = None,
               cursor: Annotated[str | None, Query(max_length=400)] = None,
               tag: Annotated[str | None, Query()] = None) -> HTMLResponse:
    """Loops by name (filtered by name, status and tags, a keyset page at a time): status, tags, schedule, next
    run and their last runs as a coloured strip (oldest left)."""
    page, chosen = loops_list(ctx, name, status, cursor, tag)
    rows = []
    with ctx.mirror(fresh=False) as conn:
        for loop in page.items:
            recent = queries.list_runs(conn, loop_id=loop["id"], limit=STRIP_RUNS)
            rows.append({"loop": loop, "schedule": describe_schedule(loop.get("schedule") or {}, loop.get("timezone")),
                         "runs": list(reversed(recent)), "next_run": next_run_of(loop), "jitter": jitter_of(loop)})
    query = {k: v for k, v in chosen.items() if v}
    return render(request, ctx, "loops.html", {"rows": rows, "page": page, "filters": chosen, "query": query,
                                               "statuses": LOOP_STATUSES}, refresh=not (query or cursor))
