"""Skipped slots recorded by a feature rather than by overlap: a closed change gate (and a busy workspace).

One atomic transition each (``run_skipped``, noting ``gate_closed``/``workspace_busy``): a ``skipped`` row for
the slot with the reason, and the loop moved past the slot, guarded on the loop's stored JSON. A skipped slot is
neither a failure nor an attempt: the failure streak and the retry rule are untouched. Unlike an overlap skip,
no run is going, so a loop that schedules from the end of a run is moved from now (as ``advance_past`` does).
"""

from __future__ import annotations

from datetime import datetime

from loopsq.domain import run_rules as rules
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.schedules import compute_next_after
from loopsq.domain.timeutil import gen_id, to_iso, to_ms
from loopsq.state.commit import Tx
from loopsq.state.run_moves import _s
from loopsq.state.runs import RunStore

MAX_RETRIES = 50


def moved_past(loop: Loop, slot: datetime, now: datetime, ends_backlog: bool) -> Loop:
    """The loop once ``slot`` is skipped at ``now`` with no run going."""
    new_loop = rules.after_claim(loop, slot, now, is_retry=False, ends_backlog=ends_backlog)
    if rules.advances_at_finish(loop):
        upcoming = compute_next_after(loop.schedule, slot, now, loop.timezone)
        new_loop = new_loop.with_changes(next_run_at=to_iso(upcoming) if upcoming else None,
                                         status=loop.status if upcoming else "stopped")
    return new_loop


def skip_slot(store: RunStore, loop_id: str, slot: datetime, now: datetime, *, error: str, note: str,
              ends_backlog: bool = False) -> LoopRun | None:
    """Record ``slot`` of the loop as ``skipped`` with ``error`` and move the loop past it; the row, or None when
    the slot had a row already (then only the loop moves) or the loop is gone."""
    slot_iso = to_iso(slot)
    stamp = to_iso(now)
    for _ in range(MAX_RETRIES):
        loop_raw = _s(store.client.get(store.keys.loop(loop_id)))
        if loop_raw is None:
            return None
        loop = Loop.from_json(loop_raw)
        if loop.status != "active" or rules.slot_is_past(loop, slot_iso):
            return None  # paused meanwhile, or another worker handled the slot already
        new_loop = moved_past(loop, slot, now, ends_backlog)
        existing_id = _s(store.client.get(store.keys.slot(loop_id, slot_iso)))
        tx = Tx("run_skipped", stamp).expect(store.keys.slot(loop_id, slot_iso), existing_id)
        tx.expect(store.keys.loop(loop_id), loop_raw)
        run: LoopRun | None = None
        if existing_id is None:
            run = LoopRun(id=gen_id(), loop_id=loop.id, loop_name=loop.name, scheduled_for=slot_iso, attempt=1,
                          status="skipped", created_at=stamp, updated_at=stamp, finished_at=stamp, error=error,
                          source="scheduled")
            created = to_ms(now)
            (
                tx.set(store.keys.slot(loop_id, slot_iso), run.id)
                .set(store.keys.run(run.id), run.to_json())
                .zadd(store.keys.runs, created, run.id)
                .zadd(store.keys.loop_runs(loop_id), created, run.id)
                .zadd(store.keys.retention_due, created, f"loop:{loop_id}")
                .put("loop_runs", run.to_dict())
            )
        tx.note(note)
        if new_loop != loop:
            tx.set(store.keys.loop(loop_id), new_loop.to_json()).put("loops", new_loop.to_dict())
            tx.note("loop_advanced")
        if store.committer.commit(tx).ok:
            return run
    return None
