"""One retry rule for every run of a loop (issue 18, point 8), with real processes: a worker killed with kill -9
under a scheduled run, a ``run-now`` run and a triggered run; each is abandoned by recovery and retried as attempt 2
(the manual ones as the same manual run, leaving the schedule alone), unless ``--no-retry`` was given."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from loopsq.domain import timeutil
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import to_iso
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def first_run_hangs(cluster: Cluster, name: str) -> str:
    """A command that records each execution, and hangs the first time only (so the test can kill its worker)."""
    marker = cluster.tmp / f"hung-{name}"
    return f'{cluster.ledger_cmd()}; if [ ! -e {marker} ]; then touch {marker}; sleep 60; fi'


def start_source(cluster: Cluster, source: str, name: str, *extra: str) -> subprocess.Popen[bytes] | None:
    """Start one run of ``name`` the way ``source`` does (the scheduled one starts by itself)."""
    if source == "scheduled":
        return None
    args = ["run-now", name, "--wait", "60"] if source == "run-now" else ["trigger", name]
    return subprocess.Popen([sys.executable, "-m", "loopsq", *args, *extra], env=cluster.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def kill_its_worker(cluster: Cluster, name: str, victim: Proc) -> LoopRun:
    """Wait until the victim executes the loop's run, start a survivor, kill -9 the victim; returns the run."""
    run = cluster.wait_until(lambda: next((r for r in cluster.runs(name) if r.pid and r.status == "running"), None),
                             20, "the run to start on the victim")
    assert run.worker_id == cluster.worker_id(victim)
    cluster.start("worker")
    victim.kill9()
    return run


SOURCES = {"scheduled": "scheduled", "run-now": "ad_hoc", "trigger": "trigger"}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("source", list(SOURCES))
def test_a_run_whose_worker_is_killed_is_retried_whatever_started_it(cluster: Cluster, source: str) -> None:
    name = f"loop-{source}"
    schedule = ("--at", to_iso(timeutil.now() + timedelta(seconds=2))) if source == "scheduled" else ("--every", "1h")
    cluster.create(name, first_run_hangs(cluster, name), *schedule, "--attempts", "2", "--retry-delay", "500ms")
    before = cluster.loop(name)
    cluster.start("scheduler")
    victim = cluster.start("worker")
    caller = start_source(cluster, source, name)
    run = kill_its_worker(cluster, name, victim)
    assert (run.source, run.attempt) == (SOURCES[source], 1)
    final = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.attempt == 2 and r.terminal and r, 30,
                               "attempt 2 of the killed run to end")
    assert (final.status, final.source, final.id) == ("succeeded", SOURCES[source], run.id)
    assert [a["status"] for a in final.previous_attempts or []] == ["abandoned"]
    assert (final.previous_attempts or [{}])[0]["error"].endswith("died before completion")
    assert [line[0] for line in cluster.ledger(name)] == [run.scheduled_for, run.scheduled_for]
    after = cluster.loop(name)
    assert after.get("retryScheduledFor") is None
    if source != "scheduled":
        assert after["nextRunAt"] == before["nextRunAt"]  # a manual run's retry never moves the schedule
        assert [r.id for r in cluster.runs(name)] == [run.id]
    if caller is not None:
        caller.wait(30)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("source", ["run-now", "trigger"])
def test_no_retry_leaves_a_killed_run_abandoned(cluster: Cluster, source: str) -> None:
    name = f"once-{source}"
    cluster.create(name, first_run_hangs(cluster, name), "--every", "1h", "--attempts", "3", "--retry-delay", "500ms")
    cluster.start("scheduler")
    victim = cluster.start("worker")
    caller = start_source(cluster, source, name, "--no-retry")
    run = kill_its_worker(cluster, name, victim)
    assert run.no_retry is True
    abandoned = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.status == "abandoned" and r, 20,
                                   "the killed run to be abandoned")
    # Recovery settled it without scheduling anything: no retry is pending, the schedule is untouched.
    assert abandoned.attempt == 1
    loop = cluster.loop(name)
    assert loop.get("retryScheduledFor") is None and not loop.get("retryQueue")
    recovered = [c for c in cluster.changes() if c["type"] == "run_abandoned"]
    assert len(recovered) == 1 and "retry_scheduled" not in recovered[0]["data"].get("also", [])
    assert caller is not None
    caller.wait(30)
