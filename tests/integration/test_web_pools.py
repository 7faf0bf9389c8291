"""``/api/pools``: list, show, set (PUT) and delete fleet-wide pools, in-process against the session's redis-server,
with the one error body and nothing changed by a refused request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from loopsq.state.keys import Keys
from loopsq.state.pools import Acquired, PoolStore
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, TOKEN, assert_error, redis_state
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

LABEL = "[a-z0-9][a-z0-9._:/-]{0,63}"


@pytest.fixture
def api(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path) -> Iterator[TestClient]:
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False,
                           rq_dashboard=False)
    with TestClient(create_app(settings), headers=AUTH) as client:
        yield client


def test_put_creates_then_changes_a_pool_and_get_shows_it(api: TestClient, real_redis: redis.Redis) -> None:
    response = api.put("/api/pools/claude-acct", json={"limit": 3})
    assert (response.status_code, response.json()) == (200, {
        "name": "claude-acct", "limit": 3, "inUse": 0, "waiting": 0, "holders": [], "waiters": []})
    assert api.put("/api/pools/claude-acct", json={"limit": 1}).json()["limit"] == 1
    store = PoolStore(real_redis, Keys())
    held = store.acquire("claude-acct", "run1", 60_000)
    assert isinstance(held, Acquired)
    store.acquire("claude-acct", "run2", 60_000)
    body = api.get("/api/pools/claude-acct").json()
    assert (body["inUse"], body["waiting"]) == (1, 1)
    assert [(h["holder"], h["fence"]) for h in body["holders"]] == [("run1", held.fence)]
    assert [(w["holder"], w["position"]) for w in body["waiters"]] == [("run2", 0)]
    assert api.get("/api/pools").json() == {"items": [
        {"name": "claude-acct", "limit": 1, "inUse": 1, "waiting": 1}]}


def test_a_name_with_a_slash_is_one_pool(api: TestClient) -> None:
    assert api.put("/api/pools/repo/web", json={"limit": 2}).json()["name"] == "repo/web"
    assert api.get("/api/pools/repo%2Fweb").json()["name"] == "repo/web"
    assert api.delete("/api/pools/repo/web").json() == {"removed": True, "name": "repo/web"}


def test_delete_removes_the_pool_and_an_unknown_pool_is_404(api: TestClient, real_redis: redis.Redis) -> None:
    api.put("/api/pools/gpu", json={"limit": 1})
    response = api.delete("/api/pools/gpu")
    assert (response.status_code, response.json()) == (200, {"removed": True, "name": "gpu"})
    assert real_redis.keys("loopsq:pool*") == []
    assert_error(api.delete("/api/pools/gpu"), 404, "pool not found: gpu")
    assert_error(api.get("/api/pools/gpu"), 404, "pool not found: gpu")


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/api/pools/acct", {"limit": 0}, "limit must be a positive integer, got 0"),
    ("/api/pools/acct", {"limit": -2}, "limit must be a positive integer, got -2"),
    ("/api/pools/acct", {"limit": "3"}, 'limit must be a positive integer, got "3"'),
    ("/api/pools/acct", {"limit": True}, "limit must be a positive integer, got true"),
    ("/api/pools/acct", {"limit": 10_001}, "limit must be at most 10000, got 10001"),
    ("/api/pools/acct", {}, "limit is required"),
    ("/api/pools/acct", {"limit": 2, "size": 3}, 'pool body takes only limit, got "size"'),
    ("/api/pools/acct", [2], "request body must be a JSON object, got [2]"),
    ("/api/pools/Acct", {"limit": 2}, f'pool name must be a label ({LABEL}), got "Acct"'),
    ("/api/pools/a%20b", {"limit": 2}, f'pool name must be a label ({LABEL}), got "a b"'),
])
def test_bad_input_is_400_naming_the_field_and_changes_nothing(
        api: TestClient, real_redis: redis.Redis, path: str, body: object, message: str) -> None:
    api.put("/api/pools/acct", json={"limit": 2})
    before = redis_state(real_redis)
    assert_error(api.put(path, json=body), 400, message)
    assert redis_state(real_redis) == before


def test_a_malformed_name_is_400_on_reads_and_deletes_too(api: TestClient) -> None:
    assert_error(api.get("/api/pools/Bad"), 400, f'pool name must be a label ({LABEL}), got "Bad"')
    assert_error(api.delete("/api/pools/Bad"), 400, f'pool name must be a label ({LABEL}), got "Bad"')


def test_pools_need_the_token(api: TestClient) -> None:
    assert api.get("/api/pools", headers={"Authorization": ""}).status_code == 401
    assert api.put("/api/pools/acct", json={"limit": 1}, headers={"Authorization": "Bearer nope"}).status_code == 401


def test_the_openapi_document_describes_the_pool_routes_and_links_a_set_to_its_show(api: TestClient) -> None:
    doc = api.get("/api/openapi.json").json()
    put = doc["paths"]["/api/pools/{name}"]["put"]
    schema = put["requestBody"]["content"]["application/json"]["schema"]
    assert {k: v for k, v in schema.items() if k != "title"} == {
        "type": "object", "required": ["limit"], "additionalProperties": False,
        "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": 10_000}}}
    assert sorted(put["responses"]) == ["200", "400", "401", "413", "500", "503"]
    assert set(put["responses"]["200"]["links"]) == {"ShowPool", "DeletePool"}
    assert sorted(doc["paths"]["/api/pools/{name}"]) == ["delete", "get", "put"]
