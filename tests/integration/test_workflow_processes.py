"""Workflow runs on real ``loopsq worker`` and ``loopsq scheduler`` processes: cancel from another process, a
worker killed with kill -9 mid-workflow, and recover refused while a step process still lives (issue #5)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain import timeutil
from loopsq.state.workflow_run_state import WorkflowRunState
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.system.procs import is_process_alive
from tests.integration.processes import KEYS, Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration



@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def noted(cluster: Cluster, step_id: str, then: str = "true", **fields: Any) -> dict[str, Any]:
    """A step that appends its id to the cluster's ``ledger-steps``, then runs ``then``."""
    script = f'echo "$LOOPS_WORKFLOW_STEP_ID" >> {cluster.ledger_dir}/ledger-steps; {then}'
    return {"id": step_id, "target": {"type": "command", "command": script, "shell": True}, **fields}


def create_workflow(cluster: Cluster, steps: list[dict[str, Any]]) -> str:
    """``loopsq workflows create`` of a spec named ``wf``; returns its id."""
    path = cluster.tmp / "wf.json"
    path.write_text(json.dumps({"name": "wf", "steps": steps}))
    out = cluster.cli("workflows", "create", str(path)).stdout
    assert out.startswith("created workflow ") and out.endswith(f" (wf) steps={len(steps)}\n"), out
    return out.split()[2]


def create_workflow_loop(cluster: Cluster, *options: str) -> str:
    """A workflow loop ``wfloop`` of ``wf`` due in a second; returns its id."""
    at = timeutil.to_iso(timeutil.now() + timedelta(seconds=1))
    out = cluster.cli("create", "workflow", "wfloop", "--workflow", "wf", "--at", at, *options).stdout
    assert out.startswith("created workflow loop ") and f"(wfloop) workflow=wf next={at}" in out, out
    return out.split()[3]


def live_group_members(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that have not exited (zombies awaiting a reaper excluded)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry))
    return members


def steps_ledger(cluster: Cluster) -> list[str]:
    path = cluster.ledger_dir / "ledger-steps"
    return path.read_text().split() if path.exists() else []


def wf_store(cluster: Cluster) -> WorkflowRunStore:
    return WorkflowRunStore(cluster.client)


def wf_runs(cluster: Cluster) -> list[WorkflowRunState]:
    """Every workflow run, oldest first."""
    store = wf_store(cluster)
    ids = [str(i) for i in cluster.client.zrange(KEYS.wf_runs, 0, -1)]
    return [s for s in (store.load(i) for i in ids) if s is not None]


def running_step(cluster: Cluster, step_id: str) -> tuple[str, int] | None:
    """(run id, pid) of the first workflow run whose ``step_id`` runs with a recorded pid."""
    for state in wf_runs(cluster):
        s = state.steps[step_id]
        if s["status"] == "running" and s.get("pid"):
            return state.run_id, int(s["pid"])
    return None


def event_shape(cluster: Cluster, run_id: str) -> list[tuple[str, str | None]]:
    """(eventType, stepId) of every event, after checking the sequences are exactly 1..n."""
    listed = wf_store(cluster).events(run_id, limit=10_000)
    assert [e["sequence"] for e in listed] == list(range(1, len(listed) + 1)), listed
    return [(e["eventType"], e.get("stepId")) for e in listed]


def step_states(cluster: Cluster, run_id: str) -> dict[str, tuple[str, str | None]]:
    return {s["stepId"]: (s["status"], s.get("error")) for s in wf_store(cluster).require(run_id).ordered_steps()}


@pytest.mark.timeout(60)
def test_cancel_from_another_process_kills_the_step_within_a_second_and_fails_the_workflow_loop_run(
    cluster: Cluster,
) -> None:
    create_workflow(cluster, [noted(cluster, "a", "sleep 30"), noted(cluster, "b", dependsOn=["a"])])
    create_workflow_loop(cluster)
    cluster.start("scheduler")
    cluster.start("worker")
    run_id, pid = cluster.wait_until(lambda: running_step(cluster, "a"), 20, "step a to run on the worker")
    loop_run_id = wf_store(cluster).require(run_id).run["loopRunId"]

    cancelled = cluster.cli("workflows", "cancel", run_id)
    returned = time.monotonic()
    assert cancelled.stdout == f"{run_id} cancelled\n"
    deadline = returned + 1.5
    while is_process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.005)
    lag = time.monotonic() - returned
    assert not is_process_alive(pid), f"step a (pid {pid}) still alive 1.5 s after the cancel\n{cluster.logs()}"
    assert lag <= 1.5, lag

    final = cluster.wait_until(lambda: (r := cluster.run(loop_run_id)) and r.terminal and r, 10, "the loop run to end")
    assert (final.status, final.error, final.exit_code) == ("failed", "cancelled by user", 1)
    run = wf_store(cluster).require(run_id).run
    assert (run["status"], run["error"]) == ("cancelled", "cancelled by user")
    assert step_states(cluster, run_id) == {"a": ("cancelled", "cancelled by user"),
                                            "b": ("cancelled", "cancelled by user")}
    assert event_shape(cluster, run_id) == [("created", None), ("step_started", "a"), ("step_cancelled", "a"),
                                            ("step_cancelled", "b"), ("cancelled", None)]
    assert steps_ledger(cluster) == ["a"]


@pytest.mark.timeout(90)
def test_a_worker_killed_mid_workflow_has_the_loop_run_retried_as_a_new_workflow_run_that_succeeds(
    cluster: Cluster,
) -> None:
    create_workflow(cluster, [noted(cluster, "a", "sleep 3"), noted(cluster, "b", dependsOn=["a"])])
    loop_id = create_workflow_loop(cluster, "--attempts", "2", "--retry-delay", "500ms")
    cluster.start("scheduler")
    victim = cluster.start("worker")
    first_id, pid = cluster.wait_until(lambda: running_step(cluster, "a"), 20, "step a to run on the victim")
    survivor = cluster.start("worker")
    victim.kill9()
    killed_at = time.monotonic()
    victim_id = cluster.worker_id(victim)
    loop_run_id = wf_store(cluster).require(first_id).run["loopRunId"]

    def retried() -> bool:
        current = cluster.run(loop_run_id)
        return bool(current and current.attempt == 2)

    cluster.wait_until(retried, 15, "attempt 2 of the loop run")
    assert time.monotonic() - killed_at <= 15
    assert not is_process_alive(pid), "the dead worker's step process was left running"

    # The first workflow run failed with its parent (saying why): open steps skipped (each with its event), then
    # one `failed` event.
    parent_gone = f"parent loop run abandoned: worker {victim_id} died before completion"
    first = wf_store(cluster).require(first_id)
    assert (first.run["status"], first.run["error"]) == ("failed", parent_gone)
    assert step_states(cluster, first_id) == {"a": ("skipped", parent_gone), "b": ("skipped", parent_gone)}
    assert event_shape(cluster, first_id) == [("created", None), ("step_started", "a"), ("step_skipped", "a"),
                                              ("step_skipped", "b"), ("failed", None)]
    assert wf_store(cluster).events(first_id)[4]["payload"] == {"error": parent_gone, "loopRunId": loop_run_id}
    abandoned = [c for c in cluster.changes() if c["type"] == "run_abandoned"]
    assert [row["error"] for c in abandoned for row in c["data"]["upsert"]["loop_runs"]] == [
        f"worker {victim_id} died before completion"
    ]

    final = cluster.wait_until(lambda: (r := cluster.run(loop_run_id)) and r.terminal and r, 20, "attempt 2 to end")
    assert (final.status, final.attempt, final.worker_id) == ("succeeded", 2, cluster.worker_id(survivor))
    (second_id,) = [s.run_id for s in wf_runs(cluster) if s.run_id != first_id]
    second = wf_store(cluster).require(second_id).run
    assert (second["status"], second["loopRunId"]) == ("succeeded", loop_run_id)
    assert second["idempotencyKey"] == f"{loop_id}:{final.scheduled_for}:attempt:2"
    assert first.run["idempotencyKey"] == f"{loop_id}:{final.scheduled_for}:attempt:1"
    assert event_shape(cluster, second_id) == [
        ("created", None), ("step_started", "a"), ("step_succeeded", "a"), ("step_started", "b"),
        ("step_succeeded", "b"), ("succeeded", None),
    ]
    assert steps_ledger(cluster) == ["a", "a", "b"]


@pytest.mark.timeout(60)
def test_recover_is_refused_while_the_step_process_of_a_killed_worker_lives_and_allowed_once_it_died(
    cluster: Cluster,
) -> None:
    create_workflow(cluster, [noted(cluster, "a", "sleep 30"), noted(cluster, "b")])
    worker = cluster.start("worker")
    waiting = subprocess.Popen([sys.executable, "-m", "loopsq", "workflows", "run", "wf"], env=cluster.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        run_id, pid = cluster.wait_until(lambda: running_step(cluster, "a"), 20, "step a to run on the worker")
        worker.kill_watchdog()  # else the step's group would die with the worker
        worker.kill9()
        assert is_process_alive(pid)  # orphaned, still running: its outcome can no longer be recorded

        refused = cluster.cli("workflows", "recover", run_id, check=False)
        assert (refused.returncode, refused.stdout) == (2, "")
        assert refused.stderr == (f"error: cannot recover workflow run while step processes are still alive: "
                                  f"a pid={pid}\n")

        os.killpg(pid, signal.SIGKILL)
        cluster.wait_until(lambda: not is_process_alive(pid), 5, "the orphaned step to die")
        assert cluster.cli("workflows", "recover", run_id).stdout == f"{run_id} recovered=1\n"
        state = wf_store(cluster).require(run_id)
        assert state.run["status"] == "running"  # recover changes no run status and executes nothing
        assert step_states(cluster, run_id) == {"a": ("pending", "manual recovery"), "b": ("pending", None)}
        assert "pid" not in state.steps["a"] and "startedAt" not in state.steps["a"]
        assert event_shape(cluster, run_id) == [("created", None), ("step_started", "a"), ("recovered", None)]
        assert wf_store(cluster).events(run_id)[2]["payload"] == {"reason": "manual recovery",
                                                                  "recoveredSteps": ["a"]}
        again = cluster.cli("workflows", "recover", run_id, "--reason", "again")
        assert again.stdout == f"{run_id} recovered=0\n"
        assert len(wf_store(cluster).events(run_id)) == 3
    finally:
        waiting.kill()
        waiting.communicate(timeout=10)


@pytest.mark.timeout(60)
def test_a_workflow_loop_created_with_a_50ms_timeout_times_out_on_a_worker_before_the_steps_side_effect(
    cluster: Cluster,
) -> None:
    side_effect = cluster.tmp / "side-effect"
    create_workflow(cluster, [noted(cluster, "slow", f"sleep 1; touch {side_effect}"), noted(cluster, "after")])
    loop_id = create_workflow_loop(cluster, "--timeout", "50ms")
    target = cluster.loop("wfloop")["target"]
    assert (target["type"], target["timeoutMs"]) == ("workflow", 50)
    cluster.start("scheduler")
    cluster.start("worker")
    loop_run = cluster.wait_until(lambda: next((r for r in cluster.runs("wfloop") if r.terminal), None), 20,
                                  "the loop run to end")
    error = "step slow timed_out: workflow timed out after 50ms"
    assert (loop_run.status, loop_run.error) == ("timed_out", error)
    (state,) = wf_runs(cluster)
    assert (state.run["status"], state.run["error"], state.run["loopId"]) == ("timed_out", error, loop_id)
    assert step_states(cluster, state.run_id) == {"slow": ("timed_out", "workflow timed out after 50ms"),
                                                  "after": ("skipped", error)}
    assert event_shape(cluster, state.run_id) == [("created", None), ("step_started", "slow"),
                                                  ("step_timed_out", "slow"), ("step_skipped", "after"),
                                                  ("timed_out", None)]
    assert steps_ledger(cluster) == ["slow"]
    # No process of the step's group is left alive, so the side effect can never happen.
    pids = {row["pid"] for c in cluster.changes() for row in c["data"].get("upsert", {}).get("workflow_step_runs", [])
            if row.get("pid")}
    assert len(pids) == 1 and live_group_members(pids.pop()) == []
    assert not side_effect.exists()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("killer", ["the worker's watchdog", "maintenance, the watchdog dead"])
def test_a_killed_worker_leaves_no_parallel_step_process_running(cluster: Cluster, killer: str) -> None:
    path = cluster.tmp / "wf.json"
    path.write_text(json.dumps({"name": "wf", "maxParallel": 2, "steps": [
        noted(cluster, "a", "sleep 30"), noted(cluster, "b", "sleep 30")]}))
    cluster.cli("workflows", "create", str(path))
    create_workflow_loop(cluster, "--attempts", "1")
    cluster.start("scheduler")
    victim = cluster.start("worker")

    def both_running() -> list[int] | None:
        for state in wf_runs(cluster):
            pids = [int(s["pid"]) for s in state.steps.values() if s["status"] == "running" and s.get("pid")]
            if len(pids) == 2:
                return pids
        return None

    pids = cluster.wait_until(both_running, 20, "both steps to run")
    if killer != "the worker's watchdog":
        victim.kill_watchdog()
    victim.kill9()
    # The watchdog kills them at once; without it, maintenance on this host does once the worker's liveness expired.
    cluster.wait_until(lambda: all(not is_process_alive(pid) for pid in pids), 2 if killer == "the worker's watchdog"
                       else 15, f"{killer} to kill both orphaned step groups")
    cluster.wait_until(lambda: all(s.terminal for s in wf_runs(cluster)), 10, "the workflow run to fail")
