"""Workspace leases of workflow steps, with real workers: steps and loops sharing a key never run at once; a loop
that finds a step holding it names the step; a step whose workspace stays busy fails with the reason; a killed
worker's step gives the workspace up once its own lease expires."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopsq.engine.step_workspaces import STEP_LEASE_MS
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def timed(cluster: Cluster, who: str, seconds: float) -> str:
    """Appends ``start|end <who> <epoch>`` to one shared ledger around a sleep."""
    ledger = cluster.ledger_dir / "ledger-ws"
    mark = 'echo "{0} ' + who + ' $(date +%s.%N)" >> ' + str(ledger)
    return f"{mark.format('start')}; sleep {seconds}; {mark.format('end')}"


def spans(cluster: Cluster) -> list[tuple[float, float, str]]:
    opened: dict[str, float] = {}
    out = []
    for event, who, at in cluster.ledger("ws"):
        if event == "start":
            opened[who] = float(at)
        else:
            out.append((opened.pop(who), float(at), who))
    return sorted(out)


def workflow(cluster: Cluster, name: str, seconds: float, **step: Any) -> None:
    path = cluster.tmp / f"{name}.json"
    path.write_text(json.dumps({"name": name, "steps": [
        {"id": "edit", "target": {"type": "command", "command": timed(cluster, name, seconds), "shell": True},
         "workspace": "repo", **step}]}))
    cluster.cli("workflows", "create", str(path))


def run_in_background(cluster: Cluster, name: str, out: dict[str, Any]) -> threading.Thread:
    def go() -> None:
        out[name] = json.loads(cluster.cli("workflows", "run", name, "--json", check=False, timeout=90).stdout)

    thread = threading.Thread(target=go)
    thread.start()
    return thread


@pytest.mark.timeout(120)
def test_steps_and_loops_sharing_a_workspace_never_overlap(cluster: Cluster) -> None:
    workflow(cluster, "wfa", 1.5)
    workflow(cluster, "wfb", 1.5)
    cluster.create("alpha", timed(cluster, "alpha", 0.5), "--every", "1s", "--workspace", "repo",
                   "--overlap", "allow")
    cluster.start_all(schedulers=1, workers=3)
    results: dict[str, Any] = {}
    threads = [run_in_background(cluster, name, results) for name in ("wfa", "wfb")]
    for thread in threads:
        thread.join(timeout=100)
    cluster.wait_until(lambda: sum(r.status == "succeeded" for r in cluster.runs("alpha")) >= 2, 30,
                       "two runs of the loop")
    cluster.stop_all()
    done = spans(cluster)
    assert {who for _, _, who in done} >= {"wfa", "wfb", "alpha"}, done
    assert not [(a, b) for a, b in itertools.pairwise(done) if b[0] < a[1]], done
    assert [results[name]["workflowRun"]["status"] for name in ("wfa", "wfb")] == ["succeeded", "succeeded"]


@pytest.mark.timeout(90)
def test_a_loop_finding_a_step_in_its_workspace_names_the_step_and_a_step_that_waits_too_long_fails(
        cluster: Cluster) -> None:
    workflow(cluster, "holder", 6)
    workflow(cluster, "impatient", 0.1, workspaceWaitMs=1000)
    cluster.create("alpha", timed(cluster, "alpha", 0.1), "--every", "1h", "--workspace", "repo")
    cluster.start_all(schedulers=1, workers=3)
    results: dict[str, Any] = {}
    holder = run_in_background(cluster, "holder", results)
    cluster.wait_until(lambda: cluster.ledger("ws"), 20, "the holder's step to start")
    impatient = json.loads(cluster.cli("workflows", "run", "impatient", "--json", check=False).stdout)
    step_error = impatient["workflowRun"].get("error", "")
    run_id = cluster.cli("trigger", "alpha").stdout.split()[0]
    skipped = cluster.wait_until(lambda: next((r for r in cluster.runs("alpha") if r.id == run_id and r.terminal),
                                              None), 20, "the triggered run")
    holder.join(timeout=30)
    cluster.stop_all()
    holder_run = results["holder"]["workflowRun"]["id"]
    assert (skipped.status, skipped.error) == (
        "skipped", f"workspace busy: repo (held by step edit of workflow run {holder_run})")
    assert impatient["workflowRun"]["status"] == "failed", impatient
    steps = cluster.cli("workflows", "inspect", impatient["workflowRun"]["id"], "--json").stdout
    assert (f"workspace busy: repo (held by step edit of workflow run {holder_run}; waited 1s)"
            in json.dumps(json.loads(steps))), (steps, step_error)
    assert [who for _, _, who in spans(cluster)] == ["holder"]  # the impatient step never ran


@pytest.mark.timeout(120)
def test_a_killed_workers_step_gives_its_workspace_up_when_its_lease_expires(cluster: Cluster) -> None:
    workflow(cluster, "victim", 60)
    workflow(cluster, "next", 0.1)
    _scheduler, worker = cluster.start_all(schedulers=1, workers=1)
    results: dict[str, Any] = {}
    victim = run_in_background(cluster, "victim", results)
    cluster.wait_until(lambda: cluster.ledger("ws"), 20, "the victim's step to start")
    worker.kill9()
    killed_at = time.time()
    cluster.start("worker")
    done = json.loads(cluster.cli("workflows", "run", "next", "--json", check=False, timeout=90).stdout)
    victim.join(timeout=60)
    cluster.stop_all()
    assert done["workflowRun"]["status"] == "succeeded", done
    started = next(at for event, who, at in cluster.ledger("ws") if event == "start" and who == "next")
    # Taken over once the killed step's own lease expired (last beaten at most a third of it before the kill), not
    # before: never while the step could still be alive.
    lease_s = STEP_LEASE_MS / 1000
    assert killed_at + lease_s * 2 / 3 - 0.5 < float(started) < killed_at + lease_s + 20
