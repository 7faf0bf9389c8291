"""``durability.ReplicaWatch``: how many replicas a claim WAITs for, from ``INFO replication`` read at most once a
second (or after a short WAIT), and one log line per episode. The clock is injected; the client is a stub that
answers ``INFO replication`` as redis-py parses it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from loopsq.state import durability
from loopsq.state.durability import ReplicaWatch, online_replicas

ONLINE = {"ip": "127.0.0.1", "port": 7001, "state": "online", "offset": 10, "lag": 0}
SYNCING = {"ip": "127.0.0.1", "port": 7002, "state": "wait_bgsave", "offset": 0, "lag": 0}


class Master:
    """Answers ``INFO replication`` with ``replicas`` and counts the reads."""

    def __init__(self, *replicas: dict[str, Any]) -> None:
        self.replicas = list(replicas)
        self.reads = 0

    def info(self, section: str) -> dict[str, Any]:
        assert section == "replication"
        self.reads += 1
        reply: dict[str, Any] = {"role": "master", "connected_slaves": len(self.replicas)}
        reply.update({f"slave{i}": r for i, r in enumerate(self.replicas)})
        return reply


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_only_attached_replicas_in_state_online_count() -> None:
    assert online_replicas(Master(ONLINE, SYNCING).info("replication")) == 1
    assert online_replicas({"role": "master", "connected_slaves": 0}) == 0
    assert online_replicas({"slave0": "ip=127.0.0.1,port=7001,state=online,offset=1,lag=0"}) == 1


def test_a_claim_waits_for_the_wanted_replicas_capped_by_those_attached_read_at_most_once_a_second() -> None:
    clock, master = Clock(), Master(ONLINE)
    watch = ReplicaWatch(clock)
    assert watch.to_wait(master, 2) == 1  # type: ignore[arg-type]
    assert watch.to_wait(master, 1) == 1  # type: ignore[arg-type]
    clock.now += durability.REFRESH_S - 0.01
    master.replicas = []
    assert watch.to_wait(master, 1) == 1  # type: ignore[arg-type]
    assert master.reads == 1  # no round trip per claim
    clock.now += 0.01
    assert watch.to_wait(master, 1) == 0  # type: ignore[arg-type]
    assert master.reads == 2
    assert watch.to_wait(master, 0) == 0  # type: ignore[arg-type]


def test_a_short_wait_makes_the_next_claim_read_again() -> None:
    clock, master = Clock(), Master(ONLINE)
    watch = ReplicaWatch(clock)
    assert watch.to_wait(master, 1) == 1  # type: ignore[arg-type]
    master.replicas = []
    watch.short()
    assert watch.to_wait(master, 1) == 0  # type: ignore[arg-type]
    assert master.reads == 2


def test_an_episode_is_logged_once_when_it_begins_and_once_when_it_ends_and_holds_claims_only_at_its_start(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, master = Clock(), Master(ONLINE)
    watch = ReplicaWatch(clock)
    with caplog.at_level(logging.INFO, logger="loopsq.state.durability"):
        watch.to_wait(master, 1)  # type: ignore[arg-type]
        master.replicas = []
        for i in range(20):  # many claims over many seconds
            clock.now += 0.5
            watch.to_wait(master, 1)  # type: ignore[arg-type]
            if i == 1:  # the first read after the replica went: the episode begins, claims hold CONFIRM_S
                assert watch.holding_s() == pytest.approx(durability.CONFIRM_S)
        assert watch.holding_s() == 0.0
        master.replicas = [ONLINE]
        clock.now += durability.REFRESH_S
        watch.to_wait(master, 1)  # type: ignore[arg-type]
        clock.now += durability.REFRESH_S
        watch.to_wait(master, 1)  # type: ignore[arg-type]
    assert [r.getMessage() for r in caplog.records] == [
        "claims are not replicated: the master reports 0 of 1 wanted replica(s) attached; runs go on unreplicated "
        "5s from now unless the sentinels name another master (a failover can then lose their claims, and a slot "
        "may run twice)",
        "claims are replicated again: the master reports 1 of 1 wanted replica(s) attached",
    ]
