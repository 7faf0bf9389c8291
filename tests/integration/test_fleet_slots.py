"""A worker with several slots (``loopsq worker --concurrency N``), on real processes: its runs go on at once,
each a child it supervises; killed with kill -9 it loses none of them (all recovered, no orphan, no duplicate);
stopped with SIGTERM it gives each the grace, then hands each on; a long run starves nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.timeutil import from_iso
from loopsq.system.procs import is_process_alive
from tests.integration.processes import Cluster, gaps, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def slots(n: int) -> dict[str, str]:
    return {"LOOPSQ_WORKER_CONCURRENCY": str(n)}


def trigger(cluster: Cluster, names: list[str]) -> None:
    """Start a run of each loop now (``LoopsClient.trigger``)."""
    from loopsq.sdk import LoopsClient

    client = LoopsClient(cluster.url)
    try:
        for name in names:
            client.trigger(name)
    finally:
        client.close()


def running(cluster: Cluster, names: list[str]) -> list:  # type: ignore[type-arg]
    return [r for name in names for r in cluster.runs(name) if r.status == "running" and r.pid]


@pytest.mark.timeout(90)
def test_one_worker_with_four_slots_runs_four_loops_at_once_each_as_a_child_it_supervises(cluster: Cluster) -> None:
    names = [f"slow{i}" for i in range(4)]
    for name in names:
        cluster.create(name, f"{cluster.ledger_cmd()}; sleep 30", "--every", "1h")
    worker = cluster.start("worker", env=slots(4))
    wid = cluster.worker_id(worker)
    trigger(cluster, names)
    together = cluster.wait_until(lambda: (r := running(cluster, names)) and len(r) == 4 and r, 30,
                                  "four runs going at once")
    assert {r.worker_id for r in together} == {wid}
    assert len({r.pid for r in together}) == 4
    import psutil

    children = {p.pid for p in psutil.Process(worker.pid).children(recursive=True)}
    assert {r.pid for r in together} <= children
    # RQ's view: the worker is busy while its slots are.
    assert cluster.client.hget(f"rq:worker:{wid}", "state") == "busy"
    import json

    record = json.loads(str(cluster.client.get(f"loopsq:worker:{wid}")))
    assert (record["slots"], record["busy"]) == (4, 4)


@pytest.mark.timeout(120)
def test_a_worker_killed_with_three_runs_going_has_all_three_recovered_with_no_orphan_and_no_duplicate(
    cluster: Cluster
) -> None:
    names = [f"long{i}" for i in range(3)]
    for name in names:
        cluster.create(name, f"{cluster.ledger_cmd()}; sleep 60", "--every", "1h", "--attempts", "2",
                       "--retry-delay", "1s")
    victim = cluster.start("worker", env=slots(3))
    cluster.start("scheduler")
    trigger(cluster, names)
    held = cluster.wait_until(lambda: (r := running(cluster, names)) and len(r) == 3 and r, 30, "three runs")
    killed_at = time.monotonic()
    victim.kill9()
    # All three are recovered (abandoned, their processes gone) within the ~2.5 s a dead worker's runs take.
    cluster.wait_until(lambda: all((cluster.run(r.id) or r).status == "abandoned" for r in held), 15,
                       "the three runs to be recovered")
    recovered_in = time.monotonic() - killed_at
    for run in held:
        assert run.pid is not None
        cluster.wait_until(lambda p=run.pid, s=run.pid_start_time: not is_process_alive(p, s), 10,
                           f"run process {run.pid} to be gone")
    assert recovered_in < 15
    # Each is retried once on a new worker: attempt 2 of the same slot, and no slot ran twice in one attempt.
    cluster.start("worker", env=slots(3))
    cluster.wait_until(lambda: all(any(r.attempt == 2 and r.pid for r in cluster.runs(n)) for n in names), 30,
                       "each run's second attempt")
    for name, run in zip(names, held, strict=True):
        lines = cluster.ledger(name)
        # Attempt 1 (killed) and attempt 2 of the one slot (a retry keeps its run id): never an attempt twice.
        assert lines == [(run.scheduled_for, run.id)] * 2, lines


@pytest.mark.timeout(120)
def test_sigterm_gives_every_running_run_the_grace_then_hands_each_on(cluster: Cluster) -> None:
    names = ["quick", "stuck1", "stuck2"]
    cluster.create("quick", f"sleep 1; {cluster.ledger_cmd()}", "--every", "1h")
    worker = cluster.start("worker", env={**slots(3), "LOOPSQ_KILL_TIMEOUT": "5s"})
    cluster.start("scheduler")
    for name in names[1:]:
        cluster.create(name, f"{cluster.ledger_cmd()}; sleep 60", "--every", "2s")
    cluster.wait_until(lambda: len(running(cluster, names[1:])) == 2, 30, "two long runs")
    from loopsq.sdk import LoopsClient

    client = LoopsClient(cluster.url)
    try:
        client.trigger("quick")
    finally:
        client.close()
    cluster.wait_until(lambda: len(running(cluster, names)) == 3, 30, "three runs")
    worker.sigterm()
    assert worker.popen.wait(30) == 0, worker.text()
    # The grace it announces is the grace it says it applies, and the one it cancels after (2.5 s, not "2s").
    log = worker.text()
    assert "on SIGTERM the current runs get 2.5s to finish (kill timeout 5s" in log
    assert "shutdown requested; current runs get 2.5s to finish" in log
    assert "still going after the 2.5s grace; cancelling it" in log
    (quick,) = cluster.runs("quick")
    assert quick.status == "succeeded"  # it ended within the grace
    stuck = [next(r for r in cluster.runs(name) if r.status != "skipped") for name in names[1:]]
    assert [(r.status, r.error) for r in stuck] == [("abandoned", "worker shut down before completion")] * 2
    for run in stuck:
        assert run.pid and not is_process_alive(run.pid, run.pid_start_time)
    assert not cluster.client.smembers("loopsq:running")
    # Another worker re-runs both, as the same attempt.
    cluster.start("worker", env=slots(3))
    cluster.wait_until(lambda: all(any(r.rerun == 1 and r.pid for r in cluster.runs(n)) for n in names[1:]), 30,
                       "the re-runs")


@pytest.mark.timeout(120)
def test_a_long_run_does_not_starve_short_loops_on_a_worker_with_slots(cluster: Cluster) -> None:
    cluster.create("long", f"{cluster.ledger_cmd()}; sleep 60", "--every", "1h")
    for i in range(3):
        cluster.create(f"tick{i}", cluster.ledger_cmd(), "--every", "1s")
    cluster.start("scheduler")
    cluster.start("worker", env=slots(4))
    from loopsq.sdk import LoopsClient

    client = LoopsClient(cluster.url)
    try:
        client.trigger("long")
    finally:
        client.close()
    cluster.wait_until(lambda: running(cluster, ["long"]), 20, "the long run")
    started = time.time()
    cluster.wait_until(lambda: all(len([s for s, *_ in cluster.ledger(f"tick{i}")
                                        if from_iso(s).timestamp() > started]) >= 6 for i in range(3)),
                       40, "six slots of each short loop while the long run goes on")
    assert running(cluster, ["long"]), "the long run still holds its slot"
    for i in range(3):
        slots_run = sorted(s for s, *_ in cluster.ledger(f"tick{i}") if from_iso(s).timestamp() > started)
        assert not gaps(slots_run, 1000), slots_run  # not one slot of a short loop went missing
