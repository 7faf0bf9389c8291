"""The HTTP API in-process (FastAPI's TestClient) against the session's private redis-server and a temp data dir."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from loopsq import __version__
from loopsq.domain import timeutil
from loopsq.engine import timers
from loopsq.engine.runtime import Runtime
from loopsq.engine.workflow_runner import execute_workflow
from loopsq.executor.digest import command_fields
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys
from loopsq.state.layout import LAYOUT
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.procs import hostname, process_start_time
from loopsq.web import WebSettings, create_app
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 409: "conflict",
         413: "payload_too_large",
         500: "internal_error", 503: "redis_unavailable"}
HOURLY = {"type": "interval", "everyMs": 3_600_000}
PIPELINE: dict[str, Any] = {"name": "pipeline", "steps": [
    {"id": "build", "target": {"type": "command", "command": "echo built", "shell": True}},
    {"id": "test", "target": {"type": "command", "command": "echo oops >&2; exit 3", "shell": True},
     "dependsOn": ["build"]},
    {"id": "lint", "target": {"type": "command", "command": "echo linted", "shell": True}, "dependsOn": ["build"]},
    {"id": "ship", "target": {"type": "command", "command": "echo shipped", "shell": True},
     "dependsOn": ["test", "lint"]},
]}


def loop_body(name: str = "hello", command: str = "echo hi", **extra: Any) -> dict[str, Any]:
    return {"name": name, "timezone": "UTC", "schedule": HOURLY,
            "target": {"type": "command", "command": command, "shell": True}, **extra}


def redis_state(decoded: redis.Redis) -> dict[Any, Any]:
    """Every key with its type and value (as bytes: RQ's jobs are pickles): what 'nothing changed' compares."""
    client = timers.raw_from(decoded)
    out: dict[Any, Any] = {}
    for key in sorted(client.keys("*")):
        kind = client.type(key).decode()
        readers = {"string": client.get, "hash": client.hgetall, "list": lambda k: client.lrange(k, 0, -1),
                   "set": lambda k: sorted(client.smembers(k)), "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
                   "stream": lambda k: [i for i, _ in client.xrange(k)]}
        out[key] = (kind, readers[kind](key))
    return out


def assert_error(response: Any, status: int, message: str) -> None:
    assert (response.status_code, response.json()) == (
        status, {"error": {"status": status, "code": CODES[status], "message": message}})


def put_run(client: redis.Redis, run_id: str, loop_id: str, created: str, **fields: Any) -> dict[str, Any]:
    """Record a loop run as one committed transition (exact timestamps, no process needed)."""
    run = {"id": run_id, "loopId": loop_id, "loopName": fields.pop("loopName", loop_id), "scheduledFor": created,
           "attempt": 1, "status": "succeeded", "createdAt": created, "updatedAt": created, **fields}
    keys = Keys()
    tx = (Tx("run_recorded_by_test", created).set(keys.run(run_id), json.dumps(run))
          .zadd(keys.runs, timeutil.to_ms(timeutil.from_iso(created)), run_id).put("loop_runs", run))
    assert Committer(client, keys).commit(tx).ok
    return run


@dataclass
class Web:
    client: TestClient
    redis: redis.Redis
    url: str
    data_dir: Path


@pytest.fixture
def web(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Web]:
    monkeypatch.setenv("TZ", "UTC")
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False)
    with TestClient(create_app(settings), headers=AUTH) as client:
        yield Web(client, real_redis, redis_server.url, tmp_path / "data")


# -- health, errors, documents ----------------------------------------------------------------------------------
def test_health_reports_redis_and_the_mirror_lag_without_a_token(web: Web) -> None:
    web.client.post("/api/loops", json=loop_body())
    assert web.client.get("/api/health").json()["mirrorLag"] == 1  # a write is not a read: nothing caught up
    web.client.get("/api/loops")
    response = web.client.get("/api/health", headers={"Authorization": ""})
    assert (response.status_code, response.json()) == (200, {"status": "ok", "redis": "ok", "mirrorLag": 0, "version": __version__, "layout": LAYOUT})


def test_redis_down_is_503_with_the_masked_url_and_health_names_no_url(tmp_path: Path) -> None:
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    app = create_app(WebSettings(redis_url=url, data_dir=tmp_path, token=TOKEN, follow_mirror=False))
    with TestClient(app, headers=AUTH) as client:
        response = client.get("/api/loops")
        assert response.status_code == 503
        message = response.json()["error"]["message"]
        assert message.startswith(f"cannot reach Redis at redis://:***@127.0.0.1:{url.split(':')[-1].split('/')[0]}/0: ")
        assert "s3cret" not in response.text
        assert_error(client.get("/api/health"), 503, "redis is unreachable")
        assert client.post("/api/loops", json=loop_body()).status_code == 503


def test_unknown_routes_wrong_methods_and_bad_parameters_get_the_one_error_body(web: Web) -> None:
    assert_error(web.client.get("/api/nothing-here"), 404, "no such endpoint: GET /api/nothing-here")
    response = web.client.delete("/api/runs")
    assert_error(response, 405, "method DELETE is not allowed on /api/runs")
    assert response.headers["allow"] == "GET, HEAD"
    assert_error(web.client.get("/api/runs?limit=0"), 400, 'limit must be >= 1, got "0"')
    assert_error(web.client.get("/api/runs?limit=1001"), 400, 'limit must be <= 1000, got "1001"')
    assert_error(web.client.get("/api/runs?offset=x"), 400, 'offset must be an integer, got "x"')
    assert_error(web.client.get("/api/runs?status=bogus"), 400, "status must be one of 'running', 'succeeded', "
                 "'failed', 'timed_out', 'abandoned', 'skipped' or 'missed', got \"bogus\"")
    assert_error(web.client.get("/api/runs?showOutput=maybe"), 400, 'showOutput must be true or false, got "maybe"')
    assert_error(web.client.get("/api/loops?status=sleeping"), 400,
                 "status must be one of 'active', 'paused', 'stopped' or 'expired', got \"sleeping\"")


def test_the_openapi_document_is_public_and_declares_bearer_auth_and_the_error_body(web: Web) -> None:
    doc = web.client.get("/api/openapi.json", headers={"Authorization": ""}).json()
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer", "description": "The value of LOOPSQ_API_TOKEN."}
    assert doc["security"] == [{"bearerAuth": []}]
    assert doc["paths"]["/api/health"]["get"]["security"] == []
    create = doc["paths"]["/api/loops"]["post"]
    assert set(create["responses"]) == {"201", "400", "401", "409", "413", "500", "503"}
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/LoopCreate"
    assert doc["components"]["schemas"]["LoopCreate"]["required"] == ["name", "schedule", "target"]
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    assert all("422" not in op["responses"] for ops in doc["paths"].values() for op in ops.values())


# -- loops ------------------------------------------------------------------------------------------------------
def test_a_loop_is_created_listed_shown_paused_resumed_stopped_and_removed(web: Web) -> None:
    created = web.client.post("/api/loops", json=loop_body(target_env := "hello"))
    assert created.status_code == 201
    loop = created.json()
    assert (loop["name"], loop["status"], loop["schedule"]) == (target_env, "active", {**HOURLY, "anchor": "fixed_rate"})
    assert created.headers["location"] == f"/api/loops/{loop['id']}"
    assert web.client.get("/api/loops").json() == {"items": [loop]}
    # The detail adds the command line its runs start and its digest (``executor.digest``) to the loop.
    detail = {**loop, **command_fields(loop["target"])}
    assert set(detail) - set(loop) == {"commandLine", "commandEnvKeys", "commandDigest"}
    assert web.client.get(f"/api/loops/{loop['id']}").json() == detail
    assert web.client.get("/api/loops/hello").json() == detail
    assert web.client.post("/api/loops/hello/pause").json()["status"] == "paused"
    assert web.client.get("/api/loops?status=paused").json()["items"][0]["id"] == loop["id"]
    assert web.client.get("/api/loops?status=active").json() == {"items": []}
    assert web.client.post("/api/loops/hello/resume").json()["status"] == "active"
    stopped = web.client.post(f"/api/loops/{loop['id']}/stop").json()
    assert stopped["status"] == "stopped" and "nextRunAt" not in stopped
    assert web.client.delete("/api/loops/hello").json() == {"removed": True, "id": loop["id"]}
    assert_error(web.client.get("/api/loops/hello"), 404, "loop not found: hello")


def test_a_name_filter_with_a_control_character_is_400_not_every_loop(web: Web) -> None:
    for name in ("alpha", "beta"):
        assert web.client.post("/api/loops", json=loop_body(name)).status_code == 201
    assert [loop["name"] for loop in web.client.get("/api/loops?name=ph").json()["items"]] == ["alpha"]
    assert_error(web.client.get("/api/loops?name=%00"), 400, 'name must not contain control, format, bidi or '
                 'zero-width characters (U+0000 at position 1), got "\\x00"')
    assert_error(web.client.get("/api/loops?name=al%0Apha"), 400, 'name must not contain control, format, bidi or '
                 'zero-width characters (U+000A at position 3), got "al\\x0apha"')
    page = web.client.get("/?name=%00", headers={**AUTH, "Accept": "text/html"})
    assert page.status_code == 400 and "\\x00" in page.text


def test_loop_secrets_are_redacted_in_responses(web: Web) -> None:
    body = loop_body(target={"type": "command", "command": "env", "env": {"API_KEY": "k-123"}})
    created = web.client.post("/api/loops", json=body).json()
    assert created["target"]["env"] == "[redacted]"
    assert web.client.get("/api/loops/hello").json()["target"]["env"] == "[redacted]"


def test_a_taken_loop_name_is_409_and_changes_nothing(web: Web) -> None:
    web.client.post("/api/loops", json=loop_body())
    before = redis_state(web.redis)
    assert_error(web.client.post("/api/loops", json=loop_body()), 409, "loop name already exists: hello")
    assert redis_state(web.redis) == before


@pytest.mark.parametrize(("body", "message"), [
    ({}, "loop name must not be empty, got null"),
    ({"name": "x", "schedule": {"type": "weekly"}}, "schedule.type must be once, interval, cron or dynamic, got 'weekly'"),
    ({"name": "x", "schedule": {"type": "interval", "everyMs": 0}}, "interval everyMs must be > 0, got 0"),
    (loop_body(timezone="Mars/Base"), "unknown timezone: Mars/Base"),
    (loop_body(target={"type": "shell"}), "target.type must be command, agent or workflow"),
    (loop_body(maxAttempts=0), "maxAttempts must be a positive integer, got 0"),
    (loop_body(overlap="queue"), 'overlap must be one of skip, allow, replace, got "queue"'),
    (loop_body(target={"type": "workflow", "workflowId": "nope"}), 'target.workflowId must name a stored workflow, got "nope"'),
    ([1, 2], "request body must be a JSON object, got [1, 2]"),
])
def test_bad_loop_bodies_are_400_naming_the_field_and_change_nothing(web: Web, body: Any, message: str) -> None:
    before = redis_state(web.redis)
    assert_error(web.client.post("/api/loops", json=body), 400, message)
    assert redis_state(web.redis) == before


POOL_HINT = "(create it with: loopsq pool set gpu --limit N)"
LABEL = "[a-z0-9][a-z0-9._:/-]{0,63}"


def test_a_loop_or_workflow_naming_a_pool_that_does_not_exist_is_400_and_changes_nothing(web: Web) -> None:
    web.redis.hset(Keys().pools, "cpu", json.dumps({"limit": 2}))
    before = redis_state(web.redis)
    assert_error(web.client.post("/api/loops", json=loop_body(pool="gpu")), 400,
                 f'pool "gpu" does not exist {POOL_HINT}')
    assert_error(web.client.post("/api/loops", json=loop_body(requires=["GPU!"])), 400,
                 f'requires must be a label ({LABEL}), got "GPU!"')
    assert_error(web.client.post("/api/loops", json=loop_body(pool="Big")), 400,
                 f'pool must be a label ({LABEL}), got "Big"')
    step = {"id": "a", "target": {"type": "command", "command": "true"}}
    assert_error(web.client.post("/api/workflows", json={"name": "w", "pool": "gpu", "steps": [step]}), 400,
                 f'workflow.pool "gpu" does not exist {POOL_HINT}')
    assert_error(web.client.post("/api/workflows", json={"name": "w", "steps": [{**step, "pool": "gpu"}]}), 400,
                 f'workflow.steps[0].pool "gpu" does not exist {POOL_HINT}')
    assert redis_state(web.redis) == before


def test_requires_and_an_existing_pool_are_stored_and_shown(web: Web) -> None:
    web.redis.hset(Keys().pools, "gpu", json.dumps({"limit": 2}))
    created = web.client.post("/api/loops", json=loop_body(requires=["repo:web", "gpu", "gpu"], pool="gpu"))
    assert created.status_code == 201, created.text
    assert (created.json()["requires"], created.json()["pool"]) == (["gpu", "repo:web"], "gpu")
    shown = web.client.get("/api/loops/hello").json()
    assert (shown["requires"], shown["pool"]) == (["gpu", "repo:web"], "gpu")
    step = {"id": "a", "target": {"type": "command", "command": "true"}, "requires": ["gpu"], "pool": "gpu"}
    spec = web.client.post("/api/workflows", json={"name": "w", "requires": ["x"], "steps": [step]})
    assert spec.status_code == 201, spec.text
    shown_spec = web.client.get("/api/workflows/w").json()
    assert (shown_spec["requires"], shown_spec["steps"][0]["requires"], shown_spec["steps"][0]["pool"]) == (
        ["x"], ["gpu"], "gpu")


def test_malformed_missing_or_non_json_bodies_are_400_and_change_nothing(web: Web) -> None:
    before = redis_state(web.redis)
    json_header = {"Content-Type": "application/json"}
    assert_error(web.client.post("/api/loops", content=b"{bad", headers=json_header), 400,
                 "request body is not valid JSON: Expecting property name enclosed in double quotes")
    assert_error(web.client.post("/api/loops"), 400, "request body is required (a JSON object)")
    assert_error(web.client.post("/api/loops", content=b"name=x", headers={"Content-Type": "text/plain"}), 400,
                 "request body must be a JSON object (Content-Type: application/json)")
    assert_error(web.client.post("/api/workflows", content=b"[", headers=json_header), 400,
                 "request body is not valid JSON: Expecting value")
    assert redis_state(web.redis) == before


def test_a_workflow_loop_names_its_workflow_by_name_and_stores_the_id(web: Web) -> None:
    spec = web.client.post("/api/workflows", json=PIPELINE).json()
    loop = web.client.post("/api/loops", json=loop_body(target={"type": "workflow", "workflowId": "pipeline"}))
    assert loop.status_code == 201
    assert loop.json()["target"] == {"type": "workflow", "workflowId": spec["id"]}


@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/loops/ghost"), ("post", "/api/loops/ghost/pause"), ("post", "/api/loops/ghost/resume"),
    ("post", "/api/loops/ghost/stop"), ("delete", "/api/loops/ghost"), ("post", "/api/loops/ghost/trigger"),
    ("get", "/api/runs?loop=ghost"),
])
def test_an_unknown_loop_is_404_and_changes_nothing(web: Web, method: str, path: str) -> None:
    before = redis_state(web.redis)
    assert_error(getattr(web.client, method)(path), 404, "loop not found: ghost")
    assert redis_state(web.redis) == before


def test_a_repeated_idempotency_key_returns_the_same_run_with_200_and_starts_nothing(web: Web) -> None:
    web.client.post("/api/loops", json=loop_body())
    raw = timers.raw_from(web.redis)
    first = web.client.post("/api/loops/hello/trigger", headers={"Idempotency-Key": "order-42"})
    assert first.status_code == 201 and first.json()["created"] is True
    again = web.client.post("/api/loops/hello/trigger", headers={"Idempotency-Key": "order-42"})
    assert (again.status_code, again.json()) == (200, {"runId": first.json()["runId"], "created": False})
    assert timers.queue_depth(raw) == 1
    other = web.client.post("/api/loops/hello/trigger")
    assert other.status_code == 201 and other.json()["runId"] != first.json()["runId"]
    assert timers.queue_depth(raw) == 2
    before = redis_state(web.redis)
    assert_error(web.client.post("/api/loops/hello/trigger", headers={"Idempotency-Key": " "}), 400,
                 'idempotency key must be a non-empty string, got " "')
    assert redis_state(web.redis) == before


def test_a_non_ascii_idempotency_key_sent_as_utf8_is_the_same_key_as_the_sdks_and_the_clis(web: Web) -> None:
    from loopsq.engine.triggers import trigger_with

    web.client.post("/api/loops", json=loop_body())
    key = "commande-é-ü-東京"
    first = web.client.post("/api/loops/hello/trigger", headers={"Idempotency-Key": key.encode()})
    assert first.status_code == 201, first.text
    # The CLI's `trigger --key` and the SDK's `trigger(idempotency_key=...)` both come down to trigger_with.
    assert trigger_with(web.redis, Keys(), "hello", key) == (first.json()["runId"], False)
    again = web.client.post("/api/loops/hello/trigger", headers={"Idempotency-Key": key.encode()})
    assert (again.status_code, again.json()["runId"]) == (200, first.json()["runId"])


# -- runs -------------------------------------------------------------------------------------------------------
def test_runs_are_filtered_by_loop_and_status_and_paginated_newest_first(web: Web) -> None:
    loop_id = web.client.post("/api/loops", json=loop_body()).json()["id"]
    for i in range(5):
        put_run(web.redis, f"run{i}", loop_id, f"2026-01-01T00:00:0{i}.000Z", loopName="hello",
                status="failed" if i % 2 else "succeeded")
    put_run(web.redis, "other", "loop-b", "2026-01-01T00:00:09.000Z")
    first = web.client.get("/api/runs?loop=hello&limit=2").json()
    assert ([r["id"] for r in first["items"]], first["nextOffset"]) == (["run4", "run3"], 2)
    second = web.client.get("/api/runs?loop=hello&limit=2&offset=2").json()
    assert ([r["id"] for r in second["items"]], second["nextOffset"]) == (["run2", "run1"], 4)
    last = web.client.get("/api/runs?loop=hello&limit=2&offset=4").json()
    assert (last["items"][0]["id"], last["nextOffset"], last["limit"], last["offset"]) == ("run0", None, 2, 4)
    failed = web.client.get(f"/api/runs?loop={loop_id}&status=failed").json()["items"]
    assert [r["id"] for r in failed] == ["run3", "run1"]
    assert [r["id"] for r in web.client.get("/api/runs?limit=1").json()["items"]] == ["other"]


def test_a_run_is_shown_with_its_output_redacted_unless_asked(web: Web) -> None:
    put_run(web.redis, "r1", "l1", "2026-01-01T00:00:00.000Z", stdout="hello\n", stderr="")
    assert web.client.get("/api/runs/r1").json()["stdout"] == "[redacted 6 chars]"
    assert web.client.get("/api/runs/r1?showOutput=true").json()["stdout"] == "hello\n"
    assert web.client.get("/api/runs?showOutput=true").json()["items"][0]["stdout"] == "hello\n"
    assert_error(web.client.get("/api/runs/nope"), 404, "run not found: nope")


# -- workflows --------------------------------------------------------------------------------------------------
def test_workflow_specs_are_created_listed_and_shown(web: Web) -> None:
    created = web.client.post("/api/workflows", json=PIPELINE)
    assert created.status_code == 201
    spec = created.json()
    assert (spec["name"], spec["status"], [s["id"] for s in spec["steps"]]) == (
        "pipeline", "active", ["build", "test", "lint", "ship"])
    assert web.client.get("/api/workflows").json() == {"items": [spec]}
    assert web.client.get("/api/workflows/pipeline").json() == spec
    assert web.client.get(f"/api/workflows/{spec['id']}").json() == spec
    assert web.client.get("/api/workflows?status=archived").json() == {"items": []}
    assert_error(web.client.get("/api/workflows/ghost"), 404, "workflow not found: ghost")


def test_bad_or_duplicate_workflow_specs_are_refused_and_change_nothing(web: Web) -> None:
    web.client.post("/api/workflows", json=PIPELINE)
    before = redis_state(web.redis)
    spec_id = web.client.get("/api/workflows/pipeline").json()["id"]
    assert_error(web.client.post("/api/workflows", json=PIPELINE), 409,
                 f"an active workflow is already named pipeline ({spec_id}); archive it first")
    assert_error(web.client.post("/api/workflows", json={"name": "w", "steps": []}), 400,
                 "workflow.steps must contain at least one step")
    bad_dep = {"name": "w", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}, "dependsOn": "b"}]}
    assert_error(web.client.post("/api/workflows", json=bad_dep), 400,
                 'workflow.steps[0].dependsOn must be an array of step ids, got "b"')
    assert redis_state(web.redis) == before


def test_running_a_workflow_hands_a_new_run_to_a_worker(web: Web) -> None:
    spec = web.client.post("/api/workflows", json=PIPELINE).json()
    response = web.client.post("/api/workflows/pipeline/runs")
    assert response.status_code == 202
    body = response.json()
    assert body == {"runId": body["runId"], "workflowId": spec["id"], "workflowName": "pipeline", "status": "queued"}
    assert response.headers["location"] == f"/api/workflow-runs/{body['runId']}"
    (job,) = timers.queue(timers.raw_from(web.redis)).get_jobs()
    assert (job.func_name, job.args) == ("worker.jobs.run_workflow", (spec["id"], body["runId"]))
    assert_error(web.client.post("/api/workflows/ghost/runs"), 404, "workflow not found: ghost")


def test_a_workflow_run_is_shown_with_its_steps_and_events(web: Web) -> None:
    spec = WorkflowStore(web.redis).create(PIPELINE, timeutil.now())
    with Runtime(client=web.redis, role="manual") as rt:
        run_id = execute_workflow(rt, spec).run_id
    detail = web.client.get(f"/api/workflow-runs/{run_id}").json()
    assert (detail["workflowRun"]["status"], detail["workflowRun"]["error"]) == (
        "failed", "step test failed: process exited with code 3")
    assert [(s["stepId"], s["status"]) for s in detail["steps"]] == [
        ("build", "succeeded"), ("test", "failed"), ("lint", "skipped"), ("ship", "skipped")]
    assert detail["steps"][1]["stderr"] == "[redacted 5 chars]"
    assert web.client.get(f"/api/workflow-runs/{run_id}?showOutput=true").json()["steps"][1]["stderr"] == "oops\n"
    types = [e["eventType"] for e in detail["events"]]
    assert types == ["created", "step_started", "step_succeeded", "step_started", "step_failed", "step_skipped",
                     "step_skipped", "failed"]
    assert [e["sequence"] for e in detail["events"]] == list(range(1, 9))
    page = web.client.get(f"/api/workflow-runs/{run_id}/events?limit=3&offset=6").json()
    assert ([e["sequence"] for e in page["items"]], page["nextOffset"]) == ([7, 8], None)
    listed = web.client.get("/api/workflow-runs?workflow=pipeline").json()
    assert ([r["id"] for r in listed["items"]], listed["nextOffset"]) == ([run_id], None)
    assert_error(web.client.get("/api/workflow-runs/nope"), 404, "workflow run not found: nope")
    assert_error(web.client.get("/api/workflow-runs/nope/events"), 404, "workflow run not found: nope")
    assert_error(web.client.get("/api/workflow-runs?workflow=ghost"), 404, "workflow not found: ghost")


def test_cancel_ends_a_running_workflow_run_with_the_reason(web: Web) -> None:
    spec = WorkflowStore(web.redis).create(PIPELINE, timeutil.now())
    state, _ = WorkflowRunStore(web.redis).create(spec, timeutil.now())
    cancelled = web.client.post(f"/api/workflow-runs/{state.run_id}/cancel", json={"reason": "deploy freeze"})
    assert (cancelled.status_code, cancelled.json()["status"], cancelled.json()["error"]) == (
        200, "cancelled", "deploy freeze")
    steps = web.client.get(f"/api/workflow-runs/{state.run_id}").json()["steps"]
    assert {s["status"] for s in steps} == {"cancelled"}
    again = web.client.post(f"/api/workflow-runs/{state.run_id}/cancel")
    assert again.json()["error"] == "deploy freeze"
    before = redis_state(web.redis)
    assert_error(web.client.post(f"/api/workflow-runs/{state.run_id}/cancel", json={"reason": "x", "why": 1}), 400,
                 "why is not a known field")
    assert_error(web.client.post("/api/workflow-runs/nope/cancel"), 404, "workflow run not found: nope")
    assert redis_state(web.redis) == before


def test_recover_is_refused_while_the_step_process_lives_and_resets_it_once_dead(web: Web) -> None:
    spec = WorkflowStore(web.redis).create(PIPELINE, timeutil.now())
    store = WorkflowRunStore(web.redis)
    state, _ = store.create(spec, timeutil.now())
    assert store.start_step(state, "build", timeutil.now())
    me = os.getpid()
    store.mark_step_pid(state, "build", timeutil.now(), pid=me, start_time=process_start_time(me), host=hostname())
    before = redis_state(web.redis)
    assert_error(web.client.post(f"/api/workflow-runs/{state.run_id}/recover"), 409,
                 f"cannot recover workflow run while step processes are still alive: build pid={me}")
    assert redis_state(web.redis) == before
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.mark_step_pid(state, "build", timeutil.now(), pid=dead.pid, start_time=None, host=hostname())
    recovered = web.client.post(f"/api/workflow-runs/{state.run_id}/recover", json={"reason": "host rebooted"}).json()
    assert recovered["recoveredSteps"] == ["build"]
    steps = web.client.get(f"/api/workflow-runs/{state.run_id}").json()["steps"]
    assert (steps[0]["status"], steps[0]["error"]) == ("pending", "host rebooted")
    assert_error(web.client.post("/api/workflow-runs/nope/recover"), 404, "workflow run not found: nope")


# -- metrics, mirror, queue view ---------------------------------------------------------------------------------
def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_report_runs_lag_durations_queue_depth_and_live_workers(web: Web) -> None:
    web.client.post("/api/loops", json=loop_body())
    web.client.get("/metrics")  # the mirror exists: what follows reaches it as transitions, which counters count
    put_run(web.redis, "a", "l1", "2026-01-01T00:00:00.000Z", loopName="alpha", startedAt="2026-01-01T00:00:00.040Z",
            durationMs=1500)
    put_run(web.redis, "b", "l1", "2026-01-01T00:01:00.000Z", loopName="alpha", status="failed",
            startedAt="2026-01-01T00:01:02.000Z", durationMs=20)
    put_run(web.redis, "c", "l1", "2026-01-01T00:02:00.000Z", loopName="alpha", attempt=2,
            startedAt="2026-01-01T00:09:00.000Z", durationMs=50)
    put_run(web.redis, "d", "l2", "2026-01-01T00:03:00.000Z", loopName="beta", status="running")
    web.client.post("/api/loops/hello/trigger")
    with Runtime(client=web.redis, role="worker"):
        response = web.client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=")
    got = samples(response.text)
    # No per-loop labels by default: the number of series does not grow with the number of loops.
    assert {k: v for k, v in got.items() if k[0] == "loopsq_runs_current"} == {
        ("loopsq_runs_current", (("status", "failed"),)): 1,
        ("loopsq_runs_current", (("status", "running"),)): 1,
        ("loopsq_runs_current", (("status", "succeeded"),)): 2,
    }
    assert {k: v for k, v in got.items() if k[0] == "loopsq_runs_total"} == {
        ("loopsq_runs_total", (("status", s),)): n
        for s, n in (("succeeded", 2), ("failed", 1), ("timed_out", 0), ("abandoned", 0), ("skipped", 0))
    }
    assert got[("loopsq_retries_total", ())] == 0
    assert {dict(k[1])["reason"] for k in got if k[0] == "loopsq_recoveries_total"} == {
        "worker_died", "lease_expired", "worker_shutdown", "other"}
    assert not any("loop_id" in dict(k[1]) for k in got)
    assert got[("loopsq_loops", (("status", "active"),))] == 1
    lag = {dict(k[1]).get("le"): v for k, v in got.items() if k[0] == "loopsq_scheduling_lag_seconds_bucket"}
    assert (lag["0.025"], lag["0.05"], lag["1.0"], lag["2.5"], lag["+Inf"]) == (0, 1, 1, 2, 2)  # attempt 2 left out
    assert got[("loopsq_scheduling_lag_seconds_count", ())] == 2
    assert got[("loopsq_scheduling_lag_seconds_sum", ())] == pytest.approx(2.04)
    duration = {dict(k[1]).get("le"): v for k, v in got.items() if k[0] == "loopsq_run_duration_seconds_bucket"}
    assert (duration["0.1"], duration["1.0"], duration["5.0"], duration["+Inf"]) == (2, 2, 3, 3)
    assert got[("loopsq_run_duration_seconds_sum", ())] == pytest.approx(1.57)
    assert got[("loopsq_queue_depth", (("queue", "loopsq"),))] == 1  # one series per queue (the base one here)
    assert got[("loopsq_workers_alive", ())] == 1
    assert got[("loopsq_schedulers_alive", ())] == 0


def test_retries_and_failures_are_counted_from_real_transitions_with_per_loop_labels_when_asked(
        redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path) -> None:
    from loopsq.engine.runner import run_now

    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False,
                           metrics_per_loop=True)
    with TestClient(create_app(settings), headers=AUTH) as client:
        once = {"type": "once", "at": "2020-01-01T00:00:00.000Z"}  # due now: a slot of its own, which is retried
        body = loop_body("flaky", "exit 3", maxAttempts=2, retryDelayMs=1, schedule=once)
        loop_id = client.post("/api/loops", json=body).json()["id"]
        client.get("/metrics")
        rt = Runtime(client=real_redis, role="manual").start()
        try:
            first = run_now(rt, loop_id)
            time.sleep(0.05)
            second = run_now(rt, loop_id)  # the retry of the same slot
        finally:
            rt.stop()
        assert (first.attempt, second.attempt, second.id) == (1, 2, first.id)
        got = samples(client.get("/metrics").text)
    labels = (("loop", "flaky"), ("loop_id", loop_id))
    assert got[("loopsq_runs_total", (*labels, ("status", "failed")))] == 2  # one row, two finished attempts
    assert got[("loopsq_retries_total", labels)] == 1
    assert got[("loopsq_runs_current", (*labels, ("status", "failed")))] == 1


def test_the_scheduling_lag_of_a_slot_before_its_loop_existed_counts_from_the_loop_s_creation(web: Web) -> None:
    past = loop_body("late", schedule={"type": "once", "at": "2019-01-01T00:00:00.000Z"})
    loop = web.client.post("/api/loops", json=past).json()
    web.client.get("/metrics")
    started = timeutil.to_iso(timeutil.from_iso(loop["createdAt"]) + timedelta(milliseconds=200))
    put_run(web.redis, "p1", loop["id"], "2019-01-01T00:00:00.000Z", loopName="late", startedAt=started)
    got = samples(web.client.get("/metrics").text)
    lag = {dict(k[1]).get("le"): v for k, v in got.items() if k[0] == "loopsq_scheduling_lag_seconds_bucket"}
    assert (lag["0.1"], lag["0.25"], lag["+Inf"]) == (0, 1, 1)
    assert got[("loopsq_scheduling_lag_seconds_sum", ())] == pytest.approx(0.2)


def test_reads_see_a_write_made_just_before_without_any_follower(web: Web) -> None:
    WorkflowStore(web.redis).create({"name": "direct", "steps": PIPELINE["steps"]}, timeutil.now())
    assert [w["name"] for w in web.client.get("/api/workflows").json()["items"]] == ["direct"]


def test_the_follower_thread_keeps_the_mirror_current_between_requests(
        redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path) -> None:
    from loopsq.mirror import queries
    from loopsq.mirror.schema import open_db

    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path, token=TOKEN, rq_dashboard=False)
    with TestClient(create_app(settings), headers=AUTH):
        WorkflowStore(real_redis).create({"name": "followed", "steps": PIPELINE["steps"]}, timeutil.now())
        deadline = time.monotonic() + 10
        names: list[str] = []
        while time.monotonic() < deadline and names != ["followed"]:
            time.sleep(0.05)
            conn = open_db(tmp_path / "loops.db")
            names = [w["name"] for w in queries.list_workflows(conn)]
            conn.close()
        assert names == ["followed"]


def test_the_queue_view_is_rq_dashboard_under_rq_with_its_assets(web: Web) -> None:
    page = web.client.get("/rq/")
    assert page.status_code == 200 and "<title>RQ dashboard</title>" in page.text
    assets = re.findall(r'(?:href|src)="(/rq/static/[^"]+)"', page.text)
    assert len(assets) >= 3
    assert [web.client.get(a).status_code for a in assets] == [200] * len(assets)
    queues = web.client.get("/rq/0/data/queues.json")
    assert queues.status_code == 200 and "queues" in queues.json()
