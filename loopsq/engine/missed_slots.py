"""Recording the slots a fire gives up (``domain.missed``): why they were missed, judged from the timer job that
fired (``timers.Taken``: when it was due, when the scheduler moved it onto its queue, when a worker took it).

- The scheduler moved it late (more than ``LATE_MS`` after it was due): ``no scheduler ran``.
- It waited in its queue that long: ``no free worker for 42s``; for a loop with requirements, when the worker
  that took it came up after it was queued (no worker with those labels was there), ``no worker has labels …``.
- Otherwise catch-up gave the slots up (``catch-up latest skipped it``): the loop's timer was late for another
  reason (a run that overran, a pool that stayed full, a pause of the fleet).
"""

from __future__ import annotations

import logging
from datetime import datetime

from loopsq.domain import missed
from loopsq.domain.models import Loop
from loopsq.domain.timeutil import from_iso, to_ms
from loopsq.engine import timers
from loopsq.engine.routing import loop_requirements
from loopsq.engine.runtime import Runtime

log = logging.getLogger("loopsq.runs")

#: A timer moved, or a job waiting, longer than this says why its slots were missed.
LATE_MS = 2_000


def reason(loop: Loop, taken: timers.Taken | None, fired_at: datetime, worker_started: str | None) -> missed.Reason:
    """Why ``loop``'s dropped slots were missed, from the timer job that fired (None: unknown, catch-up)."""
    due_ms = taken.due_ms if taken is not None else None
    enqueued = taken.enqueued_at if taken is not None else None
    if due_ms is None or enqueued is None:
        return missed.catch_up(loop)
    moved_late = to_ms(enqueued) - due_ms
    waited = to_ms(fired_at) - to_ms(enqueued)
    if moved_late > LATE_MS:
        return missed.no_scheduler()
    if waited > LATE_MS:
        needs = loop_requirements(loop)
        if needs and worker_started is not None and from_iso(worker_started) > enqueued:
            return missed.no_worker_labels(needs)
        return missed.no_free_worker(waited)
    return missed.catch_up(loop)


def record(rt: Runtime, loop: Loop, streak: missed.Streak, why: missed.Reason, now: datetime) -> None:
    """Record the streak (coalesced into the loop's newest missed row of the same kind); a failure is logged,
    never raised: the fire's own work is done."""
    try:
        rt.runs.record_missed(loop.id, streak.first, streak.last, streak.count, why.kind, why.text, now)
    except Exception:
        log.exception("could not record %d missed slot(s) of loop=%s", streak.count, loop.name)
        return
    log.info("loop=%s missed %d slot(s) %s..%s: %s", loop.name, streak.count, streak.first.isoformat(),
             streak.last.isoformat(), why.text)
