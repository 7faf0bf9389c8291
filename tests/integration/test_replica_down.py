"""Redis Sentinel with its only replica down: claims and finalizes do not wait for a replica the master reports it
does not have (``loopsq.state.durability.ReplicaWatch``), so loops keep their rate; the episode is logged once,
and once the replica is back, claims wait for it again.

Real processes: a master, a replica and three sentinels on loopback (``tests.redis_server.SentinelGroup``), one
``loopsq scheduler`` and one ``loopsq worker`` given only the ``redis+sentinel://`` URL. Rates are compared as
slots run within windows of the same length (not wall-clock times), with a tolerant bound for a loaded machine.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.timeutil import from_iso
from loopsq.state import durability
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import RedisServer, SentinelGroup, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LOOPS = 5
#: Seconds of slots counted with the replica up, then down (each loop runs every second).
WINDOW_S = 10.0
DOWN = "claims are not replicated: the master reports 0 of 1 wanted replica(s) attached"
BACK = "claims are replicated again: the master reports 1 of 1 wanted replica(s) attached"


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    g = SentinelGroup().start()  # its own: this test kills the replica
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture
def cluster(group: SentinelGroup, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(group.url, tmp_path)


def _slots_run(cluster: Cluster, names: list[str], start: float, end: float) -> int:
    """Slots in ``[start, end)`` (epoch seconds) whose run succeeded, over every loop."""
    return sum(1 for name in names for r in cluster.runs(name)
               if r.status == "succeeded" and start <= from_iso(r.scheduled_for).timestamp() < end)


def _count_window(cluster: Cluster, names: list[str]) -> int:
    start = time.time() + 0.5
    time.sleep(start + WINDOW_S + 3.0 - time.time())  # the window's last slots have finished by then
    return _slots_run(cluster, names, start, start + WINDOW_S)


def _waits(server: RedisServer) -> int:
    """``WAIT`` calls the server has answered since it started."""
    return int(server.client().info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def _lines(proc: Proc, text: str) -> int:
    return sum(text in line for line in proc.text().splitlines())


def test_with_the_replica_down_loops_keep_their_rate_and_once_it_is_back_claims_wait_for_it_again(
        cluster: Cluster, group: SentinelGroup) -> None:
    scheduler, worker = cluster.start_all(schedulers=1, workers=1)
    names = [f"rd{i}" for i in range(LOOPS)]
    for name in names:
        cluster.create_fast(name, "true", 1000)
    cluster.wait_until(lambda: all(_slots_run(cluster, [n], 0, time.time() + 60) >= 2 for n in names), 60,
                       "runs with the replica up")
    up = _count_window(cluster, names)

    master = group.server(group.master_port())
    replica = next(s for s in group.servers if s.port != master.port)
    replica.stop(signal.SIGKILL)
    cluster.wait_until(lambda: _lines(worker, DOWN), 30, "the worker to log that claims are not replicated")
    time.sleep(durability.CONFIRM_S + 1.0)  # past the episode's hold (a promotion would show by then)
    waits_before = _waits(master)
    down = _count_window(cluster, names)
    assert _waits(master) == waits_before, "a WAIT for a replica the master does not have"
    print(f"slots run in {WINDOW_S:.0f}s: replica up {up}, replica down {down} (ratio {down / max(up, 1):.2f})")
    assert up >= LOOPS * WINDOW_S * 0.5, f"too few runs with the replica up: {up}\n{cluster.logs()}"
    assert down >= 0.75 * up, f"with the replica down {down} slots ran, with it up {up}\n{cluster.logs()}"
    assert _lines(worker, DOWN) == 1, worker.text()[-6000:]
    assert _lines(worker, "not acknowledged") == 0, worker.text()[-6000:]

    waits = _waits(master)
    replica.start()
    wait_until(lambda: replica.client().info("replication")["master_link_status"] == "up", "the replica to resync")
    cluster.wait_until(lambda: _lines(worker, BACK), 30, "the worker to log that claims are replicated again")
    # Claims WAIT for the replica again: the master counts new WAIT calls, and they are acknowledged.
    cluster.wait_until(lambda: _waits(master) >= waits + LOOPS,
                       30, "claims to WAIT for the replica again")
    assert _lines(worker, DOWN) == 1 and _lines(worker, BACK) == 1, worker.text()[-6000:]
    assert scheduler.alive() and worker.alive(), cluster.logs()
