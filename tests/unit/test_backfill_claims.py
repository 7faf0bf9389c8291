"""Backfill claims (``state.backfills``, ``engine.backfill``): ``--force`` claims a settled slot's next attempt,
never a slot whose run is still going: that run keeps its row, its attempt and its lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import to_iso
from loopsq.engine.backfill import run_backfill_slot
from loopsq.engine.runtime import Runtime
from loopsq.state.backfills import claim_backfill
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, Refusal, RunStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUNNER = Owner("worker:a", "host-a", 1)
BACKFILLER = Owner("worker:b", "host-b", 2)
SLOT = T0 + timedelta(seconds=10)


def running_slot(client: redis.Redis) -> Claim:
    """A loop whose slot ``SLOT`` has its scheduled run going on ``RUNNER``."""
    body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 10_000},
            "target": {"type": "command", "command": "true"}}
    loop_id = LoopStore(client, KEYS).create(new_loop(body, T0)).id
    claim = RunStore(client, KEYS).claim(loop_id, SLOT, RUNNER, datetime.now(UTC))
    assert isinstance(claim, Claim), claim
    return claim


def assert_untouched(client: redis.Redis, claim: Claim) -> None:
    """The run is as its claim left it: same row, attempt and owner, its lease still its own token."""
    store = RunStore(client, KEYS)
    run = store.get(claim.run.id)
    assert run is not None and (run.status, run.attempt, run.worker_id) == ("running", 1, RUNNER.worker_id), run
    assert store.lease_token(claim.run.id) == claim.token
    assert client.hget(KEYS.slots(claim.loop.id), to_iso(SLOT)) == claim.run.id
    assert [f["type"] for _, f in client.xrange(KEYS.changes) if f["type"] == "run_claimed"] == ["run_claimed"]


def test_backfill_force_on_a_slot_whose_run_is_running_is_refused_and_leaves_its_lease(client: redis.Redis) -> None:
    claim = running_slot(client)
    for force in (False, True):
        refused = claim_backfill(RunStore(client, KEYS), claim.loop.id, SLOT, BACKFILLER, datetime.now(UTC),
                                 force=force)
        assert isinstance(refused, Refusal), refused
        assert refused.reason == "running" and refused.run is not None and refused.run.id == claim.run.id
        assert_untouched(client, claim)


def test_a_forced_backfill_slot_whose_run_is_running_reports_it_running_and_executes_nothing(
    client: redis.Redis,
) -> None:
    claim = running_slot(client)
    rt = Runtime(client=client, keys=KEYS, role="worker", worker_id=BACKFILLER.worker_id)
    claimed = []
    # overlap allow: past the "another run of the loop is active" check, to the claim's own guard.
    result = run_backfill_slot(rt, claim.loop.id, to_iso(SLOT), force=True, overlap="allow", on_claim=claimed.append)
    assert (result.outcome, result.run.id if result.run else None) == ("running", claim.run.id)
    assert claimed == []
    assert_untouched(client, claim)
