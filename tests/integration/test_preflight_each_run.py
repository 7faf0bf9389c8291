"""Preflight on every run (issue 18, point 6): a loop target, a workflow step and a workflow loop with
``preflight.beforeRun`` are checked right before they run, with the reference's two messages; without it the plain
not-found message is recorded."""

from __future__ import annotations

import os
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
from loopsq.engine.workflow_runner import execute_workflow
from loopsq.sdk import LoopsClient
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.exec_path import normalize_execution_path

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    runtime = Runtime(client=real_redis, role="test").start()
    yield runtime
    runtime.stop()


@pytest.fixture
def tool(tmp_path: Path) -> Path:
    """An executable that exists when the target is created and is removed before it runs."""
    path = tmp_path / "tool"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def missing(tool: Path) -> str:
    return f"Executable not found in PATH: {tool}. Effective PATH={normalize_execution_path(os.environ)}"


def later() -> str:
    return timeutil.to_iso(timeutil.now() + timedelta(hours=1))


def step(step_id: str, command: str, **target: Any) -> dict[str, Any]:
    return {"id": step_id, "target": {"type": "command", "command": command, **target}}


def test_a_loop_run_preflights_its_target_and_fails_with_the_runtime_message(rt: Runtime, tool: Path) -> None:
    client = LoopsClient(client=rt.client)
    for name, extra in (("checked", {"preflight": {"beforeRun": True}}), ("plain", {})):
        client.create({"name": name, "schedule": {"type": "once", "at": later()},
                       "target": {"type": "command", "command": str(tool), **extra}})
    tool.unlink()
    checked = runner.run_now(rt, "checked")
    assert (checked.status, checked.error) == ("failed", f"runtime preflight failed: {missing(tool)}")
    plain = runner.run_now(rt, "plain")
    assert (plain.status, plain.error) == ("failed", missing(tool))


def test_a_workflow_step_preflights_itself_with_the_step_message(rt: Runtime, tool: Path) -> None:
    body = workflow_body_from_json({"name": "wf", "steps": [
        step("a", "true"), step("b", str(tool), preflight={"beforeRun": True}), step("c", str(tool))]})
    body["steps"][2]["continueOnFailure"] = True
    spec = WorkflowStore(rt.client).create(body, timeutil.now())
    tool.unlink()
    outcome = execute_workflow(rt, spec)
    steps = {s["stepId"]: s for s in WorkflowRunStore(rt.client, rt.keys).require(outcome.run_id).ordered_steps()}
    assert (steps["a"]["status"], steps["b"]["status"]) == ("succeeded", "failed")
    assert steps["b"]["error"] == f"workflow step b preflight failed: {missing(tool)}"
    assert steps["c"]["status"] == "skipped"  # the run stopped at b


def test_a_workflow_loop_with_preflight_each_run_preflights_every_step(rt: Runtime, tool: Path) -> None:
    spec = WorkflowStore(rt.client).create(
        workflow_body_from_json({"name": "wf", "steps": [step("only", str(tool))]}), timeutil.now())
    LoopsClient(client=rt.client).create({"name": "wfl", "schedule": {"type": "once", "at": later()},
                                          "target": {"type": "workflow", "workflowId": spec["id"],
                                                     "preflight": {"beforeRun": True}}})
    tool.unlink()
    run = runner.run_now(rt, "wfl")
    assert run.status == "failed"
    assert run.error == f"step only failed: workflow step only preflight failed: {missing(tool)}"
