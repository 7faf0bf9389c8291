"""Claiming a backfill slot: one atomic transition, like ``RunStore.claim``, that never moves the loop.

A backfill run is a normal run of a past slot (source ``backfill``): ``(loop, slot, attempt)`` is claimed with a
SET-NX-style guard on its claim key, the lease is taken in the same step, and the run is then executed and
finalized (fenced) by the engine as any other. It is idempotent per slot: a slot that already has a row is
refused (``done``; ``running`` while its run goes on) unless ``force``, which claims the row's next attempt. A slot
held by a ``missed`` row is no run of its own: the backfill takes it, and the row moves on to the next slot of its
streak, in the same transition (``state.missed.yield_first``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from loopsq.domain import run_rules as rules
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import gen_id, to_iso, to_ms
from loopsq.state import durability, missed, run_codec
from loopsq.state.commit import Tx
from loopsq.state.run_moves import _s
from loopsq.state.runs import CLAIM_TTL_MS, Claim, Owner, Refusal, RunStore

MAX_RETRIES = 50
SOURCE = "backfill"


def claim_backfill(store: RunStore, loop_id: str, slot: datetime, owner: Owner, now: datetime, *,
                   force: bool = False, nonce: str | None = None) -> Claim | Refusal:
    """Claim ``slot`` of the loop as a backfill run for ``owner``: at most one claimer ever wins an attempt."""
    slot_iso = to_iso(slot)
    stamp = to_iso(now)
    for _ in range(MAX_RETRIES):
        loop_raw = _s(store.client.get(store.keys.loop(loop_id)))
        if loop_raw is None:
            return Refusal("gone")
        loop = Loop.from_json(loop_raw)
        existing_id = _s(store.client.hget(store.keys.slots(loop_id), slot_iso))
        existing_raw = run_codec.read(store.client, store.keys.run(existing_id)) if existing_id else None
        existing = run_codec.decode(existing_raw) if existing_raw else None
        held: tuple[LoopRun, run_codec.Stored] | None = None
        if existing is not None and existing_raw is not None and existing.status == rules.MISSED:
            held, existing = (existing, existing_raw), None  # not a run of this slot: it gives the slot up
        if existing is not None and existing.status == "running":
            return Refusal("running", existing)
        if existing is not None and not force:
            return Refusal("done", existing)
        if existing is None:
            run = LoopRun(id=gen_id(), loop_id=loop.id, loop_name=loop.name, scheduled_for=slot_iso, attempt=1,
                          status="running", created_at=stamp, updated_at=stamp)
        else:
            # ``--force``: the row's next attempt, whatever its status (``run_rules.next_attempt`` for any end).
            run = existing.with_changes(
                attempt=existing.attempt + 1, rerun=None, status="running", finished_at=None, pid=None,
                exit_code=None, duration_ms=None, stdout=None, stderr=None, error=None, host=None, pid_start_time=None,
                updated_at=stamp, previous_attempts=rules.attempt_history(existing), outcome=None, control=None,
                control_warning=None, no_retry=None, workspace=None, workspace_fence=None,
                input_tokens=None, output_tokens=None, cost_usd=None)
        token = f"{owner.worker_id}:{run.id}:{run.attempt}:{nonce or gen_id()}"
        run = run.with_changes(
            started_at=stamp, claimed_by=owner.worker_id, worker_id=owner.worker_id, host=owner.host,
            lease_expires_at=to_iso(now + timedelta(milliseconds=loop.lease_ms)),
            source=SOURCE if existing is None else existing.source or SOURCE,
        )
        claim_key = store.keys.claim(loop_id, slot_iso, run.attempt, run.rerun)
        tx = (
            Tx("run_claimed", stamp)
            .expect(claim_key, None)
            .expect_field(store.keys.slots(loop_id), slot_iso, existing_id)
            .expect(store.keys.run(run.id), existing_raw if existing is not None else None)
            .expect(store.keys.loop(loop_id), loop_raw)
            .set(claim_key, token, px=CLAIM_TTL_MS)
            .hset(store.keys.slots(loop_id), slot_iso, run.id)
            .set(store.keys.run(run.id), run_codec.encode(run))
            .set(store.keys.lease(run.id), token, px=rules.lease_ttl_ms(loop.lease_ms))
            .sadd(store.keys.running, run.id)
            .sadd(store.keys.loop_active(loop_id), run.id)
            .note("backfill")
        )
        if held is not None:
            missed.yield_first(tx, store.client, store.keys, loop, held[0], held[1], stamp)
        tx.put("loop_runs", run.to_dict())
        if existing is None:
            created = to_ms(now)
            tx.zadd(store.keys.runs, created, run.id).zadd(store.keys.loop_runs(loop_id), created, run.id)
        replicas = store.claim_replicas
        waited = durability.replicas_to_wait(store.client, replicas)
        result = store.committer.commit(tx, replicas=waited, wait_ms=durability.WAIT_MS, locate=replicas > 0)
        if result.ok:
            if not durability.settle(store.client, result.server or (None, None), replicas, waited,
                                     result.replicated or 0, claim=claim_key, token=token):
                return Refusal("claimed", None)
            return Claim(run, loop, token)
        if result.failed_guard == 0:
            winner = _s(store.client.hget(store.keys.slots(loop_id), slot_iso))
            return Refusal("claimed", (store.get(winner) if winner else None) or existing)
    return Refusal("claimed", None)
