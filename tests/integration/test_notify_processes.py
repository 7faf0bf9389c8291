"""Notifications with real processes (a scheduler and a worker) to a real HTTP receiver that checks every
signature: failures, the circuit breaker's pause and the recovery reach it; a receiver that is down (for seconds,
and for over a minute) gets everything once it is back, each event under one id; ``overdue`` alerts once and
``recovered`` follows the next success."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.processes import Cluster, open_cluster
from tests.notify_receiver import Delivery, Receiver
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

#: Short backoff for the test (the defaults are 5 s doubling to 10 min).
FAST = {"LOOPSQ_NOTIFY_BACKOFF_MIN": "300ms", "LOOPSQ_NOTIFY_BACKOFF_MAX": "1s"}


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.up()
    yield r
    r.down()


def add(cluster: Cluster, receiver: Receiver, name: str, *options: str) -> None:
    out = cluster.cli("notify", "add", name, "--webhook", receiver.url, *options).stdout
    receiver.secret = out.splitlines()[1].split()[1]


def by_id(deliveries: list[Delivery]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for d in deliveries:
        out[d.id].append(d.body)
    return out


def distinct(receiver: Receiver, kind: str) -> list[str]:
    return sorted({d.id for d in receiver.received() if d.body["type"] == kind})


def pending(cluster: Cluster, name: str) -> int:
    items = json.loads(cluster.cli("--json", "notify", "list").stdout)
    return int(next(i["pending"] for i in items if i["name"] == name))


@pytest.mark.timeout(180)
def test_failures_pause_and_recovery_reach_a_receiver_that_was_down_each_with_one_id(
        cluster: Cluster, receiver: Receiver, tmp_path: Path) -> None:
    add(cluster, receiver, "ops")
    cluster.start("scheduler", env=FAST)
    cluster.start("worker")
    ok = tmp_path / "ok"
    cluster.create("flaky", f"test -f {ok}", "--every", "1s", "--pause-after-failures", "3")
    cluster.wait_until(lambda: "loop.failed" in receiver.types(), 60, "a first failure told")
    receiver.down()
    cluster.wait_until(lambda: cluster.loop("flaky")["status"] == "paused", 60, "the breaker's pause")
    cluster.wait_until(lambda: sum(not e["ok"] for e in json.loads(
        cluster.cli("--json", "notify", "log", "ops", "--limit", "100").stdout)) >= 2, 60, "failed attempts")
    ok.touch()
    cluster.cli("resume", "flaky")
    cluster.wait_until(lambda: any(r.status == "succeeded" for r in cluster.runs("flaky")), 60, "a success")
    assert pending(cluster, "ops") >= 2  # (at least the pause and the recovery wait)
    receiver.up()
    cluster.wait_until(lambda: pending(cluster, "ops") == 0 and "loop.recovered" in receiver.types(), 60,
                       "everything delivered")
    assert receiver.rejected == 0
    for bodies in by_id(receiver.received()).values():  # a duplicate (at least once) is the same event
        assert all(body == bodies[0] for body in bodies)
    failed = [r for r in cluster.runs("flaky") if r.status == "failed"]
    assert len(distinct(receiver, "loop.failed")) == len(failed) == 3
    assert len(distinct(receiver, "loop.paused")) == 1
    assert len(distinct(receiver, "loop.recovered")) == 1
    paused = next(d for d in receiver.received() if d.body["type"] == "loop.paused")
    assert paused.body["text"].startswith("loopsq: loop flaky was paused: circuit breaker open")
    recovered = next(d for d in receiver.received() if d.body["type"] == "loop.recovered")
    assert recovered.body["data"]["run"] == next(r.id for r in cluster.runs("flaky") if r.status == "succeeded")
    log = json.loads(cluster.cli("--json", "notify", "log", "ops", "--limit", "1000").stdout)
    assert any(e.get("error") for e in log if not e["ok"])
    assert {e["id"] for e in log if e["ok"]} == {d.id for d in receiver.received()}


@pytest.mark.timeout(180)
def test_overdue_alerts_once_and_the_next_success_is_recovered(cluster: Cluster, receiver: Receiver,
                                                               tmp_path: Path) -> None:
    add(cluster, receiver, "deadman", "--on", "overdue,recovered", "--alert-after", "3s")
    cluster.start("scheduler", env=FAST)
    cluster.start("worker")
    ok = tmp_path / "ok"
    cluster.create("silent", f"test -f {ok}", "--every", "1s", "--pause-after-failures", "0")
    cluster.wait_until(lambda: "loop.overdue" in receiver.types(), 60, "the overdue alert")
    seen = len(cluster.runs("silent"))
    # Several more failing slots, more than another alert-after: still one alert.
    cluster.wait_until(lambda: len(cluster.runs("silent")) >= seen + 5, 60, "more failures")
    assert len(distinct(receiver, "loop.overdue")) == 1
    ok.touch()
    cluster.wait_until(lambda: "loop.recovered" in receiver.types(), 60, "the recovery")
    assert len(distinct(receiver, "loop.overdue")) == 1
    assert len(distinct(receiver, "loop.recovered")) == 1
    overdue = next(d for d in receiver.received() if d.body["type"] == "loop.overdue")
    assert overdue.body["text"] == "loopsq: loop silent is overdue: no success within 3s"
    assert receiver.rejected == 0


@pytest.mark.timeout(120)
def test_slots_missed_while_no_scheduler_ran_are_told_once_by_the_next_scheduler(cluster: Cluster,
                                                                                 receiver: Receiver) -> None:
    add(cluster, receiver, "missed", "--on", "missed")
    cluster.start("worker")
    scheduler = cluster.start("scheduler", env=FAST)
    cluster.create("tick", cluster.ledger_cmd(), "--every", "1s")
    cluster.wait_until(lambda: len(cluster.ledger("tick")) >= 2, 30, "tick to run")
    scheduler.terminate()
    stopped = time.monotonic()
    cluster.wait_until(lambda: time.monotonic() - stopped >= 5, 10, "five seconds without a scheduler")
    cluster.start("scheduler", env=FAST)
    cluster.wait_until(lambda: "loop.missed" in receiver.types(), 60, "the missed streak told")
    ran = len(cluster.ledger("tick"))
    cluster.wait_until(lambda: len(cluster.ledger("tick")) >= ran + 3, 30, "tick to run on")
    assert len(distinct(receiver, "loop.missed")) == 1
    told = next(d for d in receiver.received() if d.body["type"] == "loop.missed")
    row = next(r for r in cluster.runs("tick") if r.status == "missed")
    assert (told.body["data"]["run"], told.body["data"]["kind"]) == (row.id, "no_scheduler")
    assert told.body["data"]["count"] >= 3
    assert receiver.rejected == 0


@pytest.mark.timeout(420)
def test_a_receiver_down_for_a_minute_gets_every_event_afterwards_each_with_one_id(
        cluster: Cluster, receiver: Receiver, tmp_path: Path) -> None:
    add(cluster, receiver, "ops", "--on", "failed,recovered")
    cluster.start("scheduler", env=FAST)
    cluster.start("worker")
    ok = tmp_path / "ok"
    cluster.create("flaky", f"test -f {ok}", "--every", "2s", "--pause-after-failures", "0")
    cluster.wait_until(lambda: "loop.failed" in receiver.types(), 60, "a first failure told")
    receiver.down()
    down_at = time.monotonic()
    told_before = {d.id for d in receiver.received()}

    def failed_runs() -> list[str]:
        runs = json.loads(cluster.cli("--json", "runs", "flaky", "--limit", "1000").stdout)
        return sorted(r["id"] for r in runs if r["status"] == "failed")

    first_failures = len(failed_runs())
    cluster.wait_until(lambda: sum(not e["ok"] for e in json.loads(
        cluster.cli("--json", "notify", "log", "ops", "--limit", "1000").stdout)) >= 2, 60,
        "delivery attempts failing while the receiver is down")
    cluster.wait_until(lambda: time.monotonic() - down_at >= 60 and len(failed_runs()) >= first_failures + 5, 180,
                       "a minute down, with failures meanwhile")
    ok.touch()  # the loop recovers while the receiver is still down: every event of the test is then made
    cluster.wait_until(lambda: any(r.status == "succeeded" for r in cluster.runs("flaky")), 60, "a success")
    failed = failed_runs()
    cluster.wait_until(lambda: pending(cluster, "ops") >= len(failed) - len(told_before) + 1, 60,
                       "the failures since the receiver went down and the recovery waiting")
    receiver.up()
    cluster.wait_until(lambda: pending(cluster, "ops") == 0 and "loop.recovered" in receiver.types(), 120,
                       "everything delivered")
    assert receiver.rejected == 0
    delivered = by_id(receiver.received())
    for bodies in delivered.values():  # a duplicate (at least once) is the same event under the same id
        assert all(body == bodies[0] for body in bodies)
    ids_by_run: dict[str, set[str]] = defaultdict(set)
    for event_id, bodies in delivered.items():
        if bodies[0]["type"] == "loop.failed":
            ids_by_run[bodies[0]["data"]["run"]].add(event_id)
    assert sorted(ids_by_run) == failed  # every failure told, those made while the receiver was down too
    assert all(len(ids) == 1 for ids in ids_by_run.values())  # each under one id
    assert len(distinct(receiver, "loop.recovered")) == 1
    log = json.loads(cluster.cli("--json", "notify", "log", "ops", "--limit", "1000").stdout)
    assert {e["id"] for e in log if e["ok"]} <= set(delivered)
