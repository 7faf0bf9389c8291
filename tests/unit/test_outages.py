"""Riding out Redis outages (``loopsq.state.outages``): transient failures against configuration errors, the capped
backoff, one log line when an outage starts and one when it ends, ``ride``, the outage marker that pauses
recovery, and the transitions that recognize their own write when its reply was lost."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import to_iso
from loopsq.engine import maintenance
from loopsq.engine.runner import claim_slot
from loopsq.engine.runtime import OUTAGE_GAP_MS, OUTAGE_GRACE_MS, Runtime
from loopsq.errors import RedisUnavailableError
from loopsq.state.commit import CommitResult, Committer, Tx
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.outages import (
    Backoff,
    OutageLog,
    Seen,
    is_configuration_error,
    is_transient,
    note_restart,
    note_seen,
    parse_seen,
    ride,
    wait_for_redis,
)
from loopsq.state.runs import Claim, Owner, Refusal, RunStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
URL = "redis://:s3cret@10.0.0.9:6390/0"


@pytest.mark.parametrize(("exc", "transient", "configuration"), [
    (redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), True, False),
    (redis.TimeoutError("Timeout reading from socket"), True, False),
    (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), True, False),
    (redis.exceptions.ReadOnlyError("You can't write against a read only replica."), True, False),
    (redis.ResponseError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
     True, False),
    (redis.ResponseError("TRYAGAIN Multiple keys request during rehashing of slot"), True, False),
    (redis.AuthenticationError("invalid username-password pair or user is disabled."), False, True),
    (redis.AuthenticationError("Authentication required."), False, True),
    (redis.ResponseError("WRONGPASS invalid username-password pair or user is disabled."), False, True),
    (redis.exceptions.NoPermissionError("NOPERM this user has no permissions to run the 'eval' command"),
     False, True),
    (redis.ResponseError("DB index is out of range"), False, True),
    (redis.ConnectionError("Invalid Database"), False, True),
    (redis.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False, False),
    (ValueError("not redis at all"), False, False),
])
def test_failures_are_transient_or_configuration_errors(exc: Exception, transient: bool, configuration: bool) -> None:
    assert (is_transient(exc), is_configuration_error(exc)) == (transient, configuration)


def test_the_backoff_doubles_up_to_its_cap_and_starts_over_after_a_reset() -> None:
    backoff = Backoff(first_s=0.1, max_s=1.0)
    assert [backoff.next() for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    backoff.reset()
    assert backoff.next() == 0.1


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends_with_the_password_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    outage = OutageLog(URL, logging.getLogger("test.outage"), clock=clock)
    caplog.set_level(logging.INFO, "test.outage")
    outage.recovered()  # nothing was down
    for _ in range(5):  # five threads, or five tries, notice it
        outage.failed(redis.ConnectionError(f"Error 111 connecting to {URL}. Connection refused."))
    clock.now += 12.34
    outage.recovered()
    outage.recovered()
    assert [r.getMessage() for r in caplog.records] == [
        "redis unavailable (cannot reach Redis at redis://:***@10.0.0.9:6390/0: Error 111 connecting to "
        "redis://:***@10.0.0.9:6390/0. Connection refused.); waiting for it (capped backoff)",
        "redis reachable again after 12.3s",
    ]
    assert (outage.outages, outage.down) == (1, False)
    clock.now += 1.0
    outage.failed(redis.TimeoutError("Timeout reading from socket"))
    assert (outage.outages, outage.down, len(caplog.records)) == (2, True, 3)


def test_a_connection_dropped_right_after_a_recovery_is_logged_only_if_redis_stays_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A process stopped through an outage resumes with a call in flight on each of two threads: both meet a socket
    # of the old server. The first is the outage as this process sees it; the second, a moment after Redis answered
    # again, is the same outage and is not logged, unless Redis stays away.
    clock = Clock()
    outage = OutageLog(URL, logging.getLogger("test.settle"), clock=clock)
    caplog.set_level(logging.INFO, "test.settle")
    closed = redis.ConnectionError("Connection closed by server.")
    outage.failed(closed)
    outage.recovered()
    clock.now += 0.2
    outage.failed(closed)
    assert outage.down
    outage.recovered()
    assert [r.getMessage() for r in caplog.records] == [
        "redis unavailable (cannot reach Redis at redis://:***@10.0.0.9:6390/0: Connection closed by server.); "
        "waiting for it (capped backoff)",
        "redis reachable again after 0.0s",
    ]
    assert (outage.outages, outage.down) == (1, False)
    # The same a moment later, but Redis stays away: logged once it has lasted SETTLE_S, and its end too.
    clock.now += 0.2
    outage.failed(closed)
    clock.now += 0.5
    outage.failed(closed)
    assert len(caplog.records) == 2
    clock.now += 0.6
    outage.failed(closed)
    outage.failed(closed)
    clock.now += 2.0
    outage.recovered()
    assert [r.getMessage() for r in caplog.records][2:] == [
        "redis unavailable (cannot reach Redis at redis://:***@10.0.0.9:6390/0: Connection closed by server.); "
        "waiting for it (capped backoff)",
        "redis reachable again after 3.1s",  # from its first failure
    ]
    assert (outage.outages, outage.down) == (2, False)


def test_ride_waits_out_transient_failures_and_raises_anything_else_at_once() -> None:
    outage = OutageLog(URL, logging.getLogger("test.ride"))
    failures = [redis.ConnectionError("down"), redis.exceptions.BusyLoadingError("loading")]

    def flaky() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    assert ride(flaky, outage, backoff=Backoff(first_s=0.001, max_s=0.002)) == "done"
    assert (outage.outages, outage.down) == (1, False)

    def wrong_password() -> str:
        raise redis.AuthenticationError("invalid username-password pair or user is disabled.")

    with pytest.raises(redis.AuthenticationError):
        ride(wrong_password, outage)
    stop = threading.Event()
    stop.set()
    with pytest.raises(redis.ConnectionError):  # a stop request ends the wait
        ride(lambda: (_ for _ in ()).throw(redis.ConnectionError("down")), outage, stop=stop)


def test_wait_for_redis_turns_a_configuration_error_into_the_one_line_error_and_a_stop_into_false() -> None:
    class Refusing:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        def ping(self) -> bool:
            raise self.exc

    outage = OutageLog(URL)
    with pytest.raises(RedisUnavailableError) as caught:
        wait_for_redis(Refusing(redis.AuthenticationError("invalid username-password pair or user is "  # type: ignore[arg-type]
                                                          "disabled.")), outage)
    assert caught.value.message == ("cannot reach Redis at redis://:***@10.0.0.9:6390/0: invalid username-password "
                                    "pair or user is disabled.")
    stop = threading.Event()
    stop.set()
    assert wait_for_redis(Refusing(redis.ConnectionError("refused")), outage, stop) is False  # type: ignore[arg-type]


def test_a_silence_a_running_process_lived_through_starts_the_recovery_grace(client: redis.Redis) -> None:
    def beat(mine: int) -> Seen:
        return parse_seen(note_seen(client, KEYS, OUTAGE_GAP_MS, OUTAGE_GRACE_MS, mine))

    first = beat(0)  # the first beat ever
    assert not first.in_grace and first.at_ms > 0
    assert not beat(first.at_ms).in_grace  # beats a moment apart
    silent = int(client.get(KEYS.seen) or 0) - OUTAGE_GAP_MS - 500
    client.set(KEYS.seen, silent)  # nothing beat for longer than the gap ...
    assert not beat(0).in_grace  # ... which a process that just started cannot tell from no process running
    client.set(KEYS.seen, silent)
    seen = beat(silent)  # ... but a process that beat before it lived through an outage
    assert seen.in_grace and seen.grace_ms == OUTAGE_GRACE_MS
    assert beat(seen.at_ms).in_grace  # and it lasts, for everyone
    assert 0 < client.pttl(KEYS.recovery_grace) <= OUTAGE_GRACE_MS
    client.delete(KEYS.recovery_grace)
    assert not beat(seen.at_ms).in_grace


def test_a_restart_of_redis_with_data_from_before_starts_the_recovery_grace(client: redis.Redis) -> None:
    def restarted(known: object, info: object) -> bool:
        return note_restart(client, KEYS, known, info, OUTAGE_GRACE_MS)

    assert restarted(None, {"run_id": "a", "uptime_in_seconds": 1}) is False  # a new server: nothing from before
    assert client.get(KEYS.redis_run_id) == "a"
    assert restarted("a", {"run_id": "a", "uptime_in_seconds": 3}) is False  # the same server
    assert restarted("a", {"run_id": "b", "uptime_in_seconds": 3}) is True  # restarted 3 s ago, from its AOF
    assert 0 < client.pttl(KEYS.recovery_grace) <= OUTAGE_GRACE_MS - 3000
    client.delete(KEYS.recovery_grace)
    assert restarted("b", {"run_id": "c", "uptime_in_seconds": 60}) is False  # long enough ago
    assert client.get(KEYS.redis_run_id) == "c" and not client.exists(KEYS.recovery_grace)
    assert restarted("c", redis.ResponseError("unknown command 'info'")) is False  # INFO refused


def _loop(client: redis.Redis, name: str = "l") -> str:
    body = {"name": name, "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 10_000},
            "target": {"type": "command", "command": "true"}}
    return LoopStore(client, KEYS).create(new_loop(body, T0)).id


def test_maintenance_judges_no_owner_dead_during_the_grace_after_an_outage(client: redis.Redis) -> None:
    loop_id = _loop(client)
    # A run whose worker's liveness key is gone: after an outage that may be a live worker not yet back.
    claim = RunStore(client, KEYS).claim(loop_id, T0 + timedelta(seconds=10), Owner("worker:gone", "elsewhere", 1),
                                         datetime.now(UTC))
    assert isinstance(claim, Claim)
    with Runtime(client=client, keys=KEYS, role="scheduler") as rt:
        assert rt.seen_ms > 0  # it beat at start
        client.set(KEYS.seen, rt.seen_ms - OUTAGE_GAP_MS - 1)  # then nothing could, for longer than the gap
        rt.seen_ms = int(client.get(KEYS.seen) or 0)
        report = maintenance.maintain(rt)
        assert (report.recovery_paused, report.recovered) == (True, [])
        assert RunStore(client, KEYS).get(claim.run.id).status == "running"  # type: ignore[union-attr]
        client.delete(KEYS.recovery_grace)  # the grace is over
        report = maintenance.maintain(rt)
        assert report.recovery_paused is False
        assert [(r.id, r.status, r.error) for r in report.recovered] == [
            (claim.run.id, "abandoned", "worker worker:gone died before completion")]


def test_a_scheduler_started_after_a_silence_with_no_outage_recovers_at_once(client: redis.Redis) -> None:
    # Its worker was the only process and was killed: nothing beat since, but Redis never went away.
    loop_id = _loop(client)
    claim = RunStore(client, KEYS).claim(loop_id, T0 + timedelta(seconds=10), Owner("worker:gone", "elsewhere", 1),
                                         datetime.now(UTC))
    assert isinstance(claim, Claim)
    client.set(KEYS.seen, int(parse_seen(note_seen(client, KEYS, 1, 1, 0)).at_ms) - 60_000)
    with Runtime(client=client, keys=KEYS, role="scheduler") as rt:
        report = maintenance.maintain(rt)
    assert report.recovery_paused is False
    assert [r.id for r in report.recovered] == [claim.run.id]


class ResentCommitter(Committer):
    """Applies each transition, then answers as a resend of it would once its first reply was lost: refused by
    the transition's own first guard."""

    def commit(self, tx: Tx, **options: Any) -> CommitResult:
        first = super().commit(tx, **options)
        assert first.ok
        return super().commit(tx, **options)


def test_a_claim_whose_reply_was_lost_is_recognized_as_won(client: redis.Redis) -> None:
    loop_id = _loop(client)
    slot = T0 + timedelta(seconds=10)
    with Runtime(client=client, keys=KEYS, role="worker") as rt:
        rt.runs = RunStore(client, KEYS, ResentCommitter(client, KEYS))
        claim = claim_slot(rt, loop_id, slot, datetime.now(UTC), source="scheduled")
        assert isinstance(claim, Claim), claim
        assert claim.token == client.get(KEYS.lease(claim.run.id))
        assert claim.token == client.get(KEYS.claim(loop_id, to_iso(slot), 1))
        # Someone else's claim of that slot is not taken for ours.
        other = RunStore(client, KEYS).claim(loop_id, slot, rt.owner, datetime.now(UTC), nonce="other")
        assert isinstance(other, Refusal) and other.reason == "running"
        assert RunStore(client, KEYS).won_claim(loop_id, slot, "other") is None


def test_a_finalize_whose_reply_was_lost_is_recognized_as_recorded(client: redis.Redis) -> None:
    loop_id = _loop(client)
    store = RunStore(client, KEYS)
    owner = Owner("worker:a", "host-a", 1)
    claim = store.claim(loop_id, T0 + timedelta(seconds=10), owner, T0 + timedelta(seconds=10))
    assert isinstance(claim, Claim)
    ended = T0 + timedelta(seconds=11)
    resent = RunStore(client, KEYS, ResentCommitter(client, KEYS))
    assert resent.finalize(claim.run.id, claim.token, ended, status="succeeded", exit_code=0, duration_ms=5,
                           stdout="out", stderr="", error=None, pid=None) is None  # as the resend sees it
    recorded = store.recorded_end(claim.run.id, attempt=1, worker_id="worker:a", status="succeeded",
                                  finished_at=ended)
    assert recorded is not None
    run, loop = recorded
    assert (run.status, run.stdout, run.finished_at) == ("succeeded", "out", to_iso(ended))
    assert loop is not None and loop.id == loop_id
    # Not ours: another worker, another attempt, another time.
    assert store.recorded_end(claim.run.id, attempt=1, worker_id="worker:b", status="succeeded",
                              finished_at=ended) is None
    assert store.recorded_end(claim.run.id, attempt=1, worker_id="worker:a", status="succeeded",
                              finished_at=ended + timedelta(milliseconds=1)) is None


def test_a_workflow_step_start_and_end_whose_replies_were_lost_are_recognized(client: redis.Redis) -> None:
    from loopsq.domain.workflow_spec import workflow_body_from_json
    from loopsq.state.workflow_run_state import StepEnd
    from loopsq.state.workflow_runs import WorkflowRunStore
    from loopsq.state.workflows import WorkflowStore

    spec = WorkflowStore(client, KEYS).create(workflow_body_from_json({"name": "w", "steps": [
        {"id": "a", "target": {"type": "command", "command": "true"}},
        {"id": "b", "target": {"type": "command", "command": "true"}}]}), T0)
    store = WorkflowRunStore(client, KEYS, ResentCommitter(client, KEYS))
    state, _ = store.create(spec, T0, run_id="wr1", owner="worker:a")
    assert store.start_step(state, "a", T0 + timedelta(seconds=1)) is True
    end = StepEnd("a", T0 + timedelta(seconds=2), "failed", 1, 1000, "", "boom", "process exited with code 1")
    assert store.end_step(state, end) is True
    fresh = WorkflowRunStore(client, KEYS).require("wr1")
    assert (fresh.steps["a"]["status"], fresh.steps["a"]["exitCode"]) == ("failed", 1)
    assert [e["eventType"] for e in WorkflowRunStore(client, KEYS).events("wr1")] == [
        "created", "step_started", "step_failed"]  # each once
