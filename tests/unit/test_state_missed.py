"""Missed slots in Redis: one row per streak, coalesced, each record one transition with one change; the counter
per kind; backfill of a missed slot; the history window. Run on fakeredis and on the real server (``client``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from loopsq.domain import missed
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import to_iso, to_ms
from loopsq.errors import ValidationError
from loopsq.state import run_codec
from loopsq.state.backfills import claim_backfill
from loopsq.state.commit import Tx
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.missed import RECENT
from loopsq.state.retention import Retention, Windows
from loopsq.state.runs import Claim, Owner, Refusal, RunStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = Owner("worker:a", "host-a", 100)
LATEST = missed.Reason("catch_up", "catch-up latest skipped it")
NO_WORKER = missed.Reason("no_free_worker", "no free worker for 42s")


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.fixture
def store(client: redis.Redis) -> RunStore:
    return RunStore(client, KEYS)


def make_loop(client: redis.Redis, **policies: Any) -> str:
    body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 60_000},
            "target": {"type": "command", "command": "true"}, **policies}
    return LoopStore(client, KEYS).create(new_loop(body, T0 - timedelta(minutes=1))).id


def changes(client: redis.Redis) -> list[tuple[str, dict[str, Any]]]:
    return [(f["type"], json.loads(f["data"])) for _, f in client.xrange(KEYS.changes)]


def record(store: RunStore, loop_id: str, first: float, last: float, count: int, reason: missed.Reason = LATEST,
           now: float = 100) -> Any:
    return store.record_missed(loop_id, at(first), at(last), count, reason.kind, reason.text, at(now))


def runs_of(client: redis.Redis, loop_id: str) -> list[str]:
    return list(client.zrange(KEYS.loop_runs(loop_id), 0, -1))


def test_a_streak_becomes_one_missed_row_in_one_transition_with_one_change(client: redis.Redis,
                                                                           store: RunStore) -> None:
    loop_id = make_loop(client)
    before = len(changes(client))
    row = record(store, loop_id, 0, 13, 14, NO_WORKER)
    assert row is not None
    stored = store.get(row.id)
    assert stored == row
    assert row.to_dict() == {
        "id": row.id, "loopId": loop_id, "loopName": "l", "scheduledFor": to_iso(at(0)), "attempt": 1,
        "status": "missed", "createdAt": to_iso(at(100)), "updatedAt": to_iso(at(100)),
        "finishedAt": to_iso(at(100)), "error": "no free worker for 42s", "source": "scheduled",
        "missedLast": to_iso(at(13)), "missedCount": 14, "missedKind": "no_free_worker",
    }
    after = changes(client)[before:]
    assert after == [("run_missed", {"upsert": {"loop_runs": [row.to_dict()]}})]
    assert client.hgetall(KEYS.missed_counts) == {"no_free_worker": "14"}
    # It holds its first slot (the mirror's UNIQUE(loop_id, scheduled_for)), and only that one: Redis keeps one
    # field per row, not one per slot.
    assert client.hgetall(KEYS.slots(loop_id)) == {to_iso(at(0)): row.id}
    assert runs_of(client, loop_id) == [row.id] and client.zscore(KEYS.runs, row.id) == to_ms(at(100))
    assert client.zscore(KEYS.retention_due, f"loop:{loop_id}") == to_ms(at(100))


def test_the_next_streak_of_the_same_kind_extends_the_newest_row(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    first = record(store, loop_id, 0, 3, 4, now=5)
    before = len(changes(client))
    second = record(store, loop_id, 4, 9, 6, missed.Reason("catch_up", "catch-up none skipped it"), now=10)
    assert second.id == first.id
    assert (second.scheduled_for, second.missed_last, second.missed_count) == (to_iso(at(0)), to_iso(at(9)), 10)
    assert (second.error, second.updated_at, second.created_at) == ("catch-up none skipped it", to_iso(at(10)),
                                                                    to_iso(at(5)))
    assert store.get(first.id) == second
    assert changes(client)[before:] == [("run_missed", {"also": ["missed_extended"],
                                                        "upsert": {"loop_runs": [second.to_dict()]}})]
    assert runs_of(client, loop_id) == [first.id]
    assert client.hgetall(KEYS.missed_counts) == {"catch_up": "10"}


def test_a_streak_of_another_kind_starts_a_new_row(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    first = record(store, loop_id, 0, 3, 4, now=5)
    other = record(store, loop_id, 4, 5, 2, NO_WORKER, now=10)
    assert other.id != first.id
    assert (other.scheduled_for, other.missed_count, other.missed_kind) == (to_iso(at(4)), 2, "no_free_worker")
    assert store.get(first.id) == first  # untouched
    assert runs_of(client, loop_id) == [first.id, other.id]
    assert client.hgetall(KEYS.missed_counts) == {"catch_up": "4", "no_free_worker": "2"}


def test_a_real_run_in_between_starts_a_new_streak(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    first = record(store, loop_id, 0, 3, 4, now=4)
    claim = store.claim(loop_id, at(4), OWNER, at(4.5))
    assert isinstance(claim, Claim)
    later = record(store, loop_id, 5, 8, 4, now=9)
    assert later.id != first.id and store.get(first.id) == first
    assert runs_of(client, loop_id) == [first.id, claim.run.id, later.id]
    assert client.hgetall(KEYS.missed_counts) == {"catch_up": "8"}


def test_a_repeated_record_changes_nothing(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    row = record(store, loop_id, 0, 3, 4)
    before = client.xlen(KEYS.changes)
    assert record(store, loop_id, 0, 3, 4) == row  # a retry after a lost reply, a duplicate fire
    assert record(store, loop_id, 2, 3, 2) == row
    # ... also once a real run came after it: its first slot is held by the missed row already.
    assert isinstance(store.claim(loop_id, at(4), OWNER, at(101)), Claim)
    after_claim = client.xlen(KEYS.changes)
    assert record(store, loop_id, 0, 3, 4, now=102) == row
    assert client.xlen(KEYS.changes) == after_claim == before + 1
    # ... and however many runs came since: its first slot is the missed row's.
    for i in range(RECENT):
        assert isinstance(store.claim(loop_id, at(50 + i), OWNER, at(103 + i), source="ad_hoc"), Claim)
    many = client.xlen(KEYS.changes)
    assert record(store, loop_id, 0, 3, 4, now=120) == row
    assert client.xlen(KEYS.changes) == many
    assert client.hgetall(KEYS.missed_counts) == {"catch_up": "4"}


def test_a_duplicate_of_a_coalesced_streak_is_recognised_after_a_run_came_in_between(client: redis.Redis,
                                                                                     store: RunStore) -> None:
    loop_id = make_loop(client)
    row = record(store, loop_id, 0, 3, 4, now=4)
    extended = record(store, loop_id, 4, 6, 3, now=7)  # (its first slot, 4, is not in keys.slots: the row holds 0)
    assert isinstance(store.claim(loop_id, at(7), OWNER, at(7.5)), Claim)
    before = client.xlen(KEYS.changes)
    assert record(store, loop_id, 4, 6, 3, now=8) == extended  # a second worker's fire of the same slots
    assert client.xlen(KEYS.changes) == before and runs_of(client, loop_id)[0] == row.id
    assert client.hgetall(KEYS.missed_counts) == {"catch_up": "7"}


def test_slots_that_have_a_row_already_are_not_counted_missed(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    claim = claim_backfill(store, loop_id, at(0), OWNER, at(50))
    assert isinstance(claim, Claim)
    row = record(store, loop_id, 0, 3, 4)
    assert (row.scheduled_for, row.missed_last, row.missed_count) == (to_iso(at(1)), to_iso(at(3)), 3)
    assert client.hgetall(KEYS.missed_counts) == {"catch_up": "3"}


def test_a_coalescing_record_never_extends_over_a_run_created_after_it_read(
        client: redis.Redis, store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    loop_id = make_loop(client)
    first = record(store, loop_id, 0, 3, 4, now=4)
    real_read = run_codec.read_many
    raced: list[str] = []

    def read_then_race(conn: Any, keys: list[str]) -> Any:
        value = real_read(conn, keys)
        if KEYS.run(first.id) in keys and not raced:  # the newest row was just read: a run is claimed meanwhile
            raced.append("")
            claim = claim_backfill(store, loop_id, at(4), OWNER, at(4.5))  # (which leaves the loop as it is)
            assert isinstance(claim, Claim)
            raced[0] = claim.run.id
        return value

    monkeypatch.setattr(run_codec, "read_many", read_then_race)
    later = record(store, loop_id, 5, 8, 4, now=9)
    assert later.id != first.id and store.get(first.id) == first
    assert runs_of(client, loop_id) == [first.id, raced[0], later.id]


def test_bad_streaks_and_kinds_are_refused_and_change_nothing(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    before = client.xlen(KEYS.changes)
    with pytest.raises(ValidationError) as kind:
        store.record_missed(loop_id, at(0), at(1), 2, "bored", "x", at(5))
    assert str(kind.value) == ("missed kind must be one of catch_up, no_free_worker, no_worker_labels, "
                               "no_scheduler, stalled, got 'bored'")
    with pytest.raises(ValidationError) as none:
        store.record_missed(loop_id, at(0), at(1), 0, "catch_up", "x", at(5))
    assert str(none.value) == ("a missed streak needs count >= 1 and last >= first, got 0 slot(s) from "
                               "2026-01-01T00:00:00.000Z to 2026-01-01T00:01:00.000Z")
    with pytest.raises(ValidationError) as backwards:
        store.record_missed(loop_id, at(2), at(1), 1, "catch_up", "x", at(5))
    assert "got 1 slot(s) from 2026-01-01T00:02:00.000Z to 2026-01-01T00:01:00.000Z" in str(backwards.value)
    assert client.xlen(KEYS.changes) == before and not client.exists(KEYS.missed_counts)


def test_a_removed_loop_records_nothing(client: redis.Redis, store: RunStore) -> None:
    assert store.record_missed("nope", at(0), at(1), 2, "catch_up", "x", at(5)) is None
    assert not client.exists(KEYS.missed_counts)


# -- real runs of missed slots -------------------------------------------------------------------------------------
def test_no_scheduled_or_manual_claim_reruns_a_missed_slot(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    row = record(store, loop_id, 0, 3, 4)
    refused = store.claim(loop_id, at(0), OWNER, at(100))
    assert isinstance(refused, Refusal) and refused.reason == "done" and refused.run == row
    assert isinstance(store.claim(loop_id, at(0), OWNER, at(100), source="retry_slot"), Refusal)


def test_a_backfill_of_a_missed_slot_runs_it_and_the_streak_moves_on(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    row = record(store, loop_id, 0, 3, 4)
    before = len(changes(client))
    claim = claim_backfill(store, loop_id, at(0), OWNER, at(200))
    assert isinstance(claim, Claim) and claim.run.id != row.id
    moved = store.get(row.id)
    assert moved is not None
    assert (moved.scheduled_for, moved.missed_last, moved.missed_count) == (to_iso(at(1)), to_iso(at(3)), 3)
    assert client.hgetall(KEYS.slots(loop_id)) == {to_iso(at(0)): claim.run.id, to_iso(at(1)): row.id}
    [(kind, data)] = changes(client)[before:]
    # One change: the row moves off the slot before the run takes it (mirrors apply upserts in order).
    assert kind == "run_claimed"
    assert [(r["id"], r["scheduledFor"]) for r in data["upsert"]["loop_runs"]] == [
        (row.id, to_iso(at(1))), (claim.run.id, to_iso(at(0)))]
    # An inner slot needs nothing from the row; the streak's count is what was missed then.
    inner = claim_backfill(store, loop_id, at(2), OWNER, at(201))
    assert isinstance(inner, Claim) and store.get(row.id) == moved
    # The front again: it steps over the slot that has its run now.
    assert isinstance(claim_backfill(store, loop_id, at(1), OWNER, at(202)), Claim)
    last = store.get(row.id)
    assert last is not None and (last.scheduled_for, last.missed_count) == (to_iso(at(3)), 1)
    # Its last slot: the row goes (every slot it stood for has a run).
    final = claim_backfill(store, loop_id, at(3), OWNER, at(203))
    assert isinstance(final, Claim)
    assert store.get(row.id) is None and row.id not in runs_of(client, loop_id)
    assert changes(client)[-1][1]["delete"] == {"loop_runs": [row.id]}
    assert client.hget(KEYS.slots(loop_id), to_iso(at(3))) == final.run.id
    assert client.hgetall(KEYS.missed_counts) == {"catch_up": "4"}  # a counter of what was missed: it stays


def test_an_ad_hoc_run_steps_around_a_missed_slot(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client)
    row = record(store, loop_id, 0, 3, 4)
    refused = store.claim(loop_id, at(0), OWNER, at(100), source="ad_hoc")
    assert isinstance(refused, Refusal) and refused.reason == "done"  # the runner moves an ad-hoc slot 1 ms on
    assert store.get(row.id) == row


# -- the history window --------------------------------------------------------------------------------------------
def test_a_missed_row_is_trimmed_with_the_loop_s_window_and_frees_its_slot(client: redis.Redis,
                                                                         store: RunStore) -> None:
    loop_id = make_loop(client, keepRuns=1)
    row = record(store, loop_id, 0, 3, 4, now=3.5)
    claim = store.claim(loop_id, at(4), OWNER, at(4))
    assert isinstance(claim, Claim)
    assert store.finalize(claim.run.id, claim.token, at(4.1), status="succeeded", exit_code=0, duration_ms=1,
                          stdout="", stderr="", error=None, pid=None) is not None
    report = Retention(client, KEYS).trim_due(at(5), Windows(keep_runs=100, keep_workflow_runs=100))
    assert report.trimmed_ids == [row.id]
    assert store.get(row.id) is None and runs_of(client, loop_id) == [claim.run.id]
    assert client.hget(KEYS.slots(loop_id), to_iso(at(0))) is None
    assert changes(client)[-1] == ("runs_trimmed", {"trim": {"loop_runs": [row.id]}})


# -- the guards the records rely on --------------------------------------------------------------------------------
def test_the_top_guard_and_the_counter_op_are_atomic_with_the_change(client: redis.Redis, store: RunStore) -> None:
    client.zadd("z", {"a": 1, "b": 2})
    refused = store.committer.commit(Tx("t", "now").expect_top("z", "a").hincrby("h", "k", 3).put("loops", {"id": "x"}))
    assert (refused.ok, refused.failed_guard) == (False, 0)
    assert not client.exists("h") and client.xlen(KEYS.changes) == 0
    assert store.committer.commit(Tx("t", "now").expect_top("z", "b").hincrby("h", "k", 3)).ok
    assert store.committer.commit(Tx("t", "now").expect_top("empty", None).hincrby("h", "k", 2)).ok
    assert not store.committer.commit(Tx("t", "now").expect_top("z", None)).ok
    assert client.hget("h", "k") == "5" and client.xlen(KEYS.changes) == 2


def test_a_record_that_lost_a_race_counts_its_slots_once_when_it_tries_again(
        client: redis.Redis, store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    loop_id = make_loop(client)
    assert isinstance(claim_backfill(store, loop_id, at(0), OWNER, at(50)), Claim)  # slot 0 has its run
    real_commit = store.committer.commit
    tries: list[int] = []

    def commit_after_a_change(tx: Tx, **kw: Any) -> Any:
        if tx.type == "run_missed" and not tries:  # the loop changes between the read and the commit
            tries.append(1)
            LoopStore(client, KEYS).update(loop_id, "loop_updated", at(99),
                                           lambda loop: loop.with_changes(description="moved"))
        return real_commit(tx, **kw)

    monkeypatch.setattr(store.committer, "commit", commit_after_a_change)
    row = record(store, loop_id, 0, 3, 4)
    assert tries and (row.scheduled_for, row.missed_count) == (to_iso(at(1)), 3)
    assert client.hgetall(KEYS.missed_counts) == {"catch_up": "3"}
