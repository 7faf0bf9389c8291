"""``PATCH /api/loops/{loop}`` (issue 31, point 2): an edit in place, validated as a create, described exactly by
the OpenAPI document; bad input is 400 naming the field and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from loopsq.domain.loop_update import UPDATABLE
from loopsq.domain.timeutil import from_iso, to_ms
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, TOKEN, Web, assert_error, loop_body, put_run, redis_state
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

FLOW = {"name": "nightly", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}


@pytest.fixture
def web(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[Web]:
    monkeypatch.setenv("TZ", "UTC")
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False)
    with TestClient(create_app(settings), headers=AUTH) as client:
        yield Web(client, real_redis, redis_server.url, tmp_path / "data")


def test_patch_changes_the_schedule_from_now_keeps_the_id_and_arms_the_timer(web: Web) -> None:
    created = web.client.post("/api/loops", json=loop_body()).json()
    response = web.client.patch("/api/loops/hello", json={"schedule": {"type": "interval", "everyMs": 5000},
                                                          "maxAttempts": 2})
    assert response.status_code == 200, response.text
    loop = response.json()
    assert (loop["id"], loop["name"], loop["status"], loop["maxAttempts"]) == (created["id"], "hello", "active", 2)
    assert loop["schedule"] == {"type": "interval", "everyMs": 5000, "anchor": "fixed_rate"}
    assert loop["nextRunAt"] < created["nextRunAt"]
    job_id = web.redis.get(f"loopsq:timer:{created['id']}")
    assert job_id is not None and f"-{to_ms(from_iso(loop['nextRunAt']))}-" in job_id
    assert web.client.get("/api/loops/hello").json()["schedule"]["everyMs"] == 5000
    types = [fields["type"] for _, fields in web.redis.xrange("loopsq:changes")]
    assert types.count("loop_updated") == 1


@pytest.mark.parametrize(("body", "message"), [
    ({}, "loop update must change at least one field, got {}"),
    ([1], "request body must be a JSON object, got [1]"),
    ({"name": "x"}, 'name is changed by rename, not update, got "x"'),
    ({"nope": 1}, 'unknown loop field: "nope"'),
    ({"target": None}, "target must not be null, got null"),
    ({"overlap": "never"}, 'overlap must be one of skip, allow, replace, got "never"'),
    ({"target": {"type": "workflow", "workflowId": "ghost"}}, 'target.workflowId must name a stored workflow, got "ghost"'),
])
def test_bad_patches_are_400_naming_the_field_and_change_nothing(web: Web, body: Any, message: str) -> None:
    web.client.post("/api/loops", json=loop_body())
    before = redis_state(web.redis)
    assert_error(web.client.patch("/api/loops/hello", json=body), 400, message)
    assert redis_state(web.redis) == before


def test_patching_an_unknown_loop_is_404_and_an_archived_one_409(web: Web) -> None:
    before = redis_state(web.redis)
    assert_error(web.client.patch("/api/loops/ghost", json={"maxAttempts": 2}), 404, "loop not found: ghost")
    assert redis_state(web.redis) == before
    web.client.post("/api/loops", json=loop_body())
    web.client.post("/api/loops/hello/archive")
    assert_error(web.client.patch("/api/loops/hello", json={"maxAttempts": 2}), 409,
                 "loop is archived; unarchive it before updating: hello")


def test_the_document_describes_the_patch_body_exactly(web: Web) -> None:
    doc = web.client.get("/api/openapi.json").json()
    patch = doc["paths"]["/api/loops/{loop}"]["patch"]
    assert patch["requestBody"]["content"]["application/json"]["schema"]["$ref"] == "#/components/schemas/LoopUpdate"
    update = doc["components"]["schemas"]["LoopUpdate"]
    create = doc["components"]["schemas"]["LoopCreate"]
    assert (update["additionalProperties"], update["minProperties"], update.get("required")) == (False, 1, None)
    assert set(update["properties"]) >= set(create["properties"]) - {"name"}
    assert set(update["properties"]) == set(UPDATABLE)  # the server takes exactly what the document lists
    assert set(patch["responses"]) >= {"200", "400", "404", "409"}


# -- tags (issue 31, point 3) ------------------------------------------------------------------------------------
TAG_FORMAT = "KEY:VALUE, each of [A-Za-z0-9_./-] (key at most 64, value at most 128 characters)"


def test_tags_filter_loops_runs_and_workflows_with_and(web: Web) -> None:
    etl = web.client.post("/api/loops", json=loop_body("etl", tags={"team": "data", "env": "prod"})).json()
    web_loop = web.client.post("/api/loops", json=loop_body("web", tags={"team": "web", "env": "prod"})).json()
    assert etl["tags"] == {"env": "prod", "team": "data"}
    put_run(web.redis, "r-etl", etl["id"], "2026-01-01T00:00:00.000Z", loopName="etl")
    put_run(web.redis, "r-web", web_loop["id"], "2026-01-01T00:00:01.000Z", loopName="web")

    def loops(query: str) -> list[str]:
        return sorted(loop["name"] for loop in web.client.get(f"/api/loops{query}").json()["items"])

    assert loops("?tag=env:prod") == ["etl", "web"]
    assert loops("?tag=env:prod&tag=team:data") == ["etl"]
    assert loops("?tag=team:ops") == []
    assert loops("?name=e&tag=team:web") == ["web"]  # the keyset page filters too
    assert [r["id"] for r in web.client.get("/api/runs?tag=team:web").json()["items"]] == ["r-web"]
    assert [r["id"] for r in web.client.get("/api/runs?tag=env:prod").json()["items"]] == ["r-web", "r-etl"]
    patched = web.client.patch("/api/loops/web", json={"tags": {"team": "data"}}).json()
    assert patched["tags"] == {"team": "data"}
    assert loops("?tag=team:data") == ["etl", "web"]
    assert "tags" not in web.client.patch("/api/loops/web", json={"tags": None}).json()
    spec = {"name": "wf", "tags": {"team": "data"},
            "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}
    assert web.client.post("/api/workflows", json=spec).status_code == 201
    assert [w["name"] for w in web.client.get("/api/workflows?tag=team:data").json()["items"]] == ["wf"]
    assert web.client.get("/api/workflows?tag=team:web").json()["items"] == []


@pytest.mark.parametrize(("method", "path", "body", "message"), [
    ("get", "/api/loops?tag=team", None, f"tag must be {TAG_FORMAT}, got \"team\""),
    ("get", "/api/runs?tag=a%20b:c", None, f"tag must be {TAG_FORMAT}, got \"a b:c\""),
    ("get", "/api/workflows?tag=:x", None, f"tag must be {TAG_FORMAT}, got \":x\""),
    ("post", "/api/loops", loop_body("t", tags={"k": ""}), 'tags.k must be 1 to 128 characters of [A-Za-z0-9_./-], got ""'),
    ("post", "/api/loops", loop_body("t", tags={f"k{i}": "v" for i in range(21)}),
     "tags must be an object of at most 20 key: value strings, got 21 tags"),
    ("patch", "/api/loops/hello", {"tags": {"a:b": "c"}}, 'tags key must be 1 to 64 characters of [A-Za-z0-9_./-], got "a:b"'),
])
def test_bad_tags_are_400_naming_the_field_and_change_nothing(web: Web, method: str, path: str, body: Any,
                                                               message: str) -> None:
    web.client.post("/api/loops", json=loop_body())
    before = redis_state(web.redis)
    response = web.client.request(method.upper(), path, json=body)
    assert_error(response, 400, message)
    assert redis_state(web.redis) == before


# -- apply (issue 31, point 1) -----------------------------------------------------------------------------------
def test_post_apply_plans_applies_and_is_idempotent(web: Web) -> None:
    specs = [loop_body("etl", tags={"team": "data"}), loop_body("web")]
    dry = web.client.post("/api/apply", json={"loops": specs, "dryRun": True})
    assert dry.json() == {"plan": [{"action": "create", "kind": "loop", "name": "etl", "changes": []},
                                   {"action": "create", "kind": "loop", "name": "web", "changes": []}],
                          "applied": False}
    assert web.redis.keys("loopsq:loop:*") == []
    assert web.client.post("/api/apply", json={"loops": specs, "owner": "repo1"}).json()["applied"] is True
    before = redis_state(web.redis)
    again = web.client.post("/api/apply", json={"loops": specs, "owner": "repo1"}).json()
    assert [s["action"] for s in again["plan"]] == ["unchanged", "unchanged"]
    assert redis_state(web.redis) == before
    pruned = web.client.post("/api/apply", json={"loops": specs[:1], "owner": "repo1", "prune": True}).json()
    assert pruned["plan"][1] == {"action": "prune", "kind": "loop", "name": "web", "changes": []}
    assert web.client.get("/api/loops/web").status_code == 404


@pytest.mark.parametrize(("body", "message"), [
    ({"loops": [loop_body("a"), loop_body("b", maxAttempts=0)]},
     'loops[1] "b": maxAttempts must be a positive integer, got 0'),
    ({"loops": [loop_body("a")], "prune": True}, "prune requires owner (only loops an apply created are pruned)"),
    ({"loops": [], "owner": "a b"}, 'owner must be 1 to 128 characters of [A-Za-z0-9_./-], got "a b"'),
    ({"loops": [1]}, "loops[0] must be an object, got 1"),
    ({"loops": [], "workflows": [FLOW, {**FLOW, "steps": []}]},
     'workflows[1] "nightly": workflow.steps must contain at least one step'),
    ({"loops": [], "workflows": [{**FLOW, "x": 1}]}, 'workflows[0] "nightly": unknown workflow field: "x"'),
    ({"loops": [], "workflows": {}}, "workflows must be an array of at most 1000 workflow specs, got {}"),
    ({"loops": [], "workflows": None}, "workflows must be an array of at most 1000 workflow specs, got null"),
    ({"loops": [], "extra": 1}, 'unknown apply field: "extra"'),
    ({}, "loops is required"),
    ({"loops": [], "dryRun": "yes"}, 'dryRun must be a boolean, got "yes"'),
])
def test_a_bad_apply_is_400_and_changes_nothing(web: Web, body: Any, message: str) -> None:
    before = redis_state(web.redis)
    assert_error(web.client.post("/api/apply", json=body), 400, message)
    assert redis_state(web.redis) == before


def test_the_sdk_applies_the_same_plan(web: Web) -> None:
    from loopsq.sdk import LoopsClient

    client = LoopsClient(web.url)
    try:
        planned = [{"action": "create", "kind": "loop", "name": "etl", "changes": []}]
        assert client.apply([loop_body("etl")], dry_run=True) == planned
        assert client.apply([loop_body("etl")]) == planned
        changed = client.apply([loop_body("etl", maxAttempts=2)])
        assert changed == [{"action": "update", "kind": "loop", "name": "etl", "changes": ["maxAttempts"]}]
        assert client.get("etl").max_attempts == 2
        runs_flow = loop_body("flow", target={"type": "workflow", "workflowId": "nightly"})
        assert client.apply([runs_flow], workflows=[FLOW]) == [
            {"action": "create", "kind": "workflow", "name": "nightly", "changes": []},
            {"action": "create", "kind": "loop", "name": "flow", "changes": []}]
        assert [s["action"] for s in client.apply([runs_flow], workflows=[FLOW])] == ["unchanged", "unchanged"]
    finally:
        client.close()


def test_post_apply_takes_workflows_and_a_loop_naming_one(web: Web) -> None:
    runs_flow = loop_body("etl", target={"type": "workflow", "workflowId": "nightly"})
    body = {"loops": [runs_flow], "workflows": [FLOW], "owner": "repo1"}
    created = web.client.post("/api/apply", json=body)
    assert created.status_code == 200, created.text
    assert created.json()["plan"] == [{"action": "create", "kind": "workflow", "name": "nightly", "changes": []},
                                      {"action": "create", "kind": "loop", "name": "etl", "changes": []}]
    flow = web.client.get("/api/workflows/nightly").json()
    assert web.client.get("/api/loops/etl").json()["target"]["workflowId"] == flow["id"]
    before = redis_state(web.redis)
    again = web.client.post("/api/apply", json=body).json()
    assert [(s["action"], s["kind"]) for s in again["plan"]] == [("unchanged", "workflow"), ("unchanged", "loop")]
    assert redis_state(web.redis) == before
    edited = {**FLOW, "description": "two"}
    plan = web.client.post("/api/apply", json={**body, "workflows": [edited]}).json()["plan"]
    assert plan[0] == {"action": "update", "kind": "workflow", "name": "nightly", "changes": ["description"]}
    assert web.client.get("/api/workflows/nightly").json()["id"] == flow["id"]
    pruned = web.client.post("/api/apply", json={"loops": [], "owner": "repo1", "prune": True}).json()["plan"]
    assert pruned == [{"action": "prune", "kind": "loop", "name": "etl", "changes": []},
                      {"action": "prune", "kind": "workflow", "name": "nightly", "changes": []}]
