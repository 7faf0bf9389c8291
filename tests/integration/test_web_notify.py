"""``/api/notifications``: list, show, set (PUT) and delete notification endpoints, in-process against the
session's redis-server, with the one error body and nothing changed by a refused request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from loopsq.state.keys import Keys
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, TOKEN, assert_error, redis_state
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

EVENTS = "failed, recovered, missed, paused, overdue"


@pytest.fixture
def api(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path) -> Iterator[TestClient]:
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False,
                           rq_dashboard=False)
    with TestClient(create_app(settings), headers=AUTH) as client:
        yield client


def test_put_creates_with_a_secret_once_then_replaces_keeping_it(api: TestClient, real_redis: redis.Redis) -> None:
    created = api.put("/api/notifications/ops", json={"webhook": "https://h.example.com/x"})
    assert created.status_code == 200
    body = created.json()
    secret = body.pop("secret")
    assert secret.startswith("whsec_")
    assert body == {"name": "ops", "webhook": "https://h.example.com/x", "on": ["failed", "recovered", "missed",
                                                                                  "paused"],
                    "tags": {}, "alertAfterMs": None, "createdAt": body["createdAt"]}
    changed = api.put("/api/notifications/ops", json={"webhook": "http://127.0.0.1:9/h", "on": ["overdue"],
                                                       "tags": {"team": "data"}, "alertAfterMs": 60000}).json()
    assert "secret" not in changed
    assert (changed["on"], changed["tags"], changed["alertAfterMs"]) == (["overdue"], {"team": "data"}, 60000)
    shown = api.get("/api/notifications/ops").json()
    assert shown == {**changed, "pending": 0}
    assert api.get("/api/notifications").json() == {"items": [shown]}
    assert secret in real_redis.hget(Keys().notify_endpoints, "ops")


def test_delete_removes_it_and_an_unknown_one_is_404(api: TestClient) -> None:
    api.put("/api/notifications/ops", json={"webhook": "https://h.example.com/x"})
    assert api.delete("/api/notifications/ops").json() == {"removed": True, "name": "ops"}
    assert_error(api.delete("/api/notifications/ops"), 404, "notification not found: ops")
    assert_error(api.get("/api/notifications/ops"), 404, "notification not found: ops")


@pytest.mark.parametrize(("body", "message"), [
    ({"webhook": "ftp://x.example.com"}, 'webhook must be an http(s) URL, got "ftp://x.example.com"'),
    ({"webhook": 5}, "webhook must be an http(s) URL, got 5"),
    ({}, "webhook is required"),
    ({"webhook": "https://h.example.com", "on": ["boom"]}, f'on takes {EVENTS}, got "boom"'),
    ({"webhook": "https://h.example.com", "on": "failed"}, f'on must be a list of {EVENTS}, got "failed"'),
    ({"webhook": "https://h.example.com", "alertAfterMs": 0},
     "alertAfterMs must be a duration greater than zero such as 2h, got 0"),
    ({"webhook": "https://h.example.com", "tags": {"team": 1}}, "tags.team must be a string, got 1"),
    ({"webhook": "https://h.example.com", "secret": "x"},
     'notification body takes only webhook, on, tags, alertAfterMs, got "secret"'),
])
def test_bad_input_is_400_and_changes_nothing(api: TestClient, real_redis: redis.Redis, body: dict[str, Any],
                                              message: str) -> None:
    api.put("/api/notifications/ops", json={"webhook": "https://h.example.com/x"})
    before = redis_state(real_redis)
    assert_error(api.put("/api/notifications/ops", json=body), 400, message)
    assert_error(api.put("/api/notifications/new", json=body), 400, message)
    assert redis_state(real_redis) == before
