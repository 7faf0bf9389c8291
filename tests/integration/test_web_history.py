"""The API's history reads come from the mirror: runs past Redis's window and a removed loop's runs stay visible;
``keepRuns`` is validated like every create field."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from loopsq.domain import timeutil
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.state.keys import Keys
from loopsq.state.retention import Retention, Windows
from loopsq.state.runs import Claim, Owner, RunStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.web import WebSettings, create_app
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()
TOKEN = "test-token-0123456789abcdef"


@pytest.fixture
def api(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path) -> Iterator[TestClient]:
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


def trim(client: redis.Redis) -> int:
    report = Retention(client, KEYS).trim_due(timeutil.now() + timedelta(days=1), Windows(100, 1))
    return report.loop_runs + report.workflow_runs


def settle(client: redis.Redis, loop_id: str, n: int) -> list[str]:
    store, owner, ids = RunStore(client, KEYS), Owner("w", "h", 1), []
    start = timeutil.now() - timedelta(minutes=5)
    for i in range(n):
        at = start + timedelta(seconds=i)
        claim = store.claim(loop_id, at, owner, at, source="ad_hoc")
        assert isinstance(claim, Claim)
        store.finalize(claim.run.id, claim.token, at, status="succeeded", exit_code=0, duration_ms=1,
                       stdout=f"out {i}", stderr="", error=None, pid=None)
        ids.append(claim.run.id)
    return ids


def body(**extra: Any) -> dict[str, Any]:
    return {"name": "hist", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 3_600_000},
            "target": {"type": "command", "command": "true"}, **extra}


def test_runs_past_the_window_and_of_a_removed_loop_stay_in_the_api(api: TestClient, real_redis: redis.Redis) -> None:
    created = api.post("/api/loops", json=body(keepRuns=2))
    assert created.status_code == 201 and created.json()["keepRuns"] == 2
    loop_id = created.json()["id"]
    assert api.get("/api/runs").status_code == 200  # the mirror exists (and follows from here)
    ids = settle(real_redis, loop_id, 4)
    assert trim(real_redis) == 2
    page = api.get("/api/runs", params={"loop": "hist", "showOutput": "true"}).json()
    assert [r["id"] for r in page["items"]] == list(reversed(ids))
    assert [bool(r.get("archivedAt")) for r in reversed(page["items"])] == [True, True, False, False]
    assert api.get(f"/api/runs/{ids[0]}", params={"showOutput": "true"}).json()["stdout"] == "out 0"
    assert api.delete("/api/loops/hist").json() == {"removed": True, "id": loop_id}
    assert trim(real_redis) == 2
    assert real_redis.zcard(KEYS.loop_runs(loop_id)) == 0
    for ref in ("hist", loop_id):
        assert [r["id"] for r in api.get("/api/runs", params={"loop": ref}).json()["items"]] == list(reversed(ids))
    missing = api.get("/api/runs", params={"loop": "never"})
    assert (missing.status_code, missing.json()["error"]["message"]) == (404, "loop not found: never")


def test_workflow_runs_past_their_window_keep_their_steps_and_events(api: TestClient, real_redis: redis.Redis) -> None:
    spec = WorkflowStore(real_redis, KEYS).create(workflow_body_from_json(
        {"name": "wf", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}), timeutil.now())
    api.get("/api/workflow-runs")
    store, ids = WorkflowRunStore(real_redis, KEYS), []
    for i in range(3):
        at = timeutil.now() + timedelta(seconds=i)
        state, _ = store.create(spec, at)
        store.start_step(state, "a", at)
        store.finish_step(state, "a", at, status="succeeded", exit_code=0, duration_ms=1, stdout="hi", stderr="",
                          error=None)
        store.finish_run(state, "succeeded", at, error=None)
        ids.append(state.run_id)
    assert trim(real_redis) == 2  # a window of 1 (LOOPSQ_KEEP_WORKFLOW_RUNS in the scheduler)
    assert not real_redis.exists(KEYS.wf_run(ids[0]))
    listed = api.get("/api/workflow-runs", params={"workflow": "wf"}).json()["items"]
    assert [r["id"] for r in listed] == list(reversed(ids))
    shown = api.get(f"/api/workflow-runs/{ids[0]}").json()
    assert shown["workflowRun"]["archivedAt"]
    assert [s["status"] for s in shown["steps"]] == ["succeeded"]
    events = api.get(f"/api/workflow-runs/{ids[0]}/events").json()["items"]
    assert [e["eventType"] for e in events] == ["created", "step_started", "step_succeeded", "succeeded"]


@pytest.mark.parametrize("value", [0, -1, "20", 2.5, True])
def test_a_bad_keep_runs_is_400_naming_it_and_stores_nothing(api: TestClient, real_redis: redis.Redis,
                                                             value: Any) -> None:
    response = api.post("/api/loops", json=body(keepRuns=value))
    shown = {0: "0", -1: "-1", "20": '"20"', 2.5: "2.5", True: "true"}[value]
    assert (response.status_code, response.json()["error"]["message"]) == (
        400, f"keepRuns must be a positive integer, got {shown}")
    assert real_redis.scard(KEYS.loops) == 0
