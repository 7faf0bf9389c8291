"""Workspace leases (``state.workspaces``): taking one is fenced by the taker's own lease. A run that lost its lease
(expired, or taken by the row's next attempt after recovery) and a step holder whose own lease is gone take
nothing: the workspace stays free for a live contender, and nothing is recorded on the run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, RunStore
from loopsq.state.workspaces import Acquired, WorkspaceLeases

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = Owner("worker:a", "host-a", 1)
SLOT = T0 + timedelta(seconds=10)
WS = "repo"


def claimed(client: redis.Redis) -> Claim:
    body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 10_000},
            "target": {"type": "command", "command": "true"}, "maxAttempts": 2, "workspace": WS}
    loop_id = LoopStore(client, KEYS).create(new_loop(body, T0)).id
    claim = RunStore(client, KEYS).claim(loop_id, SLOT, OWNER, datetime.now(UTC))
    assert isinstance(claim, Claim), claim
    return claim


def assert_not_taken(client: redis.Redis, run_id: str) -> None:
    assert client.get(KEYS.workspace(WS)) is None and client.get(KEYS.workspace_fence(WS)) is None
    run = RunStore(client, KEYS).get(run_id)
    assert run is not None and (run.workspace, run.workspace_fence) == (None, None), run
    assert [f["type"] for _, f in client.xrange(KEYS.changes) if f["type"] == "run_workspace_acquired"] == []


def test_a_run_whose_lease_expired_cannot_take_a_workspace(client: redis.Redis) -> None:
    claim = claimed(client)
    client.delete(KEYS.lease(claim.run.id))
    leases = WorkspaceLeases(RunStore(client, KEYS))
    assert leases.acquire(WS, claim.run.id, claim.token, datetime.now(UTC)) == Acquired()
    assert_not_taken(client, claim.run.id)


def test_a_token_that_is_no_longer_the_runs_lease_cannot_take_a_workspace_and_the_current_one_can(
    client: redis.Redis,
) -> None:
    claim = claimed(client)
    store = RunStore(client, KEYS)
    # Recovered (its worker died), then the row's next attempt claimed: the lease is the new attempt's now.
    assert store.abandon(claim.run.id, datetime.now(UTC), error="worker gone", seen_lease=claim.token) is not None
    retry = store.claim(claim.loop.id, SLOT, Owner("worker:b", "host-b", 2), datetime.now(UTC))
    assert isinstance(retry, Claim) and retry.run.id == claim.run.id and retry.run.attempt == 2, retry
    leases = WorkspaceLeases(store)

    assert leases.acquire(WS, claim.run.id, claim.token, datetime.now(UTC)) == Acquired()  # the old attempt's
    assert_not_taken(client, claim.run.id)
    assert store.lease_token(claim.run.id) == retry.token

    got = leases.acquire(WS, retry.run.id, retry.token, datetime.now(UTC))
    assert got.run is not None and (got.run.workspace, got.run.workspace_fence, got.run.attempt) == (WS, 1, 2)
    assert client.get(KEYS.workspace(WS)) == f"{retry.run.id}|{retry.token}|1"


def test_a_holder_whose_own_lease_is_gone_cannot_take_a_workspace(client: redis.Redis) -> None:
    leases = WorkspaceLeases(RunStore(client, KEYS))
    holder = "step:wr1:a"
    assert leases.take_own_lease(holder, "t1", 10_000)
    client.delete(KEYS.lease(holder))  # expired
    assert leases.acquire_as(WS, holder, "t1", datetime.now(UTC)) == (None, None)
    assert client.get(KEYS.workspace(WS)) is None
    assert leases.take_own_lease(holder, "t2", 10_000)  # taken again, under another token
    assert leases.acquire_as(WS, holder, "t1", datetime.now(UTC)) == (None, None)
    assert client.get(KEYS.workspace(WS)) is None
    assert leases.acquire_as(WS, holder, "t2", datetime.now(UTC)) == (1, None)
