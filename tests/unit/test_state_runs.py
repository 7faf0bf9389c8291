"""Run transitions in Redis: claims (SET NX per slot attempt), fenced leases, finalize, skip, abandon."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import to_iso
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, Refusal, RunStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
W1 = Owner("worker:a", "host-a", 100)
W2 = Owner("worker:b", "host-b", 200)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def store(client: redis.Redis) -> RunStore:
    return RunStore(client, KEYS)


def make_loop(client: redis.Redis, **policies: object) -> str:
    body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 10_000},
            "target": {"type": "command", "command": "true"}, **policies}
    return LoopStore(client, KEYS).create(new_loop(body, T0)).id


def types(client: redis.Redis) -> list[str]:
    return [f["type"] for _, f in client.xrange(KEYS.changes)]


def finish(store: RunStore, claim: Claim, status: str, when: datetime) -> object:
    return store.finalize(claim.run.id, claim.token, when, status=status, exit_code=0 if status == "succeeded" else 1,
                          duration_ms=5, stdout="out", stderr="", error=None if status == "succeeded" else "boom",
                          pid=None)


def test_only_one_claimer_wins_a_slot_attempt(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    first = store.claim(loop_id, at(10), W1, at(10))
    second = store.claim(loop_id, at(10), W2, at(10))
    assert isinstance(first, Claim)
    assert isinstance(second, Refusal) and second.reason == "running"
    assert first.run.attempt == 1 and first.run.status == "running"
    assert client.get(KEYS.claim(loop_id, to_iso(at(10)), 1)) == first.token
    assert client.get(KEYS.lease(first.run.id)) == first.token
    # The lease key outlives the lease by one renewal period (a minute at most): an outage shorter than the lease
    # never expires it.
    assert 1_800_000 < client.pttl(KEYS.lease(first.run.id)) <= 1_800_000 + 60_000
    assert client.smembers(KEYS.running) == {first.run.id}


def test_a_fixed_rate_claim_moves_the_loop_in_the_same_transition(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    claim = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(claim, Claim)
    assert claim.loop.next_run_at == to_iso(at(20))
    assert types(client) == ["loop_created", "run_claimed"]
    data = json.loads(client.xrange(KEYS.changes)[-1][1]["data"])
    assert data["also"] == ["loop_advanced"]
    assert data["upsert"]["loops"][0]["nextRunAt"] == to_iso(at(20))


def test_finalize_records_the_outcome_and_releases_the_lease(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    claim = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(claim, Claim)
    done = finish(store, claim, "succeeded", at(11))
    assert done is not None
    final = store.get(claim.run.id)
    assert final is not None and final.status == "succeeded" and final.stdout == "out"
    assert final.lease_expires_at is None
    assert client.exists(KEYS.lease(claim.run.id)) == 0
    assert client.smembers(KEYS.running) == set()
    assert isinstance(store.claim(loop_id, at(10), W2, at(12)), Refusal)


def test_a_worker_that_lost_its_lease_writes_nothing(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    claim = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(claim, Claim)
    client.delete(KEYS.lease(claim.run.id))  # the lease expired
    before = (client.get(KEYS.run(claim.run.id)), client.xlen(KEYS.changes))
    assert finish(store, claim, "succeeded", at(11)) is None
    assert not store.renew_lease(claim.run.id, claim.token, 30_000, at(11))
    assert store.mark_started(claim.run.id, claim.token, at(11), pid=1, pid_start_time=None, host="h") is None
    assert (client.get(KEYS.run(claim.run.id)), client.xlen(KEYS.changes)) == before


def test_renewal_extends_only_the_owners_lease(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client, leaseMs=5_000)
    claim = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(claim, Claim)
    assert store.renew_lease(claim.run.id, claim.token, 60_000, at(11))
    assert client.pttl(KEYS.lease(claim.run.id)) > 5_000
    assert store.get(claim.run.id).lease_expires_at == to_iso(at(71))  # type: ignore[union-attr]
    assert not store.renew_lease(claim.run.id, "someone-else", 60_000, at(11))


def test_a_failed_slot_is_retried_as_the_next_attempt_on_the_same_row(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client, maxAttempts=2, retryDelayMs=5_000)
    first = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(first, Claim)
    _final, loop = finish(store, first, "failed", at(11))  # type: ignore[misc]
    assert loop.retry_scheduled_for == to_iso(at(10)) and loop.retry_at == to_iso(at(16))
    retry = store.claim(loop_id, at(10), W2, at(16))
    assert isinstance(retry, Claim)
    assert (retry.run.id, retry.run.attempt) == (first.run.id, 2)
    assert retry.loop.retry_scheduled_for is None
    assert client.get(KEYS.claim(loop_id, to_iso(at(10)), 2)) == retry.token
    finish(store, retry, "failed", at(17))
    exhausted = store.claim(loop_id, at(10), W1, at(30))
    assert isinstance(exhausted, Refusal) and exhausted.reason == "exhausted"


def test_abandon_marks_the_run_and_schedules_the_retry(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client, maxAttempts=2)
    claim = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(claim, Claim)
    done = store.abandon(claim.run.id, at(20), error="worker worker:a died before completion", seen_lease=claim.token)
    assert done is not None
    final, loop = done
    assert (final.status, final.error) == ("abandoned", "worker worker:a died before completion")
    assert loop is not None and loop.retry_scheduled_for == to_iso(at(10))
    assert types(client)[-1] == "run_abandoned"


def test_abandon_leaves_a_run_whose_lease_changed_since_it_was_seen(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    claim = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(claim, Claim)
    assert store.abandon(claim.run.id, at(20), error="x", seen_lease=None) is None
    assert store.get(claim.run.id).status == "running"  # type: ignore[union-attr]


def test_an_overlap_skip_records_a_skipped_run_and_moves_the_loop(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    skipped = store.skip(loop_id, at(10), at(10))
    assert skipped is not None
    assert (skipped.status, skipped.error, skipped.attempt) == ("skipped", "previous run still active", 1)
    assert LoopStore(client, KEYS).get(loop_id).next_run_at == to_iso(at(20))  # type: ignore[union-attr]


def test_an_overlap_skip_never_swallows_a_slot_awaiting_its_retry(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client, maxAttempts=3)
    claim = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(claim, Claim)
    finish(store, claim, "failed", at(11))
    assert store.skip(loop_id, at(10), at(12)) is None
    row = store.get(claim.run.id)
    assert row is not None and row.status == "failed"
    assert LoopStore(client, KEYS).get(loop_id).retry_scheduled_for == to_iso(at(10))  # type: ignore[union-attr]


def test_a_settled_due_slot_moves_the_loop_past_it_instead_of_sticking(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    claim = store.claim(loop_id, at(10), W1, at(10), source="ad_hoc")
    assert isinstance(claim, Claim)
    finish(store, claim, "succeeded", at(10))
    refused = store.claim(loop_id, at(10), W2, at(11))
    assert isinstance(refused, Refusal) and refused.reason == "done"
    moved = store.advance_past(loop_id, at(10), at(11))
    assert moved is not None and moved.next_run_at == to_iso(at(20))


def test_a_cancel_request_is_visible_to_the_executor(client: redis.Redis, store: RunStore) -> None:
    store.request_cancel("r1", "cancelled by user")
    assert store.cancel_reason("r1") == "cancelled by user"


def test_a_run_is_listed_under_its_host_from_its_claim_until_it_ends(
    client: redis.Redis, store: RunStore
) -> None:
    """From the claim on, before any process: its host's worker reaps it should its worker die meanwhile."""
    loop_id = make_loop(client, maxAttempts=2)
    first = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(first, Claim)
    assert client.smembers(KEYS.host_runs("host-a")) == {first.run.id}  # claimed, no process yet
    assert store.mark_started(first.run.id, first.token, at(11), pid=7, pid_start_time=1.0, host="host-a")
    assert client.smembers(KEYS.host_runs("host-a")) == {first.run.id}
    assert store.abandon(first.run.id, at(20), error="worker worker:a died", seen_lease=first.token)
    assert client.smembers(KEYS.host_runs("host-a")) == set()
    # Its retry runs on another host: listed there, and gone from there when finalized.
    retry = store.claim(loop_id, at(10), W2, at(21))
    assert isinstance(retry, Claim) and retry.run.attempt == 2
    assert store.mark_started(retry.run.id, retry.token, at(22), pid=8, pid_start_time=2.0, host="host-b")
    assert client.smembers(KEYS.host_runs("host-b")) == {retry.run.id}
    assert finish(store, retry, "succeeded", at(23)) is not None
    assert client.smembers(KEYS.host_runs("host-b")) == set()


def test_a_retry_keeps_the_earlier_attempts_on_the_row(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client, maxAttempts=3)
    first = store.claim(loop_id, at(10), W1, at(10))
    assert isinstance(first, Claim)
    assert finish(store, first, "failed", at(11)) is not None
    second = store.claim(loop_id, at(10), W2, at(12))
    assert isinstance(second, Claim) and second.run.attempt == 2
    assert second.run.previous_attempts == [{
        "attempt": 1, "status": "failed", "error": "boom", "exitCode": 1, "startedAt": to_iso(at(10)),
        "finishedAt": to_iso(at(11)), "durationMs": 5, "workerId": "worker:a", "host": "host-a", "stdout": "out",
    }]
    assert finish(store, second, "succeeded", at(13)) is not None
    final = store.get(second.run.id)
    assert final is not None and final.status == "succeeded"
    assert [a["attempt"] for a in final.previous_attempts or []] == [1]
    row = json.loads(str(client.xrange(KEYS.changes)[-1][1]["data"]))["upsert"]["loop_runs"][0]
    assert row["previousAttempts"][0]["error"] == "boom"  # the mirror gets it with the row
