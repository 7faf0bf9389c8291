"""Loop-moving transitions that record no running run: an overlap skip, moving past a settled slot, deferring
a retry. Each is one atomic transition, guarded on the loop's stored JSON."""

from __future__ import annotations

from datetime import datetime

import redis

from loopsq.domain import run_rules as rules
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.schedules import compute_next_after
from loopsq.domain.timeutil import gen_id, to_iso, to_ms
from loopsq.state import run_codec
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys

MAX_RETRIES = 50


def _s(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class LoopMoves:
    """Transitions that move a loop without a running run (mixed into ``RunStore``)."""

    client: redis.Redis
    keys: Keys
    committer: Committer

    def skip(self, loop_id: str, slot: datetime, now: datetime, *, error: str = rules.SKIP_ERROR,
             ends_backlog: bool = False) -> LoopRun | None:
        """Record an overlap skip of a regular slot and move the loop past it (``ends_backlog``: as for a claim).

        A slot that already has a row (for example a failed run awaiting its retry) is never overwritten: the
        reference's skip could swallow a pending retry; loopsq leaves the row and only moves the loop.
        """
        slot_iso = to_iso(slot)
        stamp = to_iso(now)
        for _ in range(MAX_RETRIES):
            loop_raw = _s(self.client.get(self.keys.loop(loop_id)))
            if loop_raw is None:
                return None
            loop = Loop.from_json(loop_raw)
            new_loop = rules.after_claim(loop, slot, now, is_retry=False, ends_backlog=ends_backlog)
            if rules.advances_at_finish(loop):
                new_loop = loop  # its next slot is set when the running run ends
            existing_id = _s(self.client.hget(self.keys.slots(loop_id), slot_iso))
            tx = Tx("run_skipped", stamp).expect_field(self.keys.slots(loop_id), slot_iso, existing_id)
            tx.expect(self.keys.loop(loop_id), loop_raw)
            run: LoopRun | None = None
            if existing_id is None:
                run = LoopRun(
                    id=gen_id(), loop_id=loop.id, loop_name=loop.name, scheduled_for=slot_iso, attempt=1,
                    status="skipped", created_at=stamp, updated_at=stamp, finished_at=stamp, error=error,
                    source="scheduled",
                )
                created = to_ms(now)
                (
                    tx.hset(self.keys.slots(loop_id), slot_iso, run.id)
                    .set(self.keys.run(run.id), run_codec.encode(run))
                    .zadd(self.keys.runs, created, run.id)
                    .zadd(self.keys.loop_runs(loop_id), created, run.id)
                    .zadd(self.keys.retention_due, created, f"loop:{loop_id}")
                    .put("loop_runs", run.to_dict())
                )
            if new_loop != loop:
                tx.set(self.keys.loop(loop_id), new_loop.to_json()).put("loops", new_loop.to_dict())
                tx.note("loop_advanced")
            if self.committer.commit(tx).ok:
                return run
        return None

    def advance_past(self, loop_id: str, slot: datetime, now: datetime) -> Loop | None:
        """Move a loop past a due slot that is already settled (the reference's stuck-loop fix)."""
        slot_iso = to_iso(slot)
        for _ in range(MAX_RETRIES):
            loop_raw = _s(self.client.get(self.keys.loop(loop_id)))
            if loop_raw is None:
                return None
            loop = Loop.from_json(loop_raw)
            new_loop = rules.after_claim(loop, slot, now, is_retry=loop.retry_scheduled_for == slot_iso)
            if rules.advances_at_finish(loop) and new_loop.next_run_at is None and loop.retry_scheduled_for != slot_iso:
                # Nothing runs for this settled slot, so schedule from now instead of from a run's end.
                upcoming = compute_next_after(loop.schedule, slot, now, loop.timezone)
                new_loop = new_loop.with_changes(
                    next_run_at=to_iso(upcoming) if upcoming else None,
                    status=loop.status if upcoming else "stopped",
                )
            if new_loop == loop:
                return loop
            tx = (
                Tx("loop_advanced", to_iso(now))
                .expect(self.keys.loop(loop_id), loop_raw)
                .set(self.keys.loop(loop_id), new_loop.to_json())
                .put("loops", new_loop.to_dict())
            )
            if self.committer.commit(tx).ok:
                return new_loop
        return None

    def defer_retry(self, loop_id: str, until: datetime, now: datetime) -> None:
        """Push a pending retry that cannot run yet (its loop has a run going and overlap is skip) to ``until``."""
        for _ in range(MAX_RETRIES):
            loop_raw = _s(self.client.get(self.keys.loop(loop_id)))
            if loop_raw is None:
                return
            loop = Loop.from_json(loop_raw)
            if loop.retry_scheduled_for is None:
                return
            new_loop = loop.with_changes(retry_at=to_iso(until), updated_at=to_iso(now))
            tx = (
                Tx("retry_deferred", to_iso(now))
                .expect(self.keys.loop(loop_id), loop_raw)
                .set(self.keys.loop(loop_id), new_loop.to_json())
                .put("loops", new_loop.to_dict())
            )
            if self.committer.commit(tx).ok:
                return
