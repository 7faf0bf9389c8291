"""Missed slots in Redis: one ``missed`` row per streak, coalesced, each record one transition with one change.

- ``record`` (``RunStore.record_missed``): when the loop's newest record (the top of ``keys.loop_runs``) is a
  ``missed`` row of the same kind, the streak extends it (its last slot, its count, its reason, ``updatedAt``);
  otherwise it starts a new row. Both are guarded on the top of the loop's runs (``Tx.expect_top``) and on the
  loop, so a run created meanwhile is never coalesced over. ``keys.missed_counts[kind]`` grows by the count in
  the same transition. A record that repeats one already made (a retry after a lost reply, a duplicate fire,
  even after a run came in between: the loop's ``RECENT`` newest records are compared) changes nothing.
- The row holds its first slot in ``keys.slots``, as every row does: that hash is Redis's side of the mirror's
  ``UNIQUE(loop_id, scheduled_for)``, so no other row can take the slot behind its back (an ad-hoc run steps
  around it). The streak's other slots are not in the hash: Redis grows with rows, not with slots.
- It never blocks a real run of its slots: a scheduled claim never reaches a slot the loop has moved past, and a
  backfill of its first slot takes the slot from it (``yield_first``): the row moves to its next slot that has no
  row (one less in its count), or goes when none is left. A backfill of any other slot needs nothing from it.
- The row is settled: it joins the loop's history window (``keys.retention_due``) and is trimmed with it.
"""

from __future__ import annotations

from datetime import datetime

import redis

from loopsq.domain import missed as rules
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import from_iso, gen_id, to_iso, to_ms
from loopsq.errors import ValidationError
from loopsq.state import durability, run_codec
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys

MAX_RETRIES = 50
#: The loop's newest records a new streak is compared with: one that one of them covers is recorded already (a
#: duplicate fire that recorded after another's run was claimed).
RECENT = 8


def _s(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def record(client: redis.Redis, keys: Keys, committer: Committer, loop_id: str, first: datetime, last: datetime,
           count: int, kind: str, reason: str, now: datetime) -> LoopRun | None:
    """Record that ``count`` slots of the loop, ``first`` to ``last``, did not run, for ``kind``/``reason``.

    Returns the missed row as it now stands (the one extended, created, or found already recording this
    streak), or None when the loop is gone or every slot of the streak has a row already.

    Raises:
        ValidationError: an unknown kind, a count below 1 or a ``last`` before ``first``.
    """
    rules.check_kind(kind)
    if count < 1 or last < first:
        raise ValidationError(f"a missed streak needs count >= 1 and last >= first, got {count} slot(s) from "
                              f"{to_iso(first)} to {to_iso(last)}")
    stamp = to_iso(now)
    for _ in range(MAX_RETRIES):
        pipe = client.pipeline(transaction=False)
        pipe.get(keys.loop(loop_id))
        pipe.zrevrange(keys.loop_runs(loop_id), 0, RECENT - 1)
        loop_reply, recent_ids = pipe.execute()
        loop_raw = _s(loop_reply)
        if loop_raw is None:
            return None
        loop = Loop.from_json(loop_raw)
        newest_id = _s(recent_ids[0]) if recent_ids else None
        recent_raws = run_codec.read_many(client, [keys.run(str(_s(i))) for i in recent_ids])
        newest_raw = recent_raws[0] if recent_raws else None
        newest = run_codec.decode(newest_raw) if newest_raw is not None else None
        tx = Tx("run_missed", stamp).expect(keys.loop(loop_id), loop_raw).expect_top(keys.loop_runs(loop_id),
                                                                                      newest_id)
        counted = count
        if newest is not None and newest.status == rules.MISSED and newest.missed_kind == kind:
            if to_iso(first) <= (newest.missed_last or newest.scheduled_for):
                return newest  # recorded already
            row = newest.with_changes(missed_last=to_iso(last), missed_count=(newest.missed_count or 1) + count,
                                      error=reason, updated_at=stamp, finished_at=stamp)
            tx.expect(keys.run(row.id), newest_raw).set(keys.run(row.id), run_codec.encode(row))
            tx.note("missed_extended")
        else:
            covering = _covering(recent_raws, to_iso(first))
            if covering is not None:
                return covering  # recorded already, before the runs that came since
            start = _unrecorded(client, keys, loop, rules.Streak(first, last, count))
            if isinstance(start, LoopRun):
                return start  # a missed row holds the slot: this streak was recorded
            if start is None:
                return None
            counted = start.count  # (slots that have a row are not missed)
            row = LoopRun(id=gen_id(), loop_id=loop.id, loop_name=loop.name, scheduled_for=to_iso(start.first),
                          attempt=1, status=rules.MISSED, created_at=stamp, updated_at=stamp, finished_at=stamp,
                          error=reason, source="scheduled", missed_last=to_iso(start.last),
                          missed_count=start.count, missed_kind=kind)
            created = to_ms(now)
            (
                tx.expect_field(keys.slots(loop_id), row.scheduled_for, None)
                .expect(keys.run(row.id), None)
                .hset(keys.slots(loop_id), row.scheduled_for, row.id)
                .set(keys.run(row.id), run_codec.encode(row))
                .zadd(keys.runs, created, row.id)
                .zadd(keys.loop_runs(loop_id), created, row.id)
            )
        (
            tx.zadd(keys.retention_due, to_ms(now), f"loop:{loop_id}")
            .hincrby(keys.missed_counts, kind, counted)
            .put("loop_runs", row.to_dict())
        )
        # Waited for a replica as the claim that moved the loop past these slots was: otherwise a failover right
        # after keeps the claim and discards this record, and the slots end without one (issue 27). One that a
        # failover will discard is recorded again on the new master.
        replicas = durability.claim_replicas(client)
        waited = durability.replicas_to_wait(client, replicas)
        result = committer.commit(tx, replicas=waited, wait_ms=durability.WAIT_MS, locate=replicas > 0)
        if result.ok:
            if not durability.settle(client, result.server or (None, None), replicas, waited,
                                     result.replicated or 0):
                continue
            return row
    return None


def _covering(raws: list[run_codec.Stored | None], slot: str) -> LoopRun | None:
    """The missed row among ``raws`` whose streak includes ``slot``, if any."""
    for raw in raws:
        run = run_codec.decode(raw) if raw is not None else None
        if run is not None and run.status == rules.MISSED and run.scheduled_for <= slot <= (
                run.missed_last or run.scheduled_for):
            return run
    return None


def _unrecorded(client: redis.Redis, keys: Keys, loop: Loop, streak: rules.Streak) -> rules.Streak | LoopRun | None:
    """``streak`` from its first slot that has no row (a slot with a run or a skip is not missed); the missed row
    met on the way, if any (from there on the slots are recorded as missed already); None when every slot has a
    row."""
    current: rules.Streak | None = streak
    while current is not None:
        holder = _s(client.hget(keys.slots(loop.id), to_iso(current.first)))
        if holder is None:
            return current
        held = run_codec.load(client, keys.run(holder))
        if held is not None and held.status == rules.MISSED:
            return held
        current = rules.without_first(loop, current)
    return None


def counts(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """How many slots were missed, per kind, since the deployment began (``loopsq_slots_missed_total``)."""
    raw = client.hgetall(keys.missed_counts)
    return {str(_s(k)): int(str(_s(v))) for k, v in raw.items()}


def yield_first(tx: Tx, client: redis.Redis, keys: Keys, loop: Loop, row: LoopRun, raw: run_codec.Stored,
                stamp: str) -> LoopRun | None:
    """Add to ``tx`` (a claim that takes the missed ``row``'s first slot) the row giving that slot up: it moves
    to its next slot that has no row, one less in its count, or goes when none is left. Guarded on the row as
    read. Call before the claim's own ``put``, so that mirrors move the row off the slot before the run takes
    it. Returns the row as it moves, or None when it goes.

    The caller's claim re-points the slot's field in ``keys.slots``.
    """
    tx.expect(keys.run(row.id), raw)
    first = from_iso(row.scheduled_for)
    streak = rules.Streak(first, from_iso(row.missed_last or row.scheduled_for), row.missed_count or 1)
    rest = rules.without_first(loop, streak)
    left = _unrecorded(client, keys, loop, rest) if rest is not None else None
    if not isinstance(left, rules.Streak):  # (a missed row further on holds the next slot: this one ends here)
        (
            tx.delete_key(keys.run(row.id))
            .zrem(keys.runs, row.id)
            .zrem(keys.loop_runs(row.loop_id), row.id)
            .drop("loop_runs", row.id)
        )
        return None
    moved = row.with_changes(scheduled_for=to_iso(left.first), missed_count=left.count, updated_at=stamp)
    (
        tx.expect_field(keys.slots(row.loop_id), moved.scheduled_for, None)
        .hset(keys.slots(row.loop_id), moved.scheduled_for, row.id)
        .set(keys.run(row.id), run_codec.encode(moved))
        .put("loop_runs", moved.to_dict())
    )
    return moved
