"""Graceful worker shutdown: SIGTERM stops taking jobs, lets the current run finish within --grace, then
cancels it so it is recorded and retried elsewhere; nothing is left running without a live owner."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.system.procs import is_process_alive
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def start_worker(cluster: Cluster, name: str, grace: str) -> Proc:
    log = cluster.tmp / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "loopsq", "worker", "--grace", grace], env=cluster.env,
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cluster.tmp)
    proc = Proc(name, popen, log)
    cluster.procs.append(proc)
    cluster.wait_started(proc)
    return proc


@pytest.mark.timeout(90)
def test_sigterm_lets_the_current_run_finish_within_the_grace(cluster: Cluster) -> None:
    cluster.create("short", f"sleep 2; {cluster.ledger_cmd()}", "--every", "1h")
    worker = start_worker(cluster, "worker1", "20s")
    subprocess.Popen([sys.executable, "-m", "loopsq", "run-now", "short", "--wait", "60"], env=cluster.env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    cluster.wait_until(lambda: any(r.status == "running" and r.pid for r in cluster.runs("short")), 20, "the run")
    worker.sigterm()
    assert worker.popen.wait(30) == 0, worker.text()
    (final,) = cluster.runs("short")
    assert final.status == "succeeded"
    assert len(cluster.ledger("short")) == 1
    assert "shutdown requested" in worker.text()


@pytest.mark.timeout(90)
def test_a_run_still_going_after_the_grace_is_cancelled_and_re_run_elsewhere_as_the_same_attempt(
    cluster: Cluster
) -> None:
    first = start_worker(cluster, "worker1", "1s")
    (scheduler,) = cluster.start_all(schedulers=1)
    cluster.create("long", f"{cluster.ledger_cmd()}; sleep 60", "--every", "2s", "--attempts", "1")
    running = cluster.wait_until(
        lambda: next((r for r in cluster.runs("long") if r.status == "running" and r.pid), None), 20, "the run")
    first.sigterm()
    assert first.popen.wait(30) == 0, first.text()
    interrupted = cluster.run(running.id)
    assert interrupted is not None
    assert (interrupted.status, interrupted.error, interrupted.attempt) == (
        "abandoned", "worker shut down before completion", 1)
    assert running.pid and not is_process_alive(running.pid, running.pid_start_time)
    assert not cluster.client.sismember("loopsq:running", running.id)
    # Another worker re-runs it at once, though the loop allows a single attempt: it did not fail, so it is the same
    # attempt re-run (issue 18, point 10), not attempt 2.
    start_worker(cluster, "worker2", "1s")
    rerun = cluster.wait_until(
        lambda: next((r for r in cluster.runs("long") if r.rerun == 1 and r.status == "running"), None),
        20, "the re-run")
    assert (rerun.id, rerun.scheduled_for, rerun.attempt) == (running.id, running.scheduled_for, 1)
    # (Running is recorded at the claim, before its command has written its line.)
    cluster.wait_until(lambda: len([line for line in cluster.ledger("long") if line[0] == running.scheduled_for]) == 2,
                       10, "the re-run's command to start")
    claim_key = f"loopsq:claim:{rerun.loop_id}:{rerun.scheduled_for}:1:rerun:1"
    assert cluster.client.exists(claim_key)
    lines = cluster.cli("runs", "long").stdout.splitlines()
    line = next(i for i, text in enumerate(lines) if text.startswith(rerun.id))
    assert lines[line] == f"{rerun.id}  running     attempt 1 (re-run after shutdown)  slot={rerun.scheduled_for}  long"
    assert lines[line + 1].startswith("  attempt 1 abandoned  finished=")
    assert lines[line + 1].endswith("  worker shut down before completion")
    # Once the re-run settles, its claim key goes as an attempt's does (it does not sit out its 30-day TTL).
    cluster.cli("cancel", rerun.id, "--wait", "20")
    cluster.wait_until(lambda: (r := cluster.run(rerun.id)) is not None and r.terminal, 20, "the re-run to end")
    assert not cluster.client.exists(claim_key)
    del scheduler
