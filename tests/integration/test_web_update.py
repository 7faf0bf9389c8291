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
from tests.integration.test_web_api import AUTH, TOKEN, Web, assert_error, loop_body, redis_state
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


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
