"""Claims under a race, at the store level, for every claim path: two claimers interleaved, the first stopped
between its reads and its commit while the second claims (or skips, or finishes) the same thing whole.

Each path's guard is what stands between the stopped claimer and a second win: the ``SET NX`` claim key of
``(loop, slot, attempt)``, the slot key (one row per slot), the run row (a reserved run id), the loop's JSON (a
claim that moves the loop), a trigger's and a workflow run's idempotency key. Where several guard the same race,
the race is also played where only one of them can (a slot claimed, finished and trimmed away; a skip of the
slot; a reserved run claimed at another slot).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import to_iso
from loopsq.engine import triggers
from loopsq.state.commit import CommitResult, Committer, Tx
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, Refusal, RunStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
A = Owner("worker:a", "host-a", 1)
B = Owner("worker:b", "host-b", 2)
EVERY_S = 10


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class Stopped(Committer):
    """A committer that, once, runs ``meanwhile`` after its claimer has read everything and before it commits."""

    def __init__(self, client: redis.Redis, meanwhile: Callable[[], Any]) -> None:
        super().__init__(client, KEYS)
        self.meanwhile: Callable[[], Any] | None = meanwhile
        self.outcome: Any = None

    def commit(self, tx: Tx, **options: Any) -> CommitResult:
        if self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            self.outcome = meanwhile()
        return super().commit(tx, **options)


def race(client: redis.Redis, first: Callable[[RunStore], Any], second: Callable[[RunStore], Any]) -> tuple[Any, Any]:
    """``first`` reads, stops; ``second`` runs whole; ``first`` commits. Returns both outcomes."""
    other = RunStore(client, KEYS)
    stopped = Stopped(client, lambda: second(other))
    result = first(RunStore(client, KEYS, stopped))
    assert stopped.meanwhile is None, "the first claimer never reached its commit"
    return result, stopped.outcome


def make_loop(client: redis.Redis, **policies: object) -> str:
    body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": EVERY_S * 1000},
            "target": {"type": "command", "command": "true"}, **policies}
    return LoopStore(client, KEYS).create(new_loop(body, T0)).id


def claims(client: redis.Redis) -> list[str]:
    """The change types of every claim recorded."""
    return [f["type"] for _, f in client.xrange(KEYS.changes) if f["type"] == "run_claimed"]


def one_winner(first: Any, second: Any) -> Claim:
    """Exactly one of the two claimed; the other was refused. Returns the winner."""
    won = [c for c in (first, second) if isinstance(c, Claim)]
    assert len(won) == 1 and any(isinstance(c, Refusal) for c in (first, second)), (first, second)
    return won[0]


def finish(store: RunStore, claim: Claim, status: str, when: datetime) -> None:
    assert store.finalize(claim.run.id, claim.token, when, status=status, exit_code=0 if status == "succeeded" else 1,
                          duration_ms=1, stdout="", stderr="", error=None if status == "succeeded" else "boom",
                          pid=None) is not None


@pytest.mark.parametrize("source", ["scheduled", "due_slot"])
def test_a_regular_slot_claimed_by_two_at_once_is_won_by_one(client: redis.Redis, source: str) -> None:
    loop_id = make_loop(client)
    slot = at(EVERY_S)
    first, second = race(client, lambda s: s.claim(loop_id, slot, A, at(EVERY_S), source=source),
                         lambda s: s.claim(loop_id, slot, B, at(EVERY_S), source=source))
    winner = one_winner(first, second)
    assert winner.run.worker_id == B.worker_id  # the one that was not stopped
    assert claims(client) == ["run_claimed"]
    assert client.hget(KEYS.slots(loop_id), to_iso(slot)) == winner.run.id
    assert client.zcard(KEYS.loop_runs(loop_id)) == 1
    assert LoopStore(client, KEYS).require(loop_id).next_run_at == to_iso(at(2 * EVERY_S))  # moved once


def test_a_retry_slot_claimed_by_two_at_once_is_won_by_one(client: redis.Redis) -> None:
    loop_id = make_loop(client, maxAttempts=3, retryDelayMs=1000)
    slot = at(EVERY_S)
    store = RunStore(client, KEYS)
    failed = store.claim(loop_id, slot, A, slot)
    assert isinstance(failed, Claim)
    finish(store, failed, "failed", at(EVERY_S + 1))
    first, second = race(client, lambda s: s.claim(loop_id, slot, A, at(EVERY_S + 2), source="retry_slot"),
                         lambda s: s.claim(loop_id, slot, B, at(EVERY_S + 2), source="retry_slot"))
    winner = one_winner(first, second)
    assert (winner.run.id, winner.run.attempt, winner.run.worker_id) == (failed.run.id, 2, B.worker_id)
    assert claims(client) == ["run_claimed", "run_claimed"]  # attempt 1, then attempt 2 once
    assert client.get(KEYS.claim(loop_id, to_iso(slot), 2)) == winner.token
    assert client.get(KEYS.claim(loop_id, to_iso(slot), 3)) is None


def test_an_ad_hoc_slot_claimed_by_two_at_once_is_won_by_one(client: redis.Redis) -> None:
    loop_id = make_loop(client)
    slot = at(3.5)  # run-now at this millisecond, asked twice
    first, second = race(client, lambda s: s.claim(loop_id, slot, A, slot, source="ad_hoc"),
                         lambda s: s.claim(loop_id, slot, B, slot, source="ad_hoc"))
    winner = one_winner(first, second)
    assert claims(client) == ["run_claimed"]
    assert client.hget(KEYS.slots(loop_id), to_iso(slot)) == winner.run.id
    assert client.smembers(KEYS.running) == {winner.run.id}


def test_a_triggered_run_claimed_by_two_workers_at_once_runs_once(client: redis.Redis) -> None:
    loop_id = make_loop(client)
    slot = at(4)
    first, second = race(client, lambda s: s.claim(loop_id, slot, A, slot, source="trigger", run_id="r1"),
                         lambda s: s.claim(loop_id, slot, B, slot, source="trigger", run_id="r1"))
    winner = one_winner(first, second)
    assert (winner.run.id, winner.run.worker_id) == ("r1", B.worker_id)
    assert claims(client) == ["run_claimed"]
    assert RunStore(client, KEYS).get("r1").worker_id == B.worker_id  # type: ignore[union-attr]


def test_a_triggered_run_claimed_at_another_slot_meanwhile_is_not_claimed_again(client: redis.Redis) -> None:
    # Its second executor moved one millisecond on (``_claim_ad_hoc``): the slots differ, the run row does not.
    loop_id = make_loop(client)
    first, second = race(client, lambda s: s.claim(loop_id, at(4.001), A, at(4), source="trigger", run_id="r1"),
                         lambda s: s.claim(loop_id, at(4), B, at(4), source="trigger", run_id="r1"))
    winner = one_winner(first, second)
    assert winner.run.scheduled_for == to_iso(at(4))
    assert claims(client) == ["run_claimed"]
    assert client.hget(KEYS.slots(loop_id), to_iso(at(4.001))) is None


@pytest.mark.parametrize("source", ["scheduled", "trigger"])
def test_a_slot_claimed_finished_and_trimmed_away_meanwhile_is_not_claimed_again(
    client: redis.Redis, source: str
) -> None:
    # A stale claimer of a slot whose rows were trimmed by retention meanwhile (slot key, run row and claim key
    # gone) is still refused: a regular slot because the loop has moved past it (``past``), a triggered run
    # because its claim consumed the trigger's request. (Two ad-hoc claims of one millisecond are two runs: the
    # engine moves the second 1 ms on anyway.)
    loop_id = make_loop(client)
    slot = at(EVERY_S)
    run_id = "r1" if source == "trigger" else None
    request = json.dumps({"loopId": loop_id, "at": to_iso(slot), "key": None}) if run_id else None
    if request is not None:
        client.set(KEYS.trigger("r1"), request)

    def claim_finish_trim(s: RunStore) -> Claim:
        won = s.claim(loop_id, slot, B, slot, source=source, run_id=run_id, trigger_request=request)
        assert isinstance(won, Claim)
        finish(s, won, "succeeded", at(EVERY_S + 1))
        client.hdel(KEYS.slots(loop_id), to_iso(slot))
        client.delete(KEYS.run(won.run.id))
        client.zrem(KEYS.loop_runs(loop_id), won.run.id)
        return won

    stale, _ = race(client, lambda s: s.claim(loop_id, slot, A, slot, source=source, run_id=run_id,
                                              trigger_request=request), claim_finish_trim)
    assert isinstance(stale, Refusal), stale
    assert claims(client) == ["run_claimed"]
    assert client.hget(KEYS.slots(loop_id), to_iso(slot)) is None
    assert client.smembers(KEYS.running) == set()


@pytest.mark.parametrize("source", ["scheduled", "ad_hoc"])
def test_a_slot_skipped_meanwhile_is_not_claimed(client: redis.Redis, source: str) -> None:
    # An overlap skip records the slot (a row of its own) without a claim key, and on a fixed-delay loop it does
    # not move the loop either: the slot key is what guards the slot.
    loop_id = make_loop(client, schedule={"type": "interval", "everyMs": EVERY_S * 1000, "anchor": "fixed_delay"})
    slot = at(EVERY_S)
    claimed, skipped = race(client, lambda s: s.claim(loop_id, slot, A, slot, source=source),
                            lambda s: s.skip(loop_id, slot, slot))
    assert isinstance(claimed, Refusal), claimed
    assert skipped is not None and skipped.status == "skipped"
    assert client.hget(KEYS.slots(loop_id), to_iso(slot)) == skipped.id
    assert claims(client) == [] and client.smembers(KEYS.running) == set()


@pytest.mark.parametrize("change", ["pause", "stop", "remove"])
def test_a_loop_paused_stopped_or_removed_meanwhile_gets_no_claim(client: redis.Redis, change: str) -> None:
    loop_id = make_loop(client)
    loops = LoopStore(client, KEYS)
    changes = {"pause": lambda: loops.pause(loop_id, at(1)), "stop": lambda: loops.stop(loop_id, at(1)),
               "remove": lambda: loops.remove(loop_id, at(1))}
    claimed, _ = race(client, lambda s: s.claim(loop_id, at(EVERY_S), A, at(EVERY_S)), lambda _s: changes[change]())
    assert isinstance(claimed, Refusal), claimed
    assert claims(client) == [] and client.smembers(KEYS.running) == set()


def _stopped_once(monkeypatch: pytest.MonkeyPatch, module: Any, meanwhile: Callable[[], Any]) -> list[Any]:
    """Make ``module``'s next Committer stop once before its commit to run ``meanwhile``; its outcome is kept."""
    outcomes: list[Any] = []
    pending = [meanwhile]

    class Once(Committer):
        def commit(self, tx: Tx) -> CommitResult:
            if pending:
                outcomes.append(pending.pop()())
            return super().commit(tx)

    monkeypatch.setattr(module, "Committer", Once)
    return outcomes


def test_a_trigger_with_an_idempotency_key_sent_twice_at_once_reserves_one_run(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_loop(client)
    outcomes = _stopped_once(monkeypatch, triggers, lambda: triggers.trigger_with(client, KEYS, "l", "order-42",
                                                                                 enqueue=False))
    first = triggers.trigger_with(client, KEYS, "l", "order-42", enqueue=False)
    (second,) = outcomes
    assert second[1] is True and first == (second[0], False)
    assert client.zcard(KEYS.triggers) == 1
    assert [f["type"] for _, f in client.xrange(KEYS.changes)].count("run_triggered") == 1


def test_a_workflow_run_with_an_idempotency_key_created_twice_at_once_is_created_once(client: redis.Redis) -> None:
    from loopsq.domain.workflow_spec import workflow_body_from_json
    from loopsq.state.workflow_runs import WorkflowRunStore
    from loopsq.state.workflows import WorkflowStore

    spec = WorkflowStore(client, KEYS).create(workflow_body_from_json({"name": "w", "steps": [
        {"id": "a", "target": {"type": "command", "command": "true"}}]}), T0)
    key = "loop1:2026-01-01T00:00:10.000Z:attempt:1"
    other = WorkflowRunStore(client, KEYS)
    stopped = Stopped(client, lambda: other.create(spec, T0, idempotency_key=key, owner="worker:b"))
    first, created = WorkflowRunStore(client, KEYS, stopped).create(spec, T0, idempotency_key=key, owner="worker:a")
    second, second_created = stopped.outcome
    assert (created, second_created) == (False, True)
    assert first.run_id == second.run_id and first.run["workerId"] == "worker:b"
    assert client.zcard(KEYS.wf_runs) == 1


def test_two_triggered_runs_of_the_same_millisecond_claimed_at_once_both_get_a_slot(client: redis.Redis) -> None:
    # Engine level: the run that loses the slot to another run moves one millisecond on (``_claim_ad_hoc``),
    # instead of being dropped as "claimed".
    from loopsq.engine import runner
    from loopsq.engine.runtime import Runtime

    loop_id = make_loop(client)
    loop = LoopStore(client, KEYS).require(loop_id)
    slot = at(4)
    rt = Runtime(client=client, keys=KEYS, role="worker", worker_id="worker:a")
    other = Runtime(client=client, keys=KEYS, role="worker", worker_id="worker:b")
    rt.runs = RunStore(client, KEYS, Stopped(client, lambda: runner._claim_ad_hoc(other, loop, slot, "trigger",
                                                                                   "r2", None)))
    first = runner._claim_ad_hoc(rt, loop, slot, "trigger", "r1", None)
    assert isinstance(first, Claim), first
    assert (first.run.id, first.run.scheduled_for) == ("r1", to_iso(slot + timedelta(milliseconds=1)))
    second = RunStore(client, KEYS).get("r2")
    assert second is not None and second.scheduled_for == to_iso(slot)
    assert claims(client) == ["run_claimed", "run_claimed"]
    # The same run claimed twice (its trigger executed by two workers) still runs once.
    again = runner._claim_ad_hoc(other, loop, slot, "trigger", "r1", None)
    assert isinstance(again, Refusal) and again.reason == "claimed"
