"""Workspace leases with real workers, schedulers and kill -9: loops sharing a workspace key never run at once;
a busy workspace is a skipped run (overlap skip) or a fair wait (overlap allow); a dead holder is recovered."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.run_rules import LoopRun
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def timed_cmd(cluster: Cluster, seconds: float) -> str:
    """Appends ``start|end <loop> <epoch>`` to one shared ledger around a sleep."""
    ledger = cluster.ledger_dir / "ledger-ws"
    mark = 'echo "{0} $LOOPS_LOOP_NAME $(date +%s.%N)" >> ' + str(ledger)
    return f"{mark.format('start')}; sleep {seconds}; {mark.format('end')}"


def spans(cluster: Cluster) -> list[tuple[float, float, str]]:
    opened: dict[str, float] = {}
    out = []
    for event, name, at in cluster.ledger("ws"):
        if event == "start":
            opened[name] = float(at)
        else:
            out.append((opened.pop(name), float(at), name))
    return sorted(out)


def busy(runs: list[LoopRun]) -> list[LoopRun]:
    return [r for r in runs if r.status == "skipped" and (r.error or "").startswith("workspace busy: repo (held by ")]


def trigger(cluster: Cluster, name: str) -> str:
    return cluster.cli("trigger", name).stdout.split()[0]


@pytest.mark.timeout(90)
def test_loops_sharing_a_workspace_never_overlap_and_a_busy_one_is_a_skipped_run(cluster: Cluster) -> None:
    for name in ("alpha", "beta"):
        cluster.create(name, timed_cmd(cluster, 0.8), "--every", "1s", "--workspace", "repo",
                       "--pause-after-failures", "1")
    cluster.start_all(schedulers=1, workers=3)

    def enough() -> bool:
        runs = cluster.runs("alpha") + cluster.runs("beta")
        return len(busy(runs)) >= 4 and sum(r.status == "succeeded" for r in runs) >= 4

    cluster.wait_until(enough, 40, "runs and busy skips of both loops")
    cluster.stop_all()
    done = spans(cluster)
    assert not [(a, b) for a, b in itertools.pairwise(done) if b[0] < a[1]], done
    runs = cluster.runs("alpha") + cluster.runs("beta")
    by_id = {r.id: r for r in runs}
    skipped = busy(runs)
    assert {r.error for r in runs if r.status == "skipped"} - {r.error for r in skipped} <= {
        "previous run still active"}
    for run in skipped:
        assert run.error is not None
        holder = by_id[run.error.removeprefix("workspace busy: repo (held by run ").rstrip(")")]
        assert holder.workspace == "repo"
        assert run.attempt == 1
    fences = sorted(r.workspace_fence or 0 for r in runs if r.status == "succeeded")
    assert len(set(fences)) == len(fences)  # one fencing number per acquisition
    for name in ("alpha", "beta"):
        assert cluster.loop(name)["status"] == "active"  # a busy workspace is not a failure


def _running(cluster: Cluster, run_id: str) -> LoopRun | None:
    run = cluster.run(run_id)
    return run if run is not None and run.status == "running" and run.workspace else None


@pytest.mark.timeout(90)
def test_overlap_allow_waits_in_the_queue_and_runs_once_the_holder_ends(cluster: Cluster) -> None:
    cluster.create("holder", timed_cmd(cluster, 6), "--every", "1h", "--workspace", "repo")
    cluster.create("waiter", timed_cmd(cluster, 0.1), "--every", "1h", "--workspace", "repo", "--overlap", "allow",
                   "--workspace-wait", "20s")
    cluster.create("impatient", timed_cmd(cluster, 0.1), "--every", "1h", "--workspace", "repo",
                   "--overlap", "allow", "--workspace-wait", "1s")
    cluster.start_all(workers=3)
    first = trigger(cluster, "holder")
    held = cluster.wait_until(lambda: _running(cluster, first), 10, "the holder to take the workspace")
    second, third = trigger(cluster, "waiter"), trigger(cluster, "impatient")
    waited = cluster.wait_until(lambda: (r := cluster.run(second)) is not None and r.terminal and r, 30, "the waiter")
    late = cluster.wait_until(lambda: (r := cluster.run(third)) is not None and r.terminal and r, 20, "the impatient")
    assert waited.status == "succeeded" and waited.workspace_fence == (held.workspace_fence or 0) + 1
    assert late.status == "skipped"
    assert late.error == f"workspace busy: repo (held by run {first}; waited 1s)"
    order = [name for _, _, name in spans(cluster)]
    assert order == ["holder", "waiter"]
    start_waiter = spans(cluster)[1][0]
    assert start_waiter >= spans(cluster)[0][1]


@pytest.mark.timeout(90)
def test_a_dead_holders_workspace_is_recovered_like_its_run(cluster: Cluster) -> None:
    cluster.create("victim", timed_cmd(cluster, 60), "--every", "1h", "--workspace", "repo")
    cluster.create("next", timed_cmd(cluster, 0.1), "--every", "1h", "--workspace", "repo", "--overlap", "allow",
                   "--workspace-wait", "60s")
    cluster.start("scheduler")
    # One slot each: the waiter must be on the other worker, the one that lives (a worker with a free slot would
    # take it beside the victim's run, and die with it).
    one = {"LOOPSQ_WORKER_CONCURRENCY": "1"}
    workers = [cluster.start("worker", env=one), cluster.start("worker", env=one)]
    first = trigger(cluster, "victim")
    held = cluster.wait_until(lambda: _running(cluster, first), 10, "the victim to take the workspace")
    victim = next(w for w in workers if cluster.worker_id(w) == held.worker_id)
    second = trigger(cluster, "next")
    cluster.wait_until(lambda: cluster.client.zcard("loopsq:workspace:repo:queue") == 1, 10, "the waiter to queue")
    victim.kill9()
    final = cluster.wait_until(lambda: (r := cluster.run(second)) is not None and r.terminal and r, 40,
                               "the waiter to run once the dead holder is recovered")
    assert final.status == "succeeded", final.to_dict()
    assert cluster.run(first).status == "abandoned"  # type: ignore[union-attr]
