"""A workflow step whose requirements its run's worker lacks runs on a worker that has them (``remote_steps``), on
real ``loopsq worker`` processes: two workers on two "hosts" (``LOOPSQ_HOST``, and ``BOX`` for their steps to
write), one of them with the ``gpu`` label.
The step runs there once, its events and record name that worker; a cancel reaches it within a beat; a kill -9 of
its worker fails it within seconds, with no process left; a kill -9 of the run's worker ends it (also when the
run's end comes from another host); a workflow timeout stops it; a step nobody may run waits, says why, and its
job runs nothing once the run is over; two run at once on one worker, and a replay runs neither again; a job
that cannot be enqueued fails the step. Some workflow runs execute in this process, as on a worker without the
label (``Runtime.labels``), where the test needs a timeout, a replay or a fault.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain import timeutil
from loopsq.domain.timeutil import gen_id
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.engine.routing import enqueue_for_workflow
from loopsq.engine.runtime import Runtime
from loopsq.engine.workflow_runner import WorkflowOutcome, execute_workflow
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.procs import is_process_alive
from tests.integration.processes import KEYS, Cluster, Proc, open_cluster
from tests.integration.test_workflow_processes import live_group_members
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

PLAIN, GPU = "plain-box", "gpu-box"


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def plain_worker(cluster: Cluster) -> Proc:
    return cluster.start("worker", name="worker-plain", env={"LOOPSQ_HOST": PLAIN, "BOX": PLAIN})


def gpu_worker(cluster: Cluster, wait: bool = True) -> Proc:
    return cluster.start("worker", name="worker-gpu",
                         env={"LOOPSQ_HOST": GPU, "BOX": GPU, "LOOPSQ_WORKER_LABELS": "gpu"}, wait=wait)


def noted(cluster: Cluster, step_id: str, then: str = "true", **fields: Any) -> dict[str, Any]:
    """A step that appends ``<box> <step id>`` to the cluster's ``ledger-steps`` (``BOX``: the worker that ran it;
    a target sees none of loopsq's own ``LOOPSQ_*`` variables), then runs ``then``."""
    script = f'echo "$BOX $LOOPS_WORKFLOW_STEP_ID" >> {cluster.ledger_dir}/ledger-steps; {then}'
    return {"id": step_id, "target": {"type": "command", "command": script, "shell": True}, **fields}


def create_pipeline(cluster: Cluster, train: str = "true") -> dict[str, Any]:
    """``prep -> train(requires: [gpu]) -> report``, the workflow itself pinned to the plain worker's host."""
    body = workflow_body_from_json({"name": "pipeline", "steps": [
        noted(cluster, "prep"),
        noted(cluster, "train", train, dependsOn=["prep"], requires=["gpu"]),
        noted(cluster, "report", dependsOn=["train"]),
    ]})
    body["requires"] = [f"host:{PLAIN}"]  # (what the workflow's own ``requires`` stores)
    return WorkflowStore(cluster.client).create(body, timeutil.now())


def start_run(cluster: Cluster, spec: dict[str, Any]) -> str:
    """What ``workflows run`` enqueues, without waiting for the end."""
    run_id = gen_id()
    enqueue_for_workflow(cluster.client, KEYS, spec, run_id)
    return run_id


def store(cluster: Cluster) -> WorkflowRunStore:
    return WorkflowRunStore(cluster.client)


def ledger(cluster: Cluster) -> list[str]:
    path = cluster.ledger_dir / "ledger-steps"
    return path.read_text().splitlines() if path.exists() else []


def events(cluster: Cluster, run_id: str) -> list[dict[str, Any]]:
    listed = store(cluster).events(run_id, limit=10_000)
    assert [e["sequence"] for e in listed] == list(range(1, len(listed) + 1)), listed
    return listed


def shape(cluster: Cluster, run_id: str) -> list[tuple[str, str | None]]:
    return [(e["eventType"], e.get("stepId")) for e in events(cluster, run_id)]


def terminal(cluster: Cluster, run_id: str) -> dict[str, Any] | None:
    state = store(cluster).load(run_id)
    return state.run if state is not None and state.terminal else None


def running_train(cluster: Cluster, run_id: str) -> int | None:
    state = store(cluster).load(run_id)
    step = state.steps["train"] if state is not None else {}
    return int(step["pid"]) if step.get("status") == "running" and step.get("pid") else None


@pytest.mark.timeout(90)
def test_a_step_requiring_gpu_runs_once_on_the_gpu_worker_and_the_others_on_the_workflow_runs_worker(
    cluster: Cluster,
) -> None:
    plain, gpu = plain_worker(cluster), gpu_worker(cluster)
    create_pipeline(cluster)
    out = cluster.cli("workflows", "run", "pipeline").stdout
    run_id = out.split()[0]
    assert out.splitlines()[0] == f"{run_id} succeeded", out
    assert ledger(cluster) == [f"{PLAIN} prep", f"{GPU} train", f"{PLAIN} report"]
    state = store(cluster).require(run_id)
    assert state.run["workerId"] == cluster.worker_id(plain)
    steps = state.steps
    assert (steps["train"]["workerId"], steps["train"]["host"]) == (cluster.worker_id(gpu), GPU)
    assert (steps["prep"]["host"], steps["report"]["host"]) == (PLAIN, PLAIN)
    assert "workerId" not in steps["prep"]
    assert shape(cluster, run_id) == [
        ("created", None),
        ("step_started", "prep"), ("step_succeeded", "prep"),
        ("step_queued", "train"), ("step_started", "train"), ("step_succeeded", "train"),
        ("step_started", "report"), ("step_succeeded", "report"),
        ("succeeded", None),
    ]
    listed = events(cluster, run_id)
    assert listed[3]["payload"] == {"requires": ["gpu"], "queue": "loopsq+gpu"}
    assert listed[4]["payload"] == {"workerId": cluster.worker_id(gpu), "host": GPU}
    assert "claimed" in gpu.text() and "claimed" not in plain.text()
    # The CLI (through the mirror) lists the same events.
    printed = [line.split()[1:3] for line in cluster.cli("workflows", "events", run_id).stdout.splitlines()]
    assert printed == [[kind, step or "-"] for kind, step in shape(cluster, run_id)]
    # Its lease went with its end; nothing is left queued.
    assert not cluster.client.exists(KEYS.lease(f"step:{run_id}:train"))
    assert cluster.client.llen("rq:queue:loopsq+gpu") == 0


@pytest.mark.timeout(90)
def test_a_cancel_of_the_workflow_run_kills_the_remote_step_within_a_beat_and_the_run_ends_cancelled(
    cluster: Cluster,
) -> None:
    plain_worker(cluster)
    gpu = gpu_worker(cluster)
    run_id = start_run(cluster, create_pipeline(cluster, "sleep 30"))
    pid = cluster.wait_until(lambda: running_train(cluster, run_id), 30, "train to run on the gpu worker")
    assert is_process_alive(pid)
    cluster.cli("workflows", "cancel", run_id)
    cluster.wait_until(lambda: not live_group_members(pid), 3, "the remote step's process group to be gone")
    run = cluster.wait_until(lambda: terminal(cluster, run_id), 10, "the run to end")
    assert run["status"] == "cancelled"
    steps = store(cluster).require(run_id).steps
    assert {k: v["status"] for k, v in steps.items()} == {"prep": "succeeded", "train": "cancelled",
                                                          "report": "cancelled"}
    assert ledger(cluster) == [f"{PLAIN} prep", f"{GPU} train"]
    assert shape(cluster, run_id)[-3:] == [("step_cancelled", "train"), ("step_cancelled", "report"),
                                           ("cancelled", None)]
    # The gpu worker recorded nothing after the cancel (the cancel did), and goes on serving. (Whichever cancel key
    # its beat read first, the run's or the step's that the run's worker set on seeing the cancel, is the reason.)
    assert "train stopped: cancelled" in gpu.text()
    assert gpu.alive()


@pytest.mark.timeout(90)
def test_a_remote_worker_killed_mid_step_fails_the_step_within_seconds_and_leaves_no_process(
    cluster: Cluster,
) -> None:
    plain_worker(cluster)
    gpu = gpu_worker(cluster)
    run_id = start_run(cluster, create_pipeline(cluster, "sleep 60"))
    pid = cluster.wait_until(lambda: running_train(cluster, run_id), 30, "train to run on the gpu worker")
    gpu_id = cluster.worker_id(gpu)
    gpu.kill9()
    # (Its liveness key lasts 1.5 s; the step's lease would last 10 s; the step's timeout is none.)
    run = cluster.wait_until(lambda: terminal(cluster, run_id), 15, "the run to end after its step's worker died")
    train = store(cluster).require(run_id).steps["train"]
    assert (train["status"], train["error"]) == ("failed", f"worker {gpu_id} died before completion")
    assert (run["status"], run["error"]) == ("failed", f"step train failed: worker {gpu_id} died before completion")
    report = store(cluster).require(run_id).steps["report"]  # (as after any blocking failure)
    assert (report["status"], report["error"]) == ("skipped", f"step train failed: worker {gpu_id} died before completion")
    cluster.wait_until(lambda: not live_group_members(pid), 5, "no process of the step to be left")
    assert ledger(cluster) == [f"{PLAIN} prep", f"{GPU} train"]  # not run again
    assert shape(cluster, run_id)[-4:] == [("step_started", "train"), ("step_failed", "train"),
                                           ("step_skipped", "report"), ("failed", None)]


@pytest.mark.timeout(90)
def test_the_workflow_runs_worker_killed_mid_step_fails_the_run_and_the_remote_step_stops(cluster: Cluster) -> None:
    plain = plain_worker(cluster)
    gpu = gpu_worker(cluster)
    run_id = start_run(cluster, create_pipeline(cluster, "sleep 60"))
    pid = cluster.wait_until(lambda: running_train(cluster, run_id), 30, "train to run on the gpu worker")
    plain_id = cluster.worker_id(plain)
    plain.kill9()
    # The gpu worker's reaper fails the run (a step of it runs on its host); the end's cancel key stops the step.
    run = cluster.wait_until(lambda: terminal(cluster, run_id), 15, "the run to be failed by recovery")
    assert (run["status"], run["error"]) == ("failed", f"worker {plain_id} died before completion")
    cluster.wait_until(lambda: not live_group_members(pid), 5, "the remote step's process to be gone")
    assert ledger(cluster) == [f"{PLAIN} prep", f"{GPU} train"]
    assert gpu.alive()


@pytest.mark.timeout(90)
def test_a_step_no_live_worker_may_run_waits_saying_why_and_its_job_runs_nothing_once_the_run_is_over(
    cluster: Cluster,
) -> None:
    plain = plain_worker(cluster)
    run_id = start_run(cluster, create_pipeline(cluster))

    def queued() -> dict[str, Any] | None:
        return next((e for e in events(cluster, run_id) if e["eventType"] == "step_queued"), None)

    event = cluster.wait_until(queued, 30, "train to be queued")
    assert event["payload"] == {"requires": ["gpu"], "queue": "loopsq+gpu", "waiting": "no live worker has labels gpu"}
    assert "step train waits in queue loopsq+gpu: no live worker has labels gpu" in plain.text()
    assert store(cluster).require(run_id).steps["train"]["status"] == "pending"
    cluster.cli("workflows", "cancel", run_id)
    cluster.wait_until(lambda: terminal(cluster, run_id), 10, "the run to end")
    # The job is still queued; the gpu worker that comes now takes it and runs nothing.
    assert cluster.client.llen("rq:queue:loopsq+gpu") == 1
    gpu = gpu_worker(cluster)
    cluster.wait_until(lambda: "nothing to run" in gpu.text(), 20, "the gpu worker to take the stale job")
    assert ledger(cluster) == [f"{PLAIN} prep"]
    state = store(cluster).require(run_id)
    assert (state.run["status"], state.steps["train"]["status"]) == ("cancelled", "cancelled")
    assert json.loads(str(cluster.client.hget(KEYS.wf_steps(run_id), "train")))["remote"]["queue"] == "loopsq+gpu"


@pytest.mark.timeout(120)
def test_a_workflow_loop_runs_worker_killed_mid_step_has_its_remote_step_stopped_by_the_runs_end(
    cluster: Cluster,
) -> None:
    """The loop run is recovered from the scheduler's host (neither worker's), which fails the workflow run with
    its parent: only that end's cancel key, which the step's worker watches too, stops the step."""
    create_pipeline(cluster, "sleep 60")
    at = timeutil.to_iso(timeutil.now() + timedelta(seconds=1))
    cluster.cli("create", "workflow", "wfloop", "--workflow", "pipeline", "--at", at)
    cluster.start("scheduler", env={"LOOPSQ_HOST": "sched-box"})
    plain = plain_worker(cluster)  # alone: the loop run can go nowhere else

    def run_id() -> str | None:
        ids = [str(i) for i in cluster.client.zrange(KEYS.wf_runs, 0, -1)]
        return ids[0] if ids else None

    wf_run_id = cluster.wait_until(run_id, 30, "the workflow loop's run")
    cluster.wait_until(lambda: store(cluster).require(wf_run_id).steps["train"]["status"] == "pending"
                       and store(cluster).require(wf_run_id).steps["prep"]["status"] == "succeeded", 20,
                       "train to be queued")
    gpu = gpu_worker(cluster)
    pid = cluster.wait_until(lambda: running_train(cluster, wf_run_id), 30, "train to run on the gpu worker")
    plain.kill9()
    run = cluster.wait_until(lambda: terminal(cluster, wf_run_id), 30, "the loop run's recovery to fail the run")
    assert run["status"] == "failed" and run["error"].startswith("parent loop run abandoned: worker "), run
    cluster.wait_until(lambda: not live_group_members(pid), 3, "the remote step's process to be gone")
    assert "train stopped: parent loop run abandoned" in gpu.text()
    assert ledger(cluster) == [f"{PLAIN} prep", f"{GPU} train"]


@pytest.mark.timeout(90)
def test_the_workflow_timeout_stops_a_remote_step_and_records_it_timed_out(cluster: Cluster) -> None:
    gpu = gpu_worker(cluster)
    body = workflow_body_from_json({"name": "slow", "steps": [noted(cluster, "train", "sleep 30",
                                                                    requires=["gpu"])]})
    spec = WorkflowStore(cluster.client).create(body, timeutil.now())
    # The workflow run executes in this process, as on a worker without the gpu label, with a workflow loop's
    # timeout.
    rt = Runtime(client=cluster.client, role="test").start()
    rt.labels = [f"host:{PLAIN}"]
    outcomes: list[WorkflowOutcome] = []
    thread = threading.Thread(target=lambda: outcomes.append(execute_workflow(rt, spec, timeout_ms=4_000)))
    try:
        thread.start()
        run_id = cluster.wait_until(lambda: rt.held_ids(), 10, "the workflow run to start")[0]
        pid = cluster.wait_until(lambda: running_train(cluster, run_id), 10, "train to run on the gpu worker")
        thread.join(timeout=30)
    finally:
        rt.stop()
    (outcome,) = outcomes
    assert (outcome.status, outcome.error) == ("timed_out", "step train timed_out: workflow timed out after 4000ms")
    train = store(cluster).require(run_id).steps["train"]
    assert (train["status"], train["error"]) == ("timed_out", "workflow timed out after 4000ms")
    assert train["workerId"] == cluster.worker_id(gpu)
    cluster.wait_until(lambda: not live_group_members(pid), 3, "the gpu worker to stop the step")
    assert "train stopped: workflow timed out after 4000ms" in gpu.text()
    assert shape(cluster, run_id) == [("created", None), ("step_queued", "train"), ("step_started", "train"),
                                      ("step_timed_out", "train"), ("timed_out", None)]


@pytest.mark.timeout(60)
def test_a_step_whose_job_cannot_be_enqueued_fails_with_the_reason_and_fails_the_run(
    real_redis: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from loopsq.engine import remote_steps

    def refuse(*_args: Any, **_kwargs: Any) -> str:
        raise RuntimeError("OOM command not allowed")

    monkeypatch.setattr(remote_steps.timers, "enqueue", refuse)
    body = workflow_body_from_json({"name": "refused", "steps": [
        {"id": "train", "requires": ["gpu"], "target": {"type": "command", "command": "true"}},
        {"id": "after", "target": {"type": "command", "command": "true"}},
    ]})
    spec = WorkflowStore(real_redis).create(body, timeutil.now())
    rt = Runtime(client=real_redis, role="test").start()
    rt.labels = [f"host:{PLAIN}"]
    try:
        outcome = execute_workflow(rt, spec)
    finally:
        rt.stop()
    error = "could not hand the step to a worker: OOM command not allowed"
    assert (outcome.status, outcome.error) == ("failed", f"step train failed: {error}")
    steps = WorkflowRunStore(real_redis).require(outcome.run_id).steps
    assert (steps["train"]["status"], steps["train"]["error"]) == ("failed", error)
    assert steps["after"]["status"] == "skipped"  # (a blocking failure, as any)
    assert WorkflowRunStore(real_redis).events(outcome.run_id)[2]["eventType"] == "step_failed"


@pytest.mark.timeout(90)
def test_two_remote_steps_run_at_once_on_one_gpu_worker_and_a_replay_of_the_run_runs_neither_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BOX", "here")  # (the steps this process runs itself)
    gpu = cluster.start("worker", name="worker-gpu", env={"LOOPSQ_HOST": GPU, "BOX": GPU, "LOOPSQ_WORKER_LABELS": "gpu",
                                                          "LOOPSQ_WORKER_CONCURRENCY": "2"})
    # Each of a and b waits (up to 10 s) for the other to have started: they pass only when they run at once.
    both = (f"touch {cluster.tmp}/$LOOPS_WORKFLOW_STEP_ID.on; for i in $(seq 100); do "
            f"[ -e {cluster.tmp}/a.on ] && [ -e {cluster.tmp}/b.on ] && exit 0; sleep 0.1; done; exit 1")
    body = workflow_body_from_json({"name": "fan", "maxParallel": 2, "steps": [
        noted(cluster, "a", both, requires=["gpu"]), noted(cluster, "b", both, requires=["gpu"]),
        noted(cluster, "join", dependsOn=["a", "b"]),
    ]})
    spec = WorkflowStore(cluster.client).create(body, timeutil.now())
    rt = Runtime(client=cluster.client, role="test").start()
    rt.labels = [f"host:{PLAIN}"]
    try:
        first = execute_workflow(rt, spec, idempotency_key="nightly")
        again = execute_workflow(rt, spec, idempotency_key="nightly")
    finally:
        rt.stop()
    assert (first.status, again.status, again.replayed, again.run_id) == ("succeeded", "succeeded", True, first.run_id)
    assert sorted(ledger(cluster)) == [f"{GPU} a", f"{GPU} b", "here join"]
    steps = store(cluster).require(first.run_id).steps
    assert steps["a"]["workerId"] == steps["b"]["workerId"] == cluster.worker_id(gpu)
    assert cluster.client.llen("rq:queue:loopsq+gpu") == 0
