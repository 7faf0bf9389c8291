"""Recovery across hosts (``LOOPSQ_HOST`` gives processes on this machine distinct host names): a dead worker's
run is recovered by a live worker on the host where its process runs, which can check and kill that process,
not by a scheduler elsewhere, which cannot; when no worker is left on that host, the scheduler recovers it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from loopsq.domain import timeutil
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import to_iso
from loopsq.system.procs import is_process_alive
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
A, B = {"LOOPSQ_HOST": "host-a"}, {"LOOPSQ_HOST": "host-b"}


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def slow_run_on_host_b(cluster: Cluster) -> tuple[Proc, LoopRun]:
    """A scheduler on host-a, a worker on host-b, and the slow loop's first run going on that worker."""
    slow_loop(cluster)
    cluster.start("scheduler", env=A)
    victim = cluster.start("worker", env=B)
    run = cluster.wait_until(lambda: next((r for r in cluster.runs("slow") if r.pid), None), 15,
                             "the run to start on the victim")
    assert run.host == "host-b" and run.pid is not None
    return victim, run


def slow_loop(cluster: Cluster) -> None:
    ledger = cluster.ledger_dir / "ledger-slow"
    # Attempt 1 outlives the worker's liveness TTL by far; a retry is quick.
    cmd = (f'echo "start $LOOPS_ATTEMPT" >> {ledger}; sleep $(( LOOPS_ATTEMPT == 1 ? 15 : 1 )); '
           f'echo "end $LOOPS_ATTEMPT" >> {ledger}')
    at = to_iso(timeutil.now() + timedelta(seconds=2))
    cluster.create("slow", cmd, "--at", at, "--attempts", "2", "--retry-delay", "500ms")


@pytest.mark.timeout(60)
def test_a_dead_workers_run_is_recovered_on_its_own_host_with_its_orphan_killed_first(cluster: Cluster) -> None:
    victim, run = slow_run_on_host_b(cluster)
    sibling = cluster.start("worker", env=B)
    # Its watchdog would take the run's group along at once; without it, the orphan is the sibling's to kill.
    victim.kill_watchdog()
    victim.kill9()
    killed_at = time.monotonic()
    final = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.attempt == 2 and r.terminal and r, 25,
                               "attempt 2 to end")
    assert (final.status, final.worker_id) == ("succeeded", cluster.worker_id(sibling)), final.to_dict()
    assert time.monotonic() - killed_at <= 15 + 1  # recovered within 15 s; attempt 2 sleeps 1 s
    assert run.pid is not None and not is_process_alive(run.pid, run.pid_start_time)
    # The first attempt's process was killed before it could finish: it never wrote its end.
    assert cluster.ledger("slow") == [("start", "1"), ("start", "2"), ("end", "2")]
    assert f"killing orphaned process group {run.pid}" in sibling.text()


@pytest.mark.timeout(60)
def test_with_no_worker_left_on_its_host_a_dead_workers_run_is_recovered_by_the_scheduler(cluster: Cluster) -> None:
    victim, run = slow_run_on_host_b(cluster)
    survivor = cluster.start("worker", env=A)
    victim.kill9()
    killed_at = time.monotonic()
    try:
        retried = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.attempt == 2 and r, 15,
                                     "attempt 2 to start")
        assert time.monotonic() - killed_at <= 15
        assert retried.worker_id == cluster.worker_id(survivor)
    finally:
        # host-b stands for a host that went down with the worker: here its process is still ours to clean up.
        if run.pid and is_process_alive(run.pid, run.pid_start_time):
            os.killpg(run.pid, signal.SIGKILL)
