"""Change-gated runs with real schedulers and workers: the target runs only when the gate exits 0; a closed gate
records a skipped run that is neither a failure nor an attempt; the gate's own timeout kills it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


@pytest.mark.timeout(60)
def test_a_closed_gate_skips_the_slot_without_running_the_target_and_an_open_one_runs_it(cluster: Cluster) -> None:
    flag = cluster.tmp / "changed"
    gate = f"test -e {flag}"
    cluster.create("gated", cluster.ledger_cmd(), "--every", "1s", "--attempts", "3", "--pause-after-failures", "1",
                   "--gate", f"{gate} || exit 3")
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: sum(r.status == "skipped" for r in cluster.runs("gated")) >= 3, 20, "three skips")
    assert cluster.ledger("gated") == []  # the target never ran
    skipped = [r for r in cluster.runs("gated") if r.status == "skipped"]
    assert {r.error for r in skipped} == {"gate closed (exit 3)"}
    assert {r.attempt for r in skipped} == {1}
    loop = cluster.loop("gated")
    # Not a failure (no streak, not paused by --pause-after-failures 1) and not an attempt (no retry pending).
    assert loop["status"] == "active" and loop.get("failureStreak", 0) == 0 and "retryScheduledFor" not in loop
    flag.touch()
    cluster.wait_until(lambda: len(cluster.ledger("gated")) >= 2, 20, "the target to run once the gate opens")
    ran = {line[0] for line in cluster.ledger("gated")}
    assert ran <= {r.scheduled_for for r in cluster.runs("gated") if r.status in ("succeeded", "running")}
    human = cluster.cli("runs", "gated", "--status", "skipped", "--limit", "1").stdout
    assert "  skipped: gate closed (exit 3)" in human
    notes = [c["data"].get("also", []) for c in cluster.changes() if c["type"] == "run_skipped"]
    assert notes and all("gate_closed" in also for also in notes)


@pytest.mark.timeout(60)
def test_a_gate_that_outlives_its_timeout_is_killed_with_its_group_and_the_slot_is_skipped(cluster: Cluster) -> None:
    pidfile = cluster.tmp / "gate.pid"
    cluster.create("slowgate", cluster.ledger_cmd(), "--every", "1s",
                   "--gate", f"sleep 30 & echo $! > {pidfile}; wait", "--gate-timeout", "1s")
    cluster.start_all(schedulers=1, workers=1)
    run = cluster.wait_until(lambda: [r for r in cluster.runs("slowgate") if r.status == "skipped"], 20, "a skip")[0]
    assert run.error == "gate closed (timed out after 1s)"
    assert cluster.ledger("slowgate") == []
    pid = int(pidfile.read_text())
    stat = Path(f"/proc/{pid}/stat")
    cluster.wait_until(lambda: not stat.exists() or stat.read_text().split()[2] == "Z", 5,
                       "the gate's child to be killed")


@pytest.mark.timeout(60)
def test_run_now_is_not_gated(cluster: Cluster) -> None:
    cluster.create("manual", cluster.ledger_cmd(), "--every", "1h", "--gate", "exit 1")
    cluster.start_all(workers=1)
    out = cluster.cli("run-now", "manual").stdout
    assert " succeeded " in out
    assert len(cluster.ledger("manual")) == 1


@pytest.mark.timeout(60)
def test_a_workflow_step_with_a_closed_gate_is_skipped_with_its_dependents_and_the_run_still_succeeds(
        cluster: Cluster) -> None:
    from tests.integration.test_workflow_processes import (
        create_workflow,
        create_workflow_loop,
        noted,
        step_states,
        steps_ledger,
        wf_runs,
    )

    create_workflow(cluster, [
        noted(cluster, "fetch"),
        noted(cluster, "agent", dependsOn=["fetch"], gate={"command": "exit 1"}),
        noted(cluster, "report", dependsOn=["agent"]),
        noted(cluster, "always", dependsOn=["fetch"], gate={"command": "true"}),
    ])
    create_workflow_loop(cluster)
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: [s for s in wf_runs(cluster) if s.terminal], 30, "the workflow run to end")
    state = wf_runs(cluster)[0]
    assert state.run["status"] == "succeeded", state.run
    assert step_states(cluster, state.run_id) == {
        "fetch": ("succeeded", None), "agent": ("skipped", "gate closed (exit 1)"),
        "report": ("skipped", "dependency gate closed: agent"), "always": ("succeeded", None)}
    assert sorted(steps_ledger(cluster)) == ["always", "fetch"]
