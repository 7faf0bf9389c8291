"""Redis outages with real processes (issue 13): Redis on AOF with ``appendfsync always``, killed with -9 and
restarted from its AOF on the same port, under a scheduler, workers, a mirror and the web app.

- A run that finishes during an outage keeps its result (status, exit code, output), is recorded once and never
  executed again; its worker, and every other process, rides the outage out with one log line when it starts and
  one when it ends.
- An outage longer than a run's lease: the run's late result is fenced off, the run is recorded abandoned once the
  grace after the outage is over, and retried.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain import timeutil
from loopsq.domain.timeutil import from_iso
from loopsq.state.keys import Keys
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()
DOWN = "redis unavailable ("
BACK = "redis reachable again after "


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    """A private server of this test only, on AOF with every write synced before it is answered."""
    server = RedisServer(appendonly=True, appendfsync="always").start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def cluster(aof_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(aof_server.url, tmp_path)


def outage(server: RedisServer, seconds: float) -> float:
    """kill -9 Redis, keep it away ``seconds``, restart it from its AOF on the same port; the kill's epoch time."""
    killed_at = time.time()
    server.stop(signal.SIGKILL)
    time.sleep(seconds)
    server.start()
    return killed_at


def assert_rode_it_out(cluster: Cluster, procs: list[Proc], outages: int = 1) -> None:
    """Every process is alive and logged each outage once: one line when it started, one when it ended."""
    for proc in procs:
        assert proc.alive(), f"{proc.name} exited with {proc.popen.returncode}\n{cluster.logs()}"
        text = proc.text()
        assert (text.count(DOWN), text.count(BACK)) == (outages, outages), f"{proc.name}:\n{text[-4000:]}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_that_finishes_during_an_outage_keeps_its_result_and_is_recorded_once(
    cluster: Cluster, aof_server: RedisServer, workers: int
) -> None:
    cmd = f'echo "start $LOOPS_ATTEMPT" >> {cluster.ledger_dir}/ledger-finish; sleep 6; echo the-result'
    cluster.create("finish", cmd, "--at", timeutil.to_iso(timeutil.now()), "--attempts", "2")
    procs = cluster.start_all(schedulers=1, workers=workers)
    run = cluster.wait_until(lambda: next((r for r in cluster.runs("finish") if r.pid), None), 20,
                             "the run's process to start")
    # Redis goes away about a second before the run ends, and stays away longer than the liveness TTL (5 s).
    time.sleep(4.5)
    current = cluster.run(run.id)
    assert current is not None and current.status == "running", "the run ended before the outage"
    killed_at = outage(aof_server, 8)

    final = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.terminal and r, 30,
                               "the run to be recorded after the outage")
    assert (final.status, final.exit_code, final.stdout, final.attempt) == ("succeeded", 0, "the-result\n", 1), \
        final.to_dict()
    assert final.finished_at is not None and from_iso(final.finished_at).timestamp() > killed_at
    assert final.worker_id == run.worker_id
    assert [c["type"] for c in cluster.changes() if c["type"] == "run_abandoned"] == []
    time.sleep(2)  # a few maintenance passes and reaps more
    assert cluster.ledger("finish") == [("start", "1")]
    assert [r.id for r in cluster.runs("finish")] == [run.id]
    assert_rode_it_out(cluster, procs)
