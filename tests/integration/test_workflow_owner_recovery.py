"""A workflow run of its own (``workflows run``, the API, the SDK) whose worker died is failed by maintenance, its
live step processes on this host killed first; nothing else would ever end it. In this process against the
session's private redis-server, and with real processes and kill -9."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from loopsq.domain import timeutil
from loopsq.domain.timeutil import gen_id
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.engine import maintenance, recovery
from loopsq.engine.runtime import Runtime
from loopsq.state.keys import Keys
from loopsq.state.workflow_run_state import WorkflowRunState
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.procs import is_process_alive, process_start_time
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()
SPEC = {"name": "two", "steps": [
    {"id": "a", "target": {"type": "command", "command": "sleep 30", "shell": True}},
    {"id": "b", "dependsOn": ["a"], "target": {"type": "command", "command": "true", "shell": True}},
]}


@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    # Its liveness key is a worker's; role "test" runs no reaper of its own in the background.
    runtime = Runtime(client=real_redis, role="test").start()
    yield runtime
    runtime.stop()


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def started_run(rt: Runtime, owner: str, **parent: Any) -> tuple[WorkflowRunStore, WorkflowRunState]:
    """A run owned by ``owner`` whose step ``a`` runs (no process yet)."""
    spec = rt.workflows.create(workflow_body_from_json(SPEC, f"two-{gen_id()}"), timeutil.now())
    store = WorkflowRunStore(rt.client, rt.keys, rt.committer)
    state, _ = store.create(spec, timeutil.now(), owner=owner, **parent)
    assert store.start_step(state, "a", timeutil.now())
    return store, state


def test_a_run_whose_worker_died_fails_and_its_live_step_process_is_killed_first(rt: Runtime) -> None:
    store, state = started_run(rt, "worker:gone:1:abc")
    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert store.mark_step_pid(state, "a", timeutil.now(), pid=child.pid,
                                   start_time=process_start_time(child.pid), host=rt.owner.host)
        report = maintenance.maintain(rt)
        assert report.workflows_failed == 1
        assert child.wait(timeout=5) == -9
    finally:
        if child.poll() is None:
            child.kill()
    final = store.require(state.run_id)
    error = "worker worker:gone:1:abc died before completion"
    assert (final.run["status"], final.run["error"]) == ("failed", error)
    assert {s["stepId"]: s["status"] for s in final.ordered_steps()} == {"a": "skipped", "b": "skipped"}
    last = store.events(state.run_id)[-1]
    assert (last["eventType"], last["payload"]) == ("failed", {"error": error})
    assert not rt.client.sismember(rt.keys.wf_running, state.run_id)
    assert maintenance.maintain(rt).workflows_failed == 0  # once


def test_a_run_whose_worker_lives_or_that_belongs_to_a_loop_run_is_left_alone(rt: Runtime) -> None:
    _, mine = started_run(rt, rt.owner.worker_id)  # this runtime's liveness key is set
    _, child_of_loop_run = started_run(rt, "worker:gone:2:def",
                                       loop_run={"id": "lr1", "attempt": 1, "scheduledFor": "x"})
    assert maintenance.maintain(rt).workflows_failed == 0
    store = WorkflowRunStore(rt.client, rt.keys, rt.committer)
    assert store.require(mine.run_id).run["status"] == "running"
    assert store.require(child_of_loop_run.run_id).run["status"] == "running"
    assert rt.client.smembers(rt.keys.wf_running) == {mine.run_id, child_of_loop_run.run_id}


def test_ended_runs_leave_the_running_set(rt: Runtime) -> None:
    store, state = started_run(rt, rt.owner.worker_id)
    store.cancel(state.run_id, timeutil.now())
    assert not rt.client.sismember(rt.keys.wf_running, state.run_id)
    # One left behind by an older version is cleaned up by maintenance.
    rt.client.sadd(rt.keys.wf_running, state.run_id)
    maintenance.maintain(rt)
    assert not rt.client.sismember(rt.keys.wf_running, state.run_id)


@pytest.mark.timeout(60)
def test_a_worker_killed_mid_workflow_run_has_the_run_failed_within_fifteen_seconds(cluster: Cluster) -> None:
    WorkflowStore(cluster.client, KEYS).create(workflow_body_from_json(SPEC), timeutil.now())
    victim = cluster.start("worker")
    # `workflows run` enqueues the run on a worker and waits for it.
    waiting = subprocess.Popen([sys.executable, "-m", "loopsq", "workflows", "run", "two"], env=cluster.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cluster.tmp)
    store = WorkflowRunStore(cluster.client, KEYS)

    def step_pid() -> tuple[str, int] | None:
        ids = store.ids()
        state = store.load(ids[0]) if ids else None
        return (state.run_id, int(state.steps["a"]["pid"])) if state and state.steps["a"].get("pid") else None

    run_id, pid = cluster.wait_until(step_pid, 15, "step a to start on the victim")
    start_time = process_start_time(pid)
    victim.kill9()
    killed_at = time.monotonic()
    # No scheduler yet: the waiting CLI notices the worker's liveness key expire and says so.
    out, err = waiting.communicate(timeout=20)
    assert (waiting.returncode, out) == (1, "")
    assert err == (f"workflow run {run_id} queued\n"
                   f"error: the worker running workflow run {run_id} died; maintenance (`loopsq scheduler`) "
                   "records the run failed; run the workflow again\n")
    cluster.start("scheduler")
    final = cluster.wait_until(lambda: (s := store.load(run_id)) and s.terminal and s, 15, "the run to end")
    assert time.monotonic() - killed_at <= 15
    assert final.run["status"] == "failed"
    assert final.run["error"] == f"worker {cluster.worker_id(victim)} died before completion"
    assert not is_process_alive(pid, start_time)


def test_a_run_with_a_step_on_another_live_host_is_left_to_a_worker_there(rt: Runtime) -> None:
    store, state = started_run(rt, "worker:gone:3:fed")
    assert store.mark_step_pid(state, "a", timeutil.now(), pid=2**22 + 1, start_time=1.0, host="host-b")
    rt.client.hset(rt.keys.hosts, "host-b", str(timeutil.to_ms(timeutil.now())))  # a worker beats there
    assert recovery.recover_workflow_runs(rt, timeutil.now()) == 0
    # A worker on host-b reaps it (its step's process is not alive there).
    assert recovery.recover_workflow_runs(rt, timeutil.now(), host="host-c") == 0
    assert recovery.recover_workflow_runs(rt, timeutil.now(), host="host-b") == 1
    assert store.require(state.run_id).run["status"] == "failed"


def test_a_run_with_a_step_on_a_host_without_live_workers_is_failed_by_maintenance(rt: Runtime) -> None:
    store, state = started_run(rt, "worker:gone:4:cab")
    assert store.mark_step_pid(state, "a", timeutil.now(), pid=2**22 + 1, start_time=1.0, host="host-b")
    stale = timeutil.to_ms(timeutil.now()) - 60_000
    rt.client.hset(rt.keys.hosts, "host-b", str(stale))  # its last worker beat a minute ago
    assert recovery.recover_workflow_runs(rt, timeutil.now()) == 1
    assert store.require(state.run_id).run["status"] == "failed"
