"""Steps run by another worker (``engine.remote_steps``, ``state.remote_steps``): which steps leave their workflow
run's worker, and the guards that make a step's job run it at most once (its dispatch token, its own lease taken
in the claim, its cancel key), on fakeredis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from loopsq.domain import timeutil
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.engine.remote_steps import (
    NOT_CLAIMED,
    remote_requirements,
    run_remote_step,
    runs_here,
    step_requirements,
)
from loopsq.engine.runtime import Runtime
from loopsq.engine.step_exec import StepAssignment
from loopsq.executor import RunMetadata
from loopsq.state.keys import Keys
from loopsq.state.remote_steps import RemoteStepStore
from loopsq.state.workflow_run_state import StepEnd, WorkflowRunState
from loopsq.state.workflows import WorkflowStore

KEYS = Keys()
HOLDER = "step:{}:train"


def command(step_id: str, script: str = "true", **fields: Any) -> dict[str, Any]:
    return {"id": step_id, "target": {"type": "command", "command": script, "shell": True}, **fields}


def agent(step_id: str, provider: str = "claude", **fields: Any) -> dict[str, Any]:
    return {"id": step_id, "target": {"type": "agent", "provider": provider, "prompt": "go"}, **fields}


# -- which steps leave ------------------------------------------------------------------------------------------
def test_a_step_requires_its_own_labels_or_else_its_workflows_and_an_agent_its_provider() -> None:
    spec = {"requires": ["repo:web"], "steps": []}
    assert step_requirements(spec, command("a")) == ("repo:web",)
    assert step_requirements(spec, command("a", requires=["gpu"])) == ("gpu",)
    assert step_requirements({"steps": []}, command("a")) == ()
    assert step_requirements({"steps": []}, agent("a")) == ("provider:claude",)
    assert step_requirements(spec, agent("a", requires=["gpu"])) == ("gpu", "provider:claude")
    assert step_requirements(spec, agent("a", requires=["provider:codex"])) == ("provider:codex",)
    assert step_requirements(spec, agent("a", requires=["provider:any", "gpu"])) == ("gpu",)


def test_a_step_runs_here_when_this_worker_has_every_label_or_is_no_fleet_worker() -> None:
    assert runs_here(None, ("gpu",))
    assert runs_here(["gpu", "host:a"], ("gpu",))
    assert runs_here([], ())
    assert not runs_here(["host:a"], ("gpu",))
    assert not runs_here(["gpu"], ("gpu", "repo:web"))


def test_only_the_steps_this_worker_lacks_labels_for_are_remote() -> None:
    spec = {"steps": [command("prep"), command("train", requires=["gpu"]), agent("review"),
                      agent("any", requires=["provider:any"])]}
    assert remote_requirements(["host:a"], spec) == {"train": ("gpu",), "review": ("provider:claude",)}
    assert remote_requirements(["host:a", "gpu", "provider:claude"], spec) == {}
    assert remote_requirements(None, spec) == {}


# -- the claim ----------------------------------------------------------------------------------------------------
@pytest.fixture
def store(fake_redis: redis.Redis) -> RemoteStepStore:
    return RemoteStepStore(fake_redis, KEYS)


def dispatched(store: RemoteStepStore, script: str = "true", token: str = "t1") -> WorkflowRunState:
    """A running workflow run whose step ``train`` is dispatched under ``token``."""
    body = workflow_body_from_json({"name": "wf", "steps": [command("train", script, requires=["gpu"])]})
    spec = WorkflowStore(store.client, KEYS).create(body, timeutil.now())
    state, _ = store.create(spec, timeutil.now(), owner="worker:parent")
    assert store.dispatch_step(state, "train", timeutil.now(), token=token, requires=["gpu"], queue="loopsq+gpu")
    return state


def claim(store: RemoteStepStore, run_id: str, token: str = "t1", lease_token: str = "L1",
          worker: str = "worker:gpu") -> WorkflowRunState | None:
    return store.claim_step(run_id, "train", token, timeutil.now(), holder=HOLDER.format(run_id),
                            lease_token=lease_token, lease_ms=10_000, worker_id=worker, host="gpu-box")


def test_a_dispatched_step_is_claimed_once_with_its_lease_and_a_start_event_naming_the_worker(
    store: RemoteStepStore,
) -> None:
    state = dispatched(store)
    claimed = claim(store, state.run_id)
    assert claimed is not None
    step = claimed.steps["train"]
    assert (step["status"], step["workerId"], step["host"]) == ("running", "worker:gpu", "gpu-box")
    assert store.client.get(KEYS.lease(HOLDER.format(state.run_id))) == "L1"
    assert claim(store, state.run_id, lease_token="L2", worker="worker:gpu2") is None  # the duplicate job
    assert store.client.get(KEYS.lease(HOLDER.format(state.run_id))) == "L1"
    listed = store.events(state.run_id)
    assert [(e["eventType"], e.get("payload")) for e in listed] == [
        ("created", listed[0]["payload"]),
        ("step_queued", {"requires": ["gpu"], "queue": "loopsq+gpu"}),
        ("step_started", {"workerId": "worker:gpu", "host": "gpu-box"}),
    ]


def test_a_job_of_another_dispatch_claims_nothing(store: RemoteStepStore) -> None:
    state = dispatched(store)
    assert claim(store, state.run_id, token="old") is None
    assert store.require(state.run_id).steps["train"]["status"] == "pending"


def test_a_step_whose_lease_is_held_is_not_claimed(store: RemoteStepStore) -> None:
    state = dispatched(store)
    store.client.set(KEYS.lease(HOLDER.format(state.run_id)), "someone", px=10_000)
    assert claim(store, state.run_id) is None
    assert store.require(state.run_id).steps["train"]["status"] == "pending"


def test_a_step_whose_cancel_key_is_set_is_not_claimed(store: RemoteStepStore) -> None:
    state = dispatched(store)
    store.client.set(KEYS.cancel(HOLDER.format(state.run_id)), "workflow timed out after 50ms", px=10_000)
    assert claim(store, state.run_id) is None


def test_a_step_of_a_run_that_is_over_is_not_claimed(store: RemoteStepStore) -> None:
    state = dispatched(store)
    store.cancel(state.run_id, timeutil.now())
    assert claim(store, state.run_id) is None


def test_the_end_is_recorded_only_under_the_claims_lease_which_goes_with_it(store: RemoteStepStore) -> None:
    state = dispatched(store)
    claimed = claim(store, state.run_id)
    assert claimed is not None
    end = StepEnd("train", timeutil.now(), "succeeded", 0, 5, "out", "", None)
    lease = KEYS.lease(HOLDER.format(state.run_id))
    store.client.set(lease, "taken-over", px=10_000)  # (as if ours expired and another took it)
    assert not store.end_claimed_step(claimed, end, holder=HOLDER.format(state.run_id), lease_token="L1")
    store.client.set(lease, "L1", px=10_000)
    assert store.end_claimed_step(claimed, end, holder=HOLDER.format(state.run_id), lease_token="L1")
    assert not store.client.exists(lease)
    assert store.require(state.run_id).steps["train"]["status"] == "succeeded"
    assert claim(store, state.run_id) is None  # a job delivered again after the end


# -- the job, delivered twice ---------------------------------------------------------------------------------------
@pytest.fixture
def rt(fake_redis: redis.Redis) -> Iterator[Runtime]:
    runtime = Runtime(client=fake_redis, role="test", worker_id="worker:gpu")  # (no beat: nothing to cancel)
    runtime.labels = ["gpu"]
    yield runtime


def test_a_step_job_delivered_twice_runs_the_step_once(rt: Runtime, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    store = RemoteStepStore(rt.client, rt.keys, rt.committer)
    state = dispatched(store, f"echo once >> {marker}")
    assignment = StepAssignment(state.run_id, "train", {"type": "command", "command": f"echo once >> {marker}",
                                                        "shell": True},
                                RunMetadata(workflow_run_id=state.run_id, workflow_step_id="train")).to_json()
    assert run_remote_step(rt, state.run_id, "train", "t1", assignment) == "succeeded"
    assert run_remote_step(rt, state.run_id, "train", "t1", assignment) == NOT_CLAIMED
    assert marker.read_text() == "once\n"
    step = store.require(state.run_id).steps["train"]
    assert (step["status"], step["workerId"], step["exitCode"]) == ("succeeded", "worker:gpu", 0)
    assert not rt.client.exists(KEYS.lease(HOLDER.format(state.run_id)))


def test_an_assignment_survives_its_trip_through_a_job_as_plain_json() -> None:
    assignment = StepAssignment("r1", "train", {"type": "command", "command": "true"},
                                RunMetadata(loop_id="l1", workflow_run_id="r1", workflow_step_id="train", attempt=2),
                                "ws", 5_000)
    raw = assignment.to_json()
    assert StepAssignment.from_json({**raw, "metadata": {**raw["metadata"], "newerField": 1}}) == assignment


def test_a_step_with_a_workspace_holds_it_under_the_lease_of_its_claim(rt: Runtime, tmp_path: Path) -> None:
    store = RemoteStepStore(rt.client, rt.keys, rt.committer)
    state = dispatched(store)
    seen = tmp_path / "seen"
    script = f"echo ran > {seen}"
    assignment = StepAssignment(state.run_id, "train", {"type": "command", "command": script, "shell": True},
                                RunMetadata(workflow_run_id=state.run_id, workflow_step_id="train"), "repo:web")
    assert run_remote_step(rt, state.run_id, "train", "t1", assignment.to_json()) == "succeeded"
    assert seen.read_text() == "ran\n"
    assert not rt.client.exists(KEYS.workspace("repo:web"))  # released with the step
    assert rt.client.get(KEYS.workspace_fence("repo:web")) == "1"  # (it was taken, once)
