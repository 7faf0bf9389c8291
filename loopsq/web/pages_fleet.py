"""The dashboard's Fleet page (``/fleet``): backpressure made visible. The live workers (labels, slots in use of
their capacity, the queues they listen on), every queue (runs waiting, how long the oldest has waited, and a
warning on those no live worker can take, naming the labels missing), and the timers overdue.

Read from Redis at request time (``engine.fleet``: a few pipelined round trips, whatever the number of loops),
not from the mirror: it is live state, not history. The page refreshes itself like the other live pages.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from loopsq.engine.fleet import age_text, read_fleet
from loopsq.web.dashboard import render
from loopsq.web.deps import Ctx

router = APIRouter(include_in_schema=False)


@router.get("/fleet")
def fleet_page(request: Request, ctx: Ctx) -> HTMLResponse:
    """Workers, queues and timers, with the queues no live worker can take marked."""
    fleet = read_fleet(ctx.client, ctx.keys)
    return render(request, ctx, "fleet.html", {"fleet": fleet, "age": age_text}, refresh=True)
