"""The rules of workflow execution (reference §5.4 to §5.6, §5.8), each its own test, in this process against the
session's private redis-server: real step processes, real Redis transitions, the exact event sequence.

Every test reads back the complete event list of its run and checks that the sequences are 1..n with no gap.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from loopsq.domain import timeutil
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.engine import runner
from loopsq.engine.runtime import Runtime
from loopsq.engine.workflow_runner import WorkflowOutcome, execute_workflow
from loopsq.errors import ConflictError
from loopsq.sdk import LoopsClient
from loopsq.state.keys import Keys
from loopsq.state.workflow_run_state import WorkflowRunState
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.procs import is_process_alive

pytestmark = pytest.mark.integration

KEYS = Keys()
FAILED_B = "step b failed: process exited with code 1"


# -- helpers ------------------------------------------------------------------------------------------------
@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    """A started Runtime (its beat carries cancel requests to the executing run) on the flushed server."""
    runtime = Runtime(client=real_redis, role="test").start()
    yield runtime
    runtime.stop()


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """A file each step appends ``<stepId>`` to when it runs (and finishes its work)."""
    return tmp_path / "ledger"


def step(step_id: str, script: str = "true", **fields: Any) -> dict[str, Any]:
    """A step running ``script`` with ``sh -c``."""
    return {"id": step_id, "target": {"type": "command", "command": script, "shell": True}, **fields}


def noted(ledger: Path, step_id: str, then: str = "true", **fields: Any) -> dict[str, Any]:
    """A step that records itself in the ledger, then runs ``then`` (its exit status is the step's)."""
    return step(step_id, f'echo "$LOOPS_WORKFLOW_STEP_ID" >> {ledger}; {then}', **fields)


def ran(ledger: Path) -> list[str]:
    return ledger.read_text().split() if ledger.exists() else []


def workflow(client: redis.Redis, steps: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """Validate and store a workflow spec named ``wf``."""
    return WorkflowStore(client).create(workflow_body_from_json({"name": "wf", "steps": steps, **extra}),
                                        timeutil.now())


def store(rt: Runtime) -> WorkflowRunStore:
    return WorkflowRunStore(rt.client, rt.keys)


def events(rt: Runtime, run_id: str) -> list[dict[str, Any]]:
    """The run's complete event list, after checking its sequences are exactly 1..n."""
    listed = store(rt).events(run_id, limit=10_000)
    assert [e["sequence"] for e in listed] == list(range(1, len(listed) + 1)), listed
    assert all(e["workflowRunId"] == run_id for e in listed)
    return listed


def shape(listed: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    """(eventType, stepId) of each event."""
    return [(e["eventType"], e.get("stepId")) for e in listed]


def payloads(listed: list[dict[str, Any]]) -> list[Any]:
    return [e.get("payload") for e in listed]


def steps_of(rt: Runtime, run_id: str) -> dict[str, tuple[str, str | None]]:
    """stepId -> (status, error)."""
    return {s["stepId"]: (s["status"], s.get("error")) for s in store(rt).require(run_id).ordered_steps()}


def step_snapshots(client: redis.Redis, run_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every snapshot of each step run written to the change stream, in order (for transition checks)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for _id, fields in client.xrange(KEYS.changes):
        for row in json.loads(fields["data"]).get("upsert", {}).get("workflow_step_runs", []):
            if row["workflowRunId"] == run_id:
                out.setdefault(row["stepId"], []).append(row)
    return out


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


def _in_thread(rt: Runtime, spec: dict[str, Any], **kwargs: Any) -> tuple[threading.Thread, list[WorkflowOutcome]]:
    result: list[WorkflowOutcome] = []
    thread = threading.Thread(target=lambda: result.append(execute_workflow(rt, spec, **kwargs)), daemon=True)
    thread.start()
    return thread, result


def _wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.01)
    return value


def _running_pid(rt: Runtime, step_id: str) -> tuple[str, int] | None:
    for run_id in store(rt).ids():
        state = store(rt).load(run_id)
        if state is not None and state.steps[step_id].get("pid"):
            return run_id, int(state.steps[step_id]["pid"])
    return None


def created_payload(spec: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"workflowId": spec["id"], "workflowName": "wf", "stepCount": len(spec["steps"]), **extra}


# -- order, transitions, events -----------------------------------------------------------------------------
def test_steps_run_in_dependency_first_declaration_order_with_every_event_in_a_gap_free_sequence(
    rt: Runtime, ledger: Path
) -> None:
    # Declared c, a, b; c needs b, b needs a: the execution order is a, b, c (DFS, dependencies first).
    spec = workflow(rt.client, [noted(ledger, "c", dependsOn=["b"]), noted(ledger, "a"),
                                noted(ledger, "b", dependsOn=["a"])])
    outcome = execute_workflow(rt, spec)
    assert (outcome.status, outcome.exit_code, outcome.error, outcome.replayed) == ("succeeded", 0, None, False)
    assert ran(ledger) == ["a", "b", "c"]
    listed = events(rt, outcome.run_id)
    assert shape(listed) == [
        ("created", None),
        ("step_started", "a"), ("step_succeeded", "a"),
        ("step_started", "b"), ("step_succeeded", "b"),
        ("step_started", "c"), ("step_succeeded", "c"),
        ("succeeded", None),
    ]
    assert payloads(listed) == [created_payload(spec), None, {"exitCode": 0}, None, {"exitCode": 0}, None,
                                {"exitCode": 0}, None]
    state = store(rt).require(outcome.run_id)
    assert state.run["status"] == "succeeded" and "error" not in state.run
    # A step run's sequence is its index in the spec, whatever the execution order.
    assert [(s["stepId"], s["sequence"], s["status"], s["exitCode"]) for s in state.ordered_steps()] == [
        ("c", 0, "succeeded", 0), ("a", 1, "succeeded", 0), ("b", 2, "succeeded", 0),
    ]


def test_each_step_run_goes_pending_then_running_with_its_pid_then_terminal(rt: Runtime) -> None:
    spec = workflow(rt.client, [step("a"), step("b", "exit 3", continueOnFailure=True)])
    outcome = execute_workflow(rt, spec)
    snapshots = step_snapshots(rt.client, outcome.run_id)
    for step_id, final in (("a", "succeeded"), ("b", "failed")):
        rows = snapshots[step_id]
        assert [r["status"] for r in rows] == ["pending", "running", "running", final]
        assert "pid" not in rows[1] and rows[2]["pid"] > 0 and "pid" not in rows[3]  # pid while running only
        assert rows[2]["host"] and rows[2]["pidStartTime"] > 0
    assert snapshots["b"][-1]["exitCode"] == 3


def test_steps_get_the_workflow_metadata_in_their_environment(rt: Runtime, tmp_path: Path) -> None:
    out = tmp_path / "env"
    spec = workflow(rt.client, [step("only", f'echo "$LOOPS_WORKFLOW_ID $LOOPS_WORKFLOW_NAME '
                                             f'$LOOPS_WORKFLOW_RUN_ID $LOOPS_WORKFLOW_STEP_ID" > {out}')])
    outcome = execute_workflow(rt, spec)
    assert out.read_text().split() == [spec["id"], "wf", outcome.run_id, "only"]


# -- continueOnFailure and blocking failures ----------------------------------------------------------------
def test_a_failed_step_with_continue_on_failure_lets_its_dependents_run_and_the_workflow_succeed(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [noted(ledger, "a", "exit 1", continueOnFailure=True),
                                noted(ledger, "b", dependsOn=["a"])])
    outcome = execute_workflow(rt, spec)
    assert (outcome.status, outcome.exit_code, outcome.error) == ("succeeded", 0, None)
    assert ran(ledger) == ["a", "b"]
    assert steps_of(rt, outcome.run_id) == {"a": ("failed", "process exited with code 1"), "b": ("succeeded", None)}
    listed = events(rt, outcome.run_id)
    assert shape(listed) == [("created", None), ("step_started", "a"), ("step_failed", "a"), ("step_started", "b"),
                             ("step_succeeded", "b"), ("succeeded", None)]
    assert listed[2]["payload"] == {"exitCode": 1, "error": "process exited with code 1"}


def test_a_blocking_failure_skips_every_remaining_step_with_its_error_and_fails_the_workflow(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [noted(ledger, "a"), noted(ledger, "b", "exit 1", dependsOn=["a"]),
                                noted(ledger, "c", dependsOn=["b"]), noted(ledger, "d")])
    outcome = execute_workflow(rt, spec)
    assert (outcome.status, outcome.exit_code, outcome.error) == ("failed", 1, FAILED_B)
    assert ran(ledger) == ["a", "b"]  # d is independent, but nothing starts after a blocking failure
    assert steps_of(rt, outcome.run_id) == {
        "a": ("succeeded", None), "b": ("failed", "process exited with code 1"),
        "c": ("skipped", FAILED_B), "d": ("skipped", FAILED_B),
    }
    run = store(rt).require(outcome.run_id).run
    assert (run["status"], run["error"]) == ("failed", FAILED_B)
    assert run["finishedAt"] >= run["startedAt"] and run["durationMs"] >= 0
    listed = events(rt, outcome.run_id)
    assert shape(listed) == [
        ("created", None), ("step_started", "a"), ("step_succeeded", "a"), ("step_started", "b"),
        ("step_failed", "b"), ("step_skipped", "c"), ("step_skipped", "d"), ("failed", None),
    ]
    assert payloads(listed)[4:] == [{"exitCode": 1, "error": "process exited with code 1"}, {"reason": FAILED_B},
                                    {"reason": FAILED_B}, {"error": FAILED_B}]


def test_a_step_that_times_out_ends_the_workflow_timed_out_with_the_steps_error(rt: Runtime, ledger: Path) -> None:
    spec = workflow(rt.client, [step("slow", f"sleep 5; echo slow >> {ledger}", timeoutMs=200), noted(ledger, "next")])
    outcome = execute_workflow(rt, spec)
    error = "step slow timed_out: timed out after 200ms"
    assert (outcome.status, outcome.exit_code, outcome.error) == ("timed_out", 1, error)
    assert steps_of(rt, outcome.run_id) == {"slow": ("timed_out", "timed out after 200ms"), "next": ("skipped", error)}
    listed = events(rt, outcome.run_id)
    assert shape(listed) == [("created", None), ("step_started", "slow"), ("step_timed_out", "slow"),
                             ("step_skipped", "next"), ("timed_out", None)]
    assert payloads(listed)[2:] == [{"error": "timed out after 200ms"}, {"reason": error}, {"error": error}]
    assert ran(ledger) == []


# -- the dependency gate ------------------------------------------------------------------------------------
def _seed_skipped(rt: Runtime, spec: dict[str, Any], key: str, skipped: list[str]) -> WorkflowRunState:
    """A run whose earlier process skipped ``skipped`` and stopped (e.g. it died before finishing the run).

    In a fresh run of the reference's algorithm a dependency can only be skipped, cancelled or failed (without
    continueOnFailure) after the run has already broken out, so the gate acts on resumed runs like this one.
    """
    state, created = store(rt).create(spec, timeutil.now(), idempotency_key=key)
    assert created
    store(rt).skip_steps(state, skipped, "skipped by an earlier process", timeutil.now())
    return state


def test_the_dependency_gate_skips_a_step_whose_dependency_did_not_succeed_and_fails_the_run(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [noted(ledger, "a"), noted(ledger, "b", dependsOn=["a"]),
                                noted(ledger, "c"), noted(ledger, "d", dependsOn=["b"])])
    seeded = _seed_skipped(rt, spec, "k", ["a"])
    outcome = execute_workflow(rt, spec, idempotency_key="k")
    blocked = "step b blocked by dependency a"
    assert (outcome.run_id, outcome.status, outcome.error) == (seeded.run_id, "failed", blocked)
    # The gate does not stop the run: c, independent and later, still runs.
    assert ran(ledger) == ["c"]
    assert steps_of(rt, outcome.run_id) == {
        "a": ("skipped", "skipped by an earlier process"), "b": ("skipped", "dependency did not succeed: a"),
        "c": ("succeeded", None), "d": ("skipped", "dependency did not succeed: b"),
    }
    listed = events(rt, outcome.run_id)
    assert shape(listed) == [
        ("created", None), ("step_skipped", "a"), ("step_skipped", "b"), ("step_started", "c"),
        ("step_succeeded", "c"), ("step_skipped", "d"), ("failed", None),
    ]
    assert payloads(listed)[2:] == [{"reason": "dependency did not succeed: a"}, None, {"exitCode": 0},
                                    {"reason": "dependency did not succeed: b"}, {"error": blocked}]


def test_a_skipped_dependency_with_continue_on_failure_does_not_block_its_dependents(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [noted(ledger, "a", continueOnFailure=True), noted(ledger, "b", dependsOn=["a"])])
    _seed_skipped(rt, spec, "k", ["a"])
    outcome = execute_workflow(rt, spec, idempotency_key="k")
    assert (outcome.status, outcome.error) == ("succeeded", None)
    assert ran(ledger) == ["b"]
    assert shape(events(rt, outcome.run_id)) == [("created", None), ("step_skipped", "a"), ("step_started", "b"),
                                                 ("step_succeeded", "b"), ("succeeded", None)]


# -- idempotency: replay, not claimable, resume -------------------------------------------------------------
def test_re_executing_an_unrecovered_run_with_the_same_key_raises_not_claimable_and_runs_nothing(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [noted(ledger, "a"), noted(ledger, "b")])
    state, _ = store(rt).create(spec, timeutil.now(), idempotency_key="k")
    assert store(rt).start_step(state, "a", timeutil.now())  # its process then died without a word
    with pytest.raises(ConflictError) as raised:
        execute_workflow(rt, spec, idempotency_key="k")
    assert str(raised.value) == f"workflow step is not claimable: {state.run_id}/a status=running"
    assert ran(ledger) == []
    assert shape(events(rt, state.run_id)) == [("created", None), ("step_started", "a")]
    assert rt.held_ids() == []  # the cancel watch was released


def test_a_step_that_ended_before_an_unclaimable_one_is_still_recorded_before_the_error(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [noted(ledger, "a"), noted(ledger, "b")])
    state, _ = store(rt).create(spec, timeutil.now(), idempotency_key="k")
    assert store(rt).start_step(state, "b", timeutil.now())  # an earlier process started b and died
    with pytest.raises(ConflictError) as raised:
        execute_workflow(rt, spec, idempotency_key="k")
    assert str(raised.value) == f"workflow step is not claimable: {state.run_id}/b status=running"
    assert ran(ledger) == ["a"]
    assert shape(events(rt, state.run_id)) == [("created", None), ("step_started", "b"), ("step_started", "a"),
                                               ("step_succeeded", "a")]
    assert steps_of(rt, state.run_id) == {"a": ("succeeded", None), "b": ("running", None)}


def _workflow_loop(rt: Runtime, spec: dict[str, Any], **target: Any) -> str:
    """A workflow loop due in an hour (run here with run-now); returns its id."""
    client = LoopsClient(client=rt.client)
    at = timeutil.to_iso(timeutil.now() + timedelta(hours=1))
    loop = client.create({"name": "wfloop", "schedule": {"type": "once", "at": at},
                          "target": {"type": "workflow", "workflowId": spec["id"], **target}})
    return loop.id


def test_a_workflow_loop_run_replayed_with_its_idempotency_key_returns_the_stored_run_and_runs_nothing(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [noted(ledger, "a"), noted(ledger, "b")])
    loop_id = _workflow_loop(rt, spec)
    loop_run = runner.run_now(rt, loop_id)
    assert (loop_run.status, loop_run.attempt) == ("succeeded", 1)
    (run_id,) = store(rt).for_loop_run(loop_run.id)
    run = store(rt).require(run_id).run
    key = f"{loop_id}:{loop_run.scheduled_for}:attempt:1"
    assert (run["idempotencyKey"], run["loopId"], run["loopRunId"]) == (key, loop_id, loop_run.id)
    assert run["scheduledFor"] == loop_run.scheduled_for
    assert events(rt, run_id)[0]["payload"] == created_payload(spec, loopId=loop_id, loopRunId=loop_run.id)
    assert ran(ledger) == ["a", "b"]
    before = events(rt, run_id)

    replay = execute_workflow(rt, spec, loop_run=loop_run.to_dict(), idempotency_key=key)
    assert (replay.run_id, replay.status, replay.replayed) == (run_id, "succeeded", True)
    assert ran(ledger) == ["a", "b"]
    assert events(rt, run_id) == before
    assert rt.client.zcard(KEYS.wf_runs) == 1


def test_a_recovered_run_executed_again_with_its_key_resumes_and_skips_the_steps_that_succeeded(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [noted(ledger, "a"), noted(ledger, "b", dependsOn=["a"]),
                                noted(ledger, "c", dependsOn=["b"])])
    runs = store(rt)
    state, _ = runs.create(spec, timeutil.now(), idempotency_key="k")
    # An earlier process ran a, started b, and died with b's process.
    assert runs.start_step(state, "a", timeutil.now())
    assert runs.finish_step(state, "a", timeutil.now(), status="succeeded", exit_code=0, duration_ms=1, stdout="",
                            stderr="", error=None)
    ledger.write_text("a\n")
    assert runs.start_step(state, "b", timeutil.now())
    dead = os.spawnlp(os.P_NOWAIT, "true", "true")
    os.waitpid(dead, 0)
    assert runs.mark_step_pid(state, "b", timeutil.now(), pid=dead, start_time=None, host="elsewhere")

    _, recovered = runs.recover(state.run_id, timeutil.now(), "manual recovery",
                                lambda s: is_process_alive(int(s["pid"])))
    assert recovered == ["b"]
    outcome = execute_workflow(rt, spec, idempotency_key="k")
    assert (outcome.run_id, outcome.status, outcome.replayed) == (state.run_id, "succeeded", False)
    assert ran(ledger) == ["a", "b", "c"]  # a ran once, before the crash
    listed = events(rt, state.run_id)
    assert shape(listed) == [
        ("created", None), ("step_started", "a"), ("step_succeeded", "a"), ("step_started", "b"),
        ("recovered", None), ("step_started", "b"), ("step_succeeded", "b"), ("step_started", "c"),
        ("step_succeeded", "c"), ("succeeded", None),
    ]
    assert listed[4]["payload"] == {"reason": "manual recovery", "recoveredSteps": ["b"]}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("max_parallel", [1, 2])
def test_a_step_reset_by_recover_while_it_ran_does_not_count_as_succeeded_for_its_dependents(
    rt: Runtime, ledger: Path, max_parallel: int
) -> None:
    # recover judged a's process dead (say its host was cut off for longer than the liveness TTL) while it ran.
    go = ledger.with_name("go")
    spec = workflow(rt.client, [noted(ledger, "a", f"while [ ! -e {go} ]; do sleep 0.01; done"),
                                noted(ledger, "b", dependsOn=["a"])], maxParallel=max_parallel)
    thread, result = _in_thread(rt, spec)
    run_id, _pid = _wait_for(lambda: _running_pid(rt, "a"), 10, "step a to start")
    _, recovered = store(rt).recover(run_id, timeutil.now(), "manual recovery", lambda _step: False)
    assert recovered == ["a"]
    go.touch()  # a ends only now, after the reset
    thread.join(10)
    (outcome,) = result
    # As the reference: a's end no longer applies (a is pending again), so b is gated, and the run fails.
    blocked = "step b blocked by dependency a"
    assert (outcome.status, outcome.error) == ("failed", blocked)
    assert ran(ledger) == ["a"]
    assert steps_of(rt, run_id) == {"a": ("skipped", blocked), "b": ("skipped", "dependency did not succeed: a")}
    assert shape(events(rt, run_id)) == [("created", None), ("step_started", "a"), ("recovered", None),
                                         ("step_skipped", "b"), ("step_skipped", "a"), ("failed", None)]


# -- the workflow timeout (§5.5) ----------------------------------------------------------------------------
def test_a_workflow_timeout_of_50ms_times_out_the_loop_run_the_workflow_run_and_the_step(
    rt: Runtime, tmp_path: Path
) -> None:
    side_effect = tmp_path / "side-effect"
    spec = workflow(rt.client, [step("slow", f"sleep 1; touch {side_effect}"), step("after")])
    loop_run = runner.run_now(rt, _workflow_loop(rt, spec, timeoutMs=50))
    error = "step slow timed_out: workflow timed out after 50ms"
    assert (loop_run.status, loop_run.error) == ("timed_out", error)
    (run_id,) = store(rt).for_loop_run(loop_run.id)
    run = store(rt).require(run_id).run
    assert (run["status"], run["error"]) == ("timed_out", error)
    assert steps_of(rt, run_id) == {"slow": ("timed_out", "workflow timed out after 50ms"),
                                    "after": ("skipped", error)}
    listed = events(rt, run_id)
    assert shape(listed) == [("created", None), ("step_started", "slow"), ("step_timed_out", "slow"),
                             ("step_skipped", "after"), ("timed_out", None)]
    assert listed[2]["payload"] == {"error": "workflow timed out after 50ms"}
    # No process of the step's group is left alive, so its side effect can never happen.
    pid = next(r["pid"] for r in step_snapshots(rt.client, run_id)["slow"] if r.get("pid"))
    assert live_group_members(pid) == []
    assert not side_effect.exists()


def test_a_workflow_timeout_during_a_continue_on_failure_step_ends_the_run_timed_out_with_the_timeout_message(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [step("first", "sleep 0.3", continueOnFailure=True), noted(ledger, "second")])
    store_ = store(rt)
    outcome = execute_workflow(rt, spec, timeout_ms=100)
    assert (outcome.status, outcome.error) == ("timed_out", "workflow timed out after 100ms")
    assert steps_of(rt, outcome.run_id) == {"first": ("timed_out", "workflow timed out after 100ms"),
                                            "second": ("skipped", "workflow timed out after 100ms")}
    assert ran(ledger) == []
    assert store_.require(outcome.run_id).run["status"] == "timed_out"


# -- cancel (§5.6) ------------------------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_cancel_kills_the_running_step_and_ends_every_open_step_with_a_finish_time_and_its_event(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [noted(ledger, "a", "sleep 30"), noted(ledger, "b")])
    thread, result = _in_thread(rt, spec)
    run_id, pid = _wait_for(lambda: _running_pid(rt, "a"), 10, "step a to start")
    store(rt).cancel(run_id, timeutil.now())
    _wait_for(lambda: not is_process_alive(pid), 1.5, "step a's process to die")
    thread.join(10)
    (outcome,) = result
    assert (outcome.status, outcome.exit_code, outcome.error) == ("failed", 1, "cancelled by user")
    assert steps_of(rt, run_id) == {"a": ("cancelled", "cancelled by user"), "b": ("cancelled", "cancelled by user")}
    listed = events(rt, run_id)
    assert shape(listed) == [("created", None), ("step_started", "a"), ("step_cancelled", "a"),
                             ("step_cancelled", "b"), ("cancelled", None)]
    assert [e["sequence"] for e in listed] == [1, 2, 3, 4, 5]
    assert [e["payload"] for e in listed[2:]] == [{"reason": "cancelled by user"}] * 3
    steps = store(rt).require(run_id).steps
    run_finished = store(rt).require(run_id).run["finishedAt"]
    assert steps["a"]["finishedAt"] == steps["b"]["finishedAt"] == run_finished
    assert steps["a"]["durationMs"] >= 0 and "durationMs" not in steps["b"]  # b never started
    assert ran(ledger) == ["a"]
    # A terminal run is returned unchanged by a second cancel.
    assert store(rt).cancel(run_id, timeutil.now(), "again").run["error"] == "cancelled by user"
    assert len(events(rt, run_id)) == 5


# -- maxParallel --------------------------------------------------------------------------------------------
def _diamond(rt: Runtime, max_parallel: int) -> dict[str, Any]:
    return workflow(rt.client, [
        step("a", "sleep 0.1"), step("b", "sleep 1", dependsOn=["a"]), step("c", "sleep 1", dependsOn=["a"]),
        step("d", "sleep 0.1", dependsOn=["b", "c"]),
    ], maxParallel=max_parallel)


@pytest.mark.timeout(30)
def test_a_diamond_with_max_parallel_2_runs_its_middle_steps_together_and_takes_its_longest_path(
    rt: Runtime
) -> None:
    spec = _diamond(rt, 2)
    started = time.monotonic()
    outcome = execute_workflow(rt, spec)
    elapsed = time.monotonic() - started
    assert outcome.status == "succeeded"
    assert elapsed < 1.8, f"a 1.2 s longest path took {elapsed:.2f}s"
    listed = shape(events(rt, outcome.run_id))
    assert listed[:3] == [("created", None), ("step_started", "a"), ("step_succeeded", "a")]
    assert sorted(listed[3:5]) == [("step_started", "b"), ("step_started", "c")]  # both before either ends
    assert sorted(listed[5:7]) == [("step_succeeded", "b"), ("step_succeeded", "c")]
    assert listed[7:] == [("step_started", "d"), ("step_succeeded", "d"), ("succeeded", None)]


@pytest.mark.timeout(30)
def test_the_same_diamond_with_max_parallel_1_runs_one_step_at_a_time(rt: Runtime) -> None:
    spec = _diamond(rt, 1)
    started = time.monotonic()
    outcome = execute_workflow(rt, spec)
    assert time.monotonic() - started >= 2.0
    assert shape(events(rt, outcome.run_id)) == [
        ("created", None), ("step_started", "a"), ("step_succeeded", "a"), ("step_started", "b"),
        ("step_succeeded", "b"), ("step_started", "c"), ("step_succeeded", "c"), ("step_started", "d"),
        ("step_succeeded", "d"), ("succeeded", None),
    ]


@pytest.mark.timeout(30)
def test_after_a_blocking_failure_under_max_parallel_no_new_step_starts_and_running_ones_finish(
    rt: Runtime, ledger: Path
) -> None:
    spec = workflow(rt.client, [
        step("a", "sleep 0.2; exit 1"), noted(ledger, "b", "sleep 0.8; echo b-done >> " + str(ledger)),
        noted(ledger, "c"),
    ], maxParallel=2)
    outcome = execute_workflow(rt, spec)
    error = "step a failed: process exited with code 1"
    assert (outcome.status, outcome.error) == ("failed", error)
    assert ran(ledger) == ["b", "b-done"]  # b was not killed; c never started
    assert steps_of(rt, outcome.run_id) == {"a": ("failed", "process exited with code 1"), "b": ("succeeded", None),
                                            "c": ("skipped", error)}
    assert shape(events(rt, outcome.run_id)) == [
        ("created", None), ("step_started", "a"), ("step_started", "b"), ("step_failed", "a"),
        ("step_succeeded", "b"), ("step_skipped", "c"), ("failed", None),
    ]


@pytest.mark.timeout(30)
def test_a_workflow_timeout_that_expires_while_a_step_is_being_started_still_stops_that_step(
    rt: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    side_effect = tmp_path / "side-effect"
    spec = workflow(rt.client, [step("slow", f"sleep 1; touch {side_effect}")])
    original = WorkflowRunStore.start_step

    def slow_start(self: WorkflowRunStore, state: WorkflowRunState, step_id: str, now: Any, **kw: Any) -> bool:
        started = original(self, state, step_id, now, **kw)
        time.sleep(0.2)  # a pause (GC, a slow Redis reply) between the step's start and its supervision
        return started

    monkeypatch.setattr(WorkflowRunStore, "start_step", slow_start)
    outcome = execute_workflow(rt, spec, timeout_ms=50)
    assert steps_of(rt, outcome.run_id) == {"slow": ("timed_out", "workflow timed out after 50ms")}
    assert (outcome.status, outcome.error) == ("timed_out", "step slow timed_out: workflow timed out after 50ms")
    assert not side_effect.exists()
