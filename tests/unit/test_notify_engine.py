"""The notifier (``engine.notify``) on fakeredis against a real HTTP receiver that checks signatures: which changes
make which events, for which endpoints, the overdue index, and delivery with retries (ids kept)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from loopsq.domain import notify as domain
from loopsq.engine.notify import Notifier
from loopsq.state.keys import Keys
from loopsq.state.notify import NotifyStore
from tests.notify_receiver import Receiver

KEYS = Keys()
ENV = {"LOOPSQ_NOTIFY_BACKOFF_MIN": "1ms", "LOOPSQ_NOTIFY_BACKOFF_MAX": "2ms"}


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.up()
    yield r
    r.down()


def add(client: fakeredis.FakeRedis, receiver: Receiver, name: str = "ops", **kw: Any) -> None:
    endpoint, _ = NotifyStore(client, KEYS).set(domain.Endpoint(name, receiver.url, secret=domain.new_secret(), **kw))
    receiver.secret = endpoint.secret


def change(client: fakeredis.FakeRedis, kind: str, **data: Any) -> None:
    client.xadd(KEYS.changes, {"type": kind, "at": "2026-01-01T00:00:00.000Z", "data": json.dumps(data)})


def loop(status: str = "active", tags: dict[str, str] | None = None, every_ms: int = 60_000) -> dict[str, Any]:
    out: dict[str, Any] = {"id": "L1", "name": "nightly", "status": status, "timezone": "UTC",
                           "schedule": {"type": "interval", "everyMs": every_ms, "anchor": "fixed_rate"},
                           "target": {"type": "command", "command": "true"}}
    if tags is not None:
        out["tags"] = tags
    return out


def run(status: str, run_id: str, **extra: Any) -> dict[str, Any]:
    return {"id": run_id, "loopId": "L1", "loopName": "nightly", "status": status, "attempt": 1,
            "scheduledFor": "2026-01-01T00:00:00.000Z", **extra}


def test_a_failure_then_a_success_is_failed_then_one_recovered(client: fakeredis.FakeRedis,
                                                               receiver: Receiver) -> None:
    add(client, receiver)
    notifier = Notifier(client, KEYS, ENV)
    notifier.run_pass()  # (makes the group: changes from now on)
    change(client, "loop_created", upsert={"loops": [loop()]})
    change(client, "run_succeeded", upsert={"loop_runs": [run("succeeded", "r0")]})
    change(client, "run_failed", upsert={"loop_runs": [run("failed", "r1", exitCode=3, error="exited 3")]})
    change(client, "run_timed_out", upsert={"loop_runs": [run("timed_out", "r2")]})
    change(client, "run_succeeded", upsert={"loop_runs": [run("succeeded", "r3")]})
    change(client, "run_succeeded", upsert={"loop_runs": [run("succeeded", "r4")]})
    assert notifier.run_pass() == 3
    assert receiver.types() == ["loop.failed", "loop.failed", "loop.recovered"]
    first = receiver.received()[0]
    assert first.body["text"] == "loopsq: loop nightly failed (run r1, failed, exit 3): exited 3"
    assert first.body["data"]["run"] == "r1"
    assert receiver.received()[2].body["data"]["run"] == "r3"
    assert receiver.rejected == 0
    assert len({d.id for d in receiver.received()}) == 3
    assert [e["ok"] for e in NotifyStore(client, KEYS).log("ops", 10)] == [True] * 3


def test_a_missed_streak_is_told_once_and_a_pause_once(client: fakeredis.FakeRedis, receiver: Receiver) -> None:
    add(client, receiver)
    notifier = Notifier(client, KEYS, ENV)
    notifier.run_pass()
    change(client, "run_missed", upsert={"loop_runs": [run("missed", "m1", missedCount=2, error="no capacity")]})
    change(client, "run_missed", also=["missed_extended"],
           upsert={"loop_runs": [run("missed", "m1", missedCount=3, error="no capacity")]})
    change(client, "loop_paused", upsert={"loops": [{**loop("paused"), "statusReason": "3 failures"}]})
    change(client, "loop_renamed", upsert={"loops": [loop("paused")]})
    change(client, "loop_resumed", upsert={"loops": [loop("active")]})
    change(client, "loop_paused", upsert={"loops": [loop("paused")]})
    notifier.run_pass()
    assert receiver.types() == ["loop.missed", "loop.paused", "loop.paused"]
    texts = [d.body["text"] for d in receiver.received()]
    assert texts[:2] == ["loopsq: loop nightly missed slots (2 from 2026-01-01T00:00:00.000Z: no capacity)",
                         "loopsq: loop nightly was paused: 3 failures"]


def test_events_and_tags_choose_the_endpoints(client: fakeredis.FakeRedis, receiver: Receiver) -> None:
    other = Receiver()
    other.up()
    try:
        add(client, receiver, "data-team", tags={"team": "data"})
        endpoint, _ = NotifyStore(client, KEYS).set(domain.Endpoint("pauses", other.url, events=("paused",),
                                                                    secret=domain.new_secret()))
        other.secret = endpoint.secret
        notifier = Notifier(client, KEYS, ENV)
        notifier.run_pass()
        change(client, "loop_updated", upsert={"loops": [loop(tags={"team": "web"})]})
        change(client, "run_failed", upsert={"loop_runs": [run("failed", "r1")]})
        change(client, "loop_updated", upsert={"loops": [loop(tags={"team": "data"})]})
        change(client, "run_failed", upsert={"loop_runs": [run("failed", "r2")]})
        change(client, "loop_paused", upsert={"loops": [loop("paused", tags={"team": "data"})]})
        notifier.run_pass()
        assert [d.body["data"].get("run") for d in receiver.received()] == ["r2", None]
        assert receiver.types() == ["loop.failed", "loop.paused"]
        assert other.types() == ["loop.paused"]
    finally:
        other.down()


def test_overdue_alerts_once_then_recovered_follows_the_next_success(client: fakeredis.FakeRedis,
                                                                   receiver: Receiver) -> None:
    add(client, receiver, events=("overdue", "recovered"), alert_after_ms=60_000)
    notifier = Notifier(client, KEYS, ENV)
    clock = [1_000_000]
    notifier.now_ms = lambda: clock[0]  # type: ignore[method-assign]
    notifier.run_pass()
    change(client, "loop_created", upsert={"loops": [loop()]})
    notifier.run_pass()
    assert client.zscore(KEYS.notify_due("ops"), "L1") == 1_060_000
    client.set(KEYS.loop("L1"), json.dumps(loop()))
    clock[0] = 1_030_000
    change(client, "run_succeeded", upsert={"loop_runs": [run("succeeded", "r1")]})
    notifier.run_pass()
    assert client.zscore(KEYS.notify_due("ops"), "L1") == 1_090_000  # a success moves the deadline
    clock[0] = 1_090_000
    notifier.run_pass()
    clock[0] = 1_500_000
    notifier.run_pass()
    assert receiver.types() == ["loop.overdue"]
    assert receiver.received()[0].body["text"] == "loopsq: loop nightly is overdue: no success within 1m"
    change(client, "run_succeeded", upsert={"loop_runs": [run("succeeded", "r2")]})
    notifier.run_pass()
    assert receiver.types() == ["loop.overdue", "loop.recovered"]
    assert client.zscore(KEYS.notify_due("ops"), "L1") == 1_560_000


def test_overdue_defaults_to_twice_the_cadence_and_skips_paused_loops(client: fakeredis.FakeRedis,
                                                                     receiver: Receiver) -> None:
    add(client, receiver, events=("overdue",))
    notifier = Notifier(client, KEYS, ENV)
    notifier.now_ms = lambda: 0  # type: ignore[method-assign]
    notifier.run_pass()
    change(client, "loop_created", upsert={"loops": [loop(every_ms=5_000)]})
    notifier.run_pass()
    assert client.zscore(KEYS.notify_due("ops"), "L1") == 10_000
    change(client, "loop_paused", upsert={"loops": [loop("paused")]})
    notifier.run_pass()
    assert client.zscore(KEYS.notify_due("ops"), "L1") is None


def test_a_receiver_that_is_down_gets_every_event_later_each_with_one_id(client: fakeredis.FakeRedis,
                                                                         receiver: Receiver) -> None:
    add(client, receiver)
    notifier = Notifier(client, KEYS, ENV)
    notifier.run_pass()
    receiver.down()
    for n in range(5):
        change(client, "run_failed", upsert={"loop_runs": [run("failed", f"r{n}")]})
    for _ in range(4):
        assert notifier.run_pass() == 0
    store = NotifyStore(client, KEYS)
    assert store.pending_count("ops") == 5
    failures = store.log("ops", 100)
    assert failures and not any(e["ok"] for e in failures)
    assert {e["id"] for e in failures} <= set(client.zrange(KEYS.notify_outbox("ops"), 0, -1))
    receiver.up()
    import time

    deadline = time.monotonic() + 10
    while store.pending_count("ops") and time.monotonic() < deadline:
        notifier.run_pass()
    assert store.pending_count("ops") == 0
    assert sorted(d.body["data"]["run"] for d in receiver.received()) == [f"r{n}" for n in range(5)]
    # The ids the failed attempts carried are the ids delivered.
    assert {e["id"] for e in failures} <= {d.id for d in receiver.received()}
    assert receiver.rejected == 0


def test_an_event_is_given_up_after_the_limit(client: fakeredis.FakeRedis, receiver: Receiver) -> None:
    add(client, receiver)
    notifier = Notifier(client, KEYS, {**ENV, "LOOPSQ_NOTIFY_GIVE_UP": "1ms"})
    notifier.run_pass()
    receiver.down()
    change(client, "run_failed", upsert={"loop_runs": [run("failed", "r1")]})
    clock = [client.time()[0] * 1000]
    notifier.now_ms = lambda: clock[0]  # type: ignore[method-assign]
    notifier.run_pass()
    clock[0] += 10
    notifier.run_pass()
    store = NotifyStore(client, KEYS)
    assert store.pending_count("ops") == 0
    assert store.log("ops", 1)[0]["gaveUp"] is True


def test_nothing_is_read_while_no_endpoint_exists(client: fakeredis.FakeRedis) -> None:
    change(client, "run_failed", upsert={"loop_runs": [run("failed", "r1")]})
    assert Notifier(client, KEYS, ENV).run_pass() == 0
    assert client.xinfo_groups(KEYS.changes) == []


def test_an_overdue_loop_rewritten_by_its_failing_runs_is_not_alerted_again(client: fakeredis.FakeRedis,
                                                                            receiver: Receiver) -> None:
    add(client, receiver, events=("overdue",), alert_after_ms=1_000)
    notifier = Notifier(client, KEYS, ENV)
    clock = [0]
    notifier.now_ms = lambda: clock[0]  # type: ignore[method-assign]
    notifier.run_pass()
    change(client, "loop_created", upsert={"loops": [loop()]})
    notifier.run_pass()
    client.set(KEYS.loop("L1"), json.dumps(loop()))
    for step in range(1, 6):
        clock[0] = step * 1_500
        change(client, "run_failed", upsert={"loops": [loop()], "loop_runs": [run("failed", f"r{step}")]})
        notifier.run_pass()
    assert receiver.types() == ["loop.overdue"]


def test_removing_the_last_endpoint_drops_the_group_so_it_holds_no_history(client: fakeredis.FakeRedis,
                                                                          receiver: Receiver) -> None:
    add(client, receiver)
    notifier = Notifier(client, KEYS, ENV)
    notifier.run_pass()
    assert [g["name"] for g in client.xinfo_groups(KEYS.changes)] == ["notify"]
    NotifyStore(client, KEYS).delete("ops")
    notifier.run_pass()
    assert client.xinfo_groups(KEYS.changes) == []


def test_a_notifier_that_dies_before_acknowledging_derives_the_same_event_once(client: fakeredis.FakeRedis,
                                                                               receiver: Receiver) -> None:
    add(client, receiver)
    notifier = Notifier(client, KEYS, ENV)
    notifier.run_pass()
    change(client, "run_failed", upsert={"loop_runs": [run("failed", "r1")]})

    def die(*_a: object) -> None:
        raise RuntimeError("killed before XACK")

    client.xack = die  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        notifier.run_pass()
    del client.xack
    successor = Notifier(client, KEYS, ENV)  # (a new leader: the same consumer reads what is pending)
    successor.run_pass()
    successor.run_pass()
    assert receiver.types() == ["loop.failed"]
    assert client.xpending(KEYS.changes, "notify")["pending"] == 0


def test_cadence_is_the_interval_the_cron_gap_or_a_dynamic_minimum_and_none_for_a_one_off() -> None:
    from loopsq.engine.notify import cadence_ms

    assert cadence_ms({"schedule": {"type": "interval", "everyMs": 5_000}}) == 5_000
    assert cadence_ms({"schedule": {"type": "cron", "expression": "*/5 * * * *"}, "timezone": "UTC"}) == 300_000
    assert cadence_ms({"schedule": {"type": "dynamic"}}) == 60_000
    assert cadence_ms({"schedule": {"type": "once", "at": "2026-01-01T00:00:00Z"}}) is None
    assert cadence_ms({"schedule": {"type": "bogus"}}) is None
