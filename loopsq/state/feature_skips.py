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
from loopsq.domain.timeutil import from_iso, gen_id, to_iso, to_ms
from loopsq.state import run_codec
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
        existing_id = _s(store.client.hget(store.keys.slots(loop_id), slot_iso))
        tx = Tx("run_skipped", stamp).expect_field(store.keys.slots(loop_id), slot_iso, existing_id)
        tx.expect(store.keys.loop(loop_id), loop_raw)
        run: LoopRun | None = None
        if existing_id is None:
            run = LoopRun(id=gen_id(), loop_id=loop.id, loop_name=loop.name, scheduled_for=slot_iso, attempt=1,
                          status="skipped", created_at=stamp, updated_at=stamp, finished_at=stamp, error=error,
                          source="scheduled")
            created = to_ms(now)
            (
                tx.hset(store.keys.slots(loop_id), slot_iso, run.id)
                .set(store.keys.run(run.id), run_codec.encode(run))
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


def end_skipped(store: RunStore, run_id: str, token: str, now: datetime, *, error: str,
                note: str) -> tuple[LoopRun, Loop | None] | None:
    """End a claimed run that could not start (its workspace stayed busy) as ``skipped`` with ``error``, fenced by
    its lease: neither a failure nor a retry; a loop that schedules from the end of a run gets its next slot from
    now. None when the lease was lost."""
    stamp = to_iso(now)
    for _ in range(MAX_RETRIES):
        raw = run_codec.read(store.client, store.keys.run(run_id))
        if raw is None:
            return None
        run = run_codec.decode(raw)
        if run.status != "running":
            return None
        final = run.with_changes(status="skipped", finished_at=stamp, error=error, lease_expires_at=None,
                                 duration_ms=0, updated_at=stamp)
        loop_raw = _s(store.client.get(store.keys.loop(run.loop_id)))
        tx = Tx("run_skipped", stamp).expect(store.keys.lease(run_id), token).expect(store.keys.run(run_id), raw)
        tx.expect(store.keys.loop(run.loop_id), loop_raw)
        new_loop: Loop | None = None
        if loop_raw is not None:
            loop = Loop.from_json(loop_raw)
            if (loop.status == "active" and rules.advances_at_finish(loop) and loop.next_run_at is None
                    and loop.retry_scheduled_for is None and run.source not in rules.MANUAL_SOURCES):
                new_loop = moved_past(loop, from_iso(run.scheduled_for), now, False).with_changes(updated_at=stamp)
                tx.set(store.keys.loop(run.loop_id), new_loop.to_json()).put("loops", new_loop.to_dict())
                tx.note("loop_advanced")
        tx.note(note)
        (
            tx.set(store.keys.run(run_id), run_codec.encode(final))
            .delete_key(store.keys.lease(run_id))
            .delete_key(store.keys.cancel(run_id))
            .srem(store.keys.running, run_id)
            .srem(store.keys.loop_active(run.loop_id), run_id)
            .delete_key(store.keys.claim(run.loop_id, run.scheduled_for, run.attempt, run.rerun))
            .zadd(store.keys.retention_due, to_ms(now), f"loop:{run.loop_id}")
            .put("loop_runs", final.to_dict())
        )
        if run.host:
            tx.srem(store.keys.host_runs(run.host), run_id)
        result = store.committer.commit(tx)
        if result.ok:
            return final, new_loop
        if result.failed_guard == 0:
            return None
    return None
