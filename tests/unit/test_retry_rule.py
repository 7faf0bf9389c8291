"""One retry rule for every run of a loop (scheduled, run-now, trigger) unless no retry is asked, retries that
queue behind a pending one, and the re-run after a worker shutdown that is not an attempt (issue 18, 8 and 10):
the pure rules, then the claims in Redis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from loopsq.domain import lifecycle
from loopsq.domain import run_rules as rules
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import to_iso
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, Refusal, RunStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = Keys()
W1 = Owner("worker:a", "host-a", 100)
W2 = Owner("worker:b", "host-b", 200)
EVERY_MIN = {"type": "interval", "everyMs": 60_000}


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def loop_at(schedule: dict[str, Any] = EVERY_MIN, **policies: Any) -> Loop:
    body = {"name": "l", "timezone": "UTC", "schedule": schedule, "target": {"type": "command", "command": "true"},
            **policies}
    return new_loop(body, T0)


def run_of(slot: datetime, status: str, *, source: str = "scheduled", attempt: int = 1, error: str | None = "boom",
           **fields: Any) -> LoopRun:
    return LoopRun(id="r1", loop_id="l", loop_name="l", scheduled_for=to_iso(slot), attempt=attempt, status=status,
                   created_at=to_iso(slot), updated_at=to_iso(slot), source=source,
                   error=None if status == "succeeded" else error, **fields)


@pytest.mark.parametrize("source", ["scheduled", "ad_hoc", "trigger", "due_slot", "retry_slot"])
def test_a_failed_run_of_any_source_is_retried_while_attempts_are_left(source: str) -> None:
    loop = loop_at(maxAttempts=3, retryDelayMs=5000)
    advance = rules.after_finish(loop, run_of(at(0.3), "failed", source=source), at(0.4))
    assert advance.transition == "retry_scheduled"
    assert (advance.loop.retry_scheduled_for, advance.loop.retry_at) == (to_iso(at(0.3)), to_iso(at(0.4) + timedelta(seconds=5)))
    assert advance.loop.next_run_at == loop.next_run_at  # the regular slot keeps its time


@pytest.mark.parametrize("source", ["scheduled", "ad_hoc", "trigger", "due_slot"])
def test_no_retry_settles_the_slot_at_once(source: str) -> None:
    loop = loop_at(maxAttempts=3)
    advance = rules.after_finish(loop, run_of(at(1), "failed", source=source, no_retry=True), at(1.1))
    assert advance.transition != "retry_scheduled"
    assert advance.loop.retry_scheduled_for is None


@pytest.mark.parametrize("source", ["ad_hoc", "trigger"])
@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_a_settled_manual_run_moves_nothing_and_counts_in_no_streak(source: str, status: str) -> None:
    loop = loop_at(maxAttempts=1, pauseAfterFailures=1)
    assert rules.after_finish(loop, run_of(at(0.3), status, source=source), at(0.4)) == rules.Advance(loop, "none")


def test_a_run_of_a_paused_loop_is_not_retried() -> None:
    loop = loop_at(maxAttempts=3).with_changes(status="paused")
    assert rules.after_finish(loop, run_of(at(0.3), "failed", source="ad_hoc"), at(0.4)).transition == "none"


def test_a_second_failure_queues_behind_the_pending_retry_instead_of_replacing_it() -> None:
    loop = loop_at(maxAttempts=2, retryDelayMs=1000)
    first = rules.after_finish(loop, run_of(at(1), "failed"), at(1.1)).loop
    second = rules.after_finish(first, run_of(at(1.5), "failed", source="ad_hoc"), at(1.6)).loop
    assert second.retry_scheduled_for == to_iso(at(1))
    assert second.retry_queue == [{"slot": to_iso(at(1.5)), "at": to_iso(at(1.6) + timedelta(seconds=1))}]
    # Taking the pending retry makes the queued one pending.
    taken = rules.after_claim(second, at(1), at(1.2), is_retry=True)
    assert (taken.retry_scheduled_for, taken.retry_queue) == (to_iso(at(1.5)), None)
    assert rules.due(taken, at(2)) == [at(1.5)]
    done = rules.after_claim(taken, at(1.5), at(2), is_retry=True)
    assert (done.retry_scheduled_for, done.retry_at, done.retry_queue) == (None, None, None)


def test_the_queue_is_bounded_and_a_stop_clears_it() -> None:
    loop = loop_at(maxAttempts=2).with_changes(retry_scheduled_for=to_iso(at(0)), retry_at=to_iso(at(0)))
    for i in range(rules.RETRY_QUEUE_MAX + 5):
        loop = rules.with_retry(loop, to_iso(at(1 + i)), to_iso(at(1 + i)), to_iso(at(1 + i)))
    assert len(loop.retry_queue or []) == rules.RETRY_QUEUE_MAX
    assert (loop.retry_queue or [])[0]["slot"] == to_iso(at(6))  # the oldest were dropped
    assert lifecycle.stop(loop, at(500)).retry_queue is None


def test_a_run_given_up_by_a_shutdown_is_re_run_at_once_even_with_its_attempts_used() -> None:
    loop = loop_at(maxAttempts=1)
    ended = run_of(at(1), "abandoned", error=rules.SHUTDOWN_ERROR)
    advance = rules.after_finish(loop, ended, at(1.5))
    assert (advance.transition, advance.loop.retry_scheduled_for, advance.loop.retry_at) == (
        "retry_scheduled", to_iso(at(1)), to_iso(at(1.5)))
    assert rules.may_run_again(ended, loop)
    again = rules.next_attempt(ended, to_iso(at(1.6)))
    assert (again.attempt, again.rerun, again.status) == (1, 1, "running")  # not attempt 2 of an --attempts 1 loop
    assert rules.attempt_label(again.attempt, again.rerun) == "attempt 1 (re-run after shutdown)"
    assert rules.attempt_label(1, 2) == "attempt 1 (re-run 2 after shutdown)"
    assert rules.attempt_label(3, None) == "attempt 3"
    # A shutdown re-run happens even when no retry was asked for: it did not fail.
    assert rules.may_run_again(run_of(at(1), "abandoned", error=rules.SHUTDOWN_ERROR, no_retry=True), loop)


def test_a_failure_after_a_re_run_is_the_next_attempt() -> None:
    loop = loop_at(maxAttempts=2)
    failed = run_of(at(1), "failed", rerun=1)
    assert rules.may_run_again(failed, loop)
    again = rules.next_attempt(failed, to_iso(at(2)))
    assert (again.attempt, again.rerun) == (2, None)
    assert again.previous_attempts == [{"attempt": 1, "status": "failed", "error": "boom", "rerun": 1}]
    assert not rules.may_run_again(run_of(at(1), "failed", attempt=2), loop)
    assert not rules.may_run_again(run_of(at(1), "failed", no_retry=True), loop)


# -- the claims in Redis --------------------------------------------------------------------------------------
@pytest.fixture
def store(client: redis.Redis) -> RunStore:
    return RunStore(client, KEYS)


def make_loop(client: redis.Redis, **policies: Any) -> str:
    body = {"name": "l", "timezone": "UTC", "schedule": EVERY_MIN, "target": {"type": "command", "command": "true"},
            **policies}
    return LoopStore(client, KEYS).create(new_loop(body, T0)).id


def finish(store: RunStore, claim: Claim, status: str, when: datetime, error: str | None = "boom") -> object:
    return store.finalize(claim.run.id, claim.token, when, status=status, exit_code=0 if status == "succeeded" else 1,
                          duration_ms=5, stdout="", stderr="", error=None if status == "succeeded" else error, pid=None)


def test_a_failed_ad_hoc_run_is_retried_by_the_schedule_as_an_ad_hoc_run(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client, maxAttempts=2)
    before = LoopStore(client, KEYS).get(loop_id)
    first = store.claim(loop_id, at(0.3), W1, at(0.3), source="ad_hoc")
    assert isinstance(first, Claim)
    assert finish(store, first, "failed", at(0.4)) is not None
    pending = LoopStore(client, KEYS).get(loop_id)
    assert pending is not None and before is not None
    assert pending.retry_scheduled_for == to_iso(at(0.3)) and pending.next_run_at == before.next_run_at
    # The timer fires the retry as a scheduled claim; the row stays an ad-hoc run, and its end moves nothing.
    retry = store.claim(loop_id, at(0.3), W2, at(1.5), source="scheduled")
    assert isinstance(retry, Claim)
    assert (retry.run.attempt, retry.run.source, retry.run.id) == (2, "ad_hoc", first.run.id)
    assert retry.loop.retry_scheduled_for is None and retry.loop.next_run_at == before.next_run_at
    done = finish(store, retry, "failed", at(1.6))
    assert done is not None
    after = LoopStore(client, KEYS).get(loop_id)
    assert after is not None and (after.next_run_at, after.retry_scheduled_for, after.failure_streak) == (
        before.next_run_at, None, 0)


def test_a_no_retry_run_is_never_claimed_again(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client, maxAttempts=3)
    claim = store.claim(loop_id, at(0.3), W1, at(0.3), source="ad_hoc", retry=False)
    assert isinstance(claim, Claim) and claim.run.no_retry is True
    finish(store, claim, "failed", at(0.4))
    loop = LoopStore(client, KEYS).get(loop_id)
    assert loop is not None and loop.retry_scheduled_for is None
    refused = store.claim(loop_id, at(0.3), W2, at(1), source="scheduled")
    assert isinstance(refused, Refusal) and refused.reason == "exhausted"


def test_a_shutdown_re_run_keeps_its_attempt_and_is_claimed_once_under_its_own_key(
    client: redis.Redis, store: RunStore
) -> None:
    loop_id = make_loop(client, maxAttempts=1)
    slot = to_iso(at(1))
    first = store.claim(loop_id, at(1), W1, at(1))
    assert isinstance(first, Claim)
    finish(store, first, "abandoned", at(1.2), error=rules.SHUTDOWN_ERROR)
    winner = store.claim(loop_id, at(1), W2, at(1.3))
    loser = store.claim(loop_id, at(1), W1, at(1.3))
    assert isinstance(winner, Claim) and isinstance(loser, Refusal)
    assert (winner.run.attempt, winner.run.rerun) == (1, 1)
    assert client.get(KEYS.claim(loop_id, slot, 1, 1)) == winner.token
    assert KEYS.claim(loop_id, slot, 1, 1) == f"loopsq:claim:{loop_id}:{slot}:1:rerun:1"
    assert client.get(KEYS.claim(loop_id, slot, 1)) is None  # a settled attempt's claim key goes (its row guards)
    assert winner.run.previous_attempts is not None
    assert winner.run.previous_attempts[0]["error"] == rules.SHUTDOWN_ERROR
    # A second shutdown: a second re-run, still attempt 1; then a failure settles the slot (attempts used up).
    finish(store, winner, "abandoned", at(1.4), error=rules.SHUTDOWN_ERROR)
    again = store.claim(loop_id, at(1), W1, at(1.5))
    assert isinstance(again, Claim) and (again.run.attempt, again.run.rerun) == (1, 2)
    finish(store, again, "failed", at(1.6))
    assert isinstance(store.claim(loop_id, at(1), W2, at(1.7)), Refusal)


def test_a_re_run_whose_claim_reply_was_lost_is_recognised_as_won(client: redis.Redis, store: RunStore) -> None:
    loop_id = make_loop(client, maxAttempts=1)
    first = store.claim(loop_id, at(1), W1, at(1))
    assert isinstance(first, Claim)
    finish(store, first, "abandoned", at(1.2), error=rules.SHUTDOWN_ERROR)
    rerun = store.claim(loop_id, at(1), W2, at(1.3), nonce="n-rerun")
    assert isinstance(rerun, Claim) and rerun.run.rerun == 1
    won = store.won_claim(loop_id, at(1), "n-rerun")  # what the claimer asks when Redis lost its reply
    assert won is not None and (won.run.id, won.token) == (rerun.run.id, rerun.token)
    assert store.won_claim(loop_id, at(1), "someone-else") is None
