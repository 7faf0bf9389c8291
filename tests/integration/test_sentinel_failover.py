"""Redis Sentinel: a real failover in the middle of a workload of real scheduler and worker processes.

A master, a replica and three sentinels on loopback (``tests.redis_server.SentinelGroup``; the same redis-server
binary the session uses, run with ``--sentinel``). Every loopsq process gets only the ``redis+sentinel://`` URL.
``SENTINEL FAILOVER`` promotes the replica while loops run every second; the old master accepts writes for about
11 s more before Sentinel demotes it, and then discards them (``bench/failover_loss.py``). Claims wait for a
replica (``loopsq.state.durability``), so no claim made there runs.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.timeutil import from_iso
from loopsq.sdk import LoopsClient
from loopsq.state.connection import connect
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import SentinelGroup

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LOOPS = 4


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    g = SentinelGroup().start()
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture
def cluster(group: SentinelGroup, tmp_path: Path) -> Iterator[Cluster]:
    group.wait_settled()
    yield from open_cluster(group.url, tmp_path)


def _settled_runs(cluster: Cluster, name: str, after: float = 0.0) -> list[str]:
    return [r.scheduled_for for r in cluster.runs(name)
            if r.status == "succeeded" and from_iso(r.scheduled_for).timestamp() > after]


def test_every_loopsq_process_and_the_sdk_reach_redis_through_the_sentinels(cluster: Cluster,
                                                                           group: SentinelGroup) -> None:
    out = cluster.cli("create", "command", "hello", "--cmd", "true", "--every", "1h").stdout
    assert out.startswith("created loop ")
    master = group.server(group.master_port()).client()
    assert master.hget("loopsq:loop-names", "hello") or master.keys("loopsq:*"), "nothing written on the master"
    client = connect(group.url)
    assert client.connection_pool.service_name == "loopsq-test"
    assert cluster.cli("list").stdout.split()[-1] == "hello"


def test_a_failover_in_the_middle_of_a_workload_loses_no_loop_and_runs_no_slot_twice(cluster: Cluster,
                                                                                    group: SentinelGroup) -> None:
    procs = cluster.start_all(schedulers=2, workers=2)
    names = [f"fo{i}" for i in range(LOOPS)]
    client = LoopsClient(cluster.url)
    for name in names:
        # Catch-up "all": a slot whose run the failover discarded would run again, so a lost claim shows.
        client.create({"name": name, "schedule": {"type": "interval", "everyMs": 1000, "anchor": "fixed_rate"},
                       "catchUp": "all", "target": {"type": "command", "command": cluster.ledger_cmd(),
                                                    "shell": True}})
    client.close()
    cluster.wait_until(lambda: all(len(_settled_runs(cluster, n)) >= 2 for n in names), 60, "runs before failover")

    old, new = group.failover(settled=False)
    group.wait_settled()
    settled_at = time.time()
    assert group.master_port() == new != old

    # Loops keep running on the new master: each gets runs for slots after the group settled.
    cluster.wait_until(lambda: all(len(_settled_runs(cluster, n, after=settled_at)) >= 3 for n in names), 90,
                       "runs after the failover")
    exited = [p.name for p in procs if not p.alive()]
    cluster.stop_all()
    assert exited == [], f"processes exited during the failover: {exited}\n{cluster.logs()}"

    for name in names:
        executed = [slot for slot, *_ in cluster.ledger(name)]
        doubled = {slot: n for slot, n in Counter(executed).items() if n > 1}
        assert doubled == {}, f"{name}: slots executed twice: {doubled}\n{cluster.logs()}"
        # No stranded loop: active, with its timer armed for a future slot.
        loop = cluster.loop(name)
        assert loop["status"] == "active"
        armed = cluster.timer_at(name)
        assert armed is not None, f"{name} has no armed timer"
        # Every execution is recorded, settled, with its exit code.
        runs = {r.id: r for r in cluster.runs(name)}
        for slot, run_id in cluster.ledger(name):
            run = runs.get(run_id)
            assert run is not None, f"{name}: the run of slot {slot} ({run_id}) was lost\n{cluster.logs()}"
            assert (run.scheduled_for, run.status, run.exit_code) == (slot, "succeeded", 0), run.to_dict()
