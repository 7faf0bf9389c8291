"""The API and the dashboard for the behaviours from later OpenLoops versions: the default circuit breaker and
``expiresAfterRuns`` in create bodies (one 400 naming the field and the value, nothing stored), and the command
line with its ``commandDigest`` on the API's loop detail and the dashboard's loop page."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from loopsq.domain.models import Loop
from loopsq.executor.digest import resolve_command
from loopsq.state.keys import Keys
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, TOKEN, assert_error, loop_body, redis_state
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()


@pytest.fixture
def client(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("TZ", "UTC")
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False,
                           rq_dashboard=False)
    with TestClient(create_app(settings), headers={**AUTH, "Accept": "text/html"}) as client:
        yield client


def stored(real_redis: redis.Redis, loop_id: str) -> Loop:
    return Loop.from_json(str(real_redis.get(KEYS.loop(loop_id))))


def create(client: TestClient, name: str, command: str = "echo hi", **fields: Any) -> dict[str, Any]:
    response = client.post("/api/loops", json=loop_body(name, command, **fields))
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def test_the_api_stores_the_default_breaker_zero_turning_it_off_and_expires_after_runs(
        client: TestClient, real_redis: redis.Redis) -> None:
    default = create(client, "default")
    off = create(client, "off", pauseAfterFailures=0)
    expiring = create(client, "expiring", expiresAfterRuns=4)
    assert (default["pauseAfterFailures"], off["pauseAfterFailures"]) == (5, 0)
    assert (expiring["expiresAfterRuns"], expiring["successStreak"]) == (4, 0)
    shown = client.get("/api/loops/expiring").json()
    assert (shown["expiresAfterRuns"], shown["successStreak"], shown["pauseAfterFailures"]) == (4, 0, 5)
    assert stored(real_redis, expiring["id"]).expires_after_runs == 4


@pytest.mark.parametrize(("field", "value", "message"), [
    ("expiresAfterRuns", 0, "expiresAfterRuns must be a positive integer, got 0"),
    ("expiresAfterRuns", -2, "expiresAfterRuns must be a positive integer, got -2"),
    ("expiresAfterRuns", "3", 'expiresAfterRuns must be a positive integer, got "3"'),
    ("pauseAfterFailures", -1, "pauseAfterFailures must be a whole number (0 turns the circuit breaker off), "
                               "got -1"),
])
def test_a_bad_value_is_a_400_naming_the_field_and_the_value_and_stores_nothing(
        client: TestClient, real_redis: redis.Redis, field: str, value: Any, message: str) -> None:
    before = redis_state(real_redis)
    assert_error(client.post("/api/loops", json=loop_body("bad", "true", **{field: value})), 400, message)
    assert redis_state(real_redis) == before


def test_the_loop_detail_and_the_loop_page_show_the_command_line_and_its_digest(
        client: TestClient, real_redis: redis.Redis) -> None:
    created = create(client, "digested", "echo 'hi there'", target={"type": "command", "shell": True,
                                                                   "command": "echo 'hi there'",
                                                                   "env": {"TOKEN": "s3cret"}})
    expected = resolve_command(stored(real_redis, created["id"]).target)
    detail = client.get(f"/api/loops/{created['id']}").json()
    assert (detail["commandLine"], detail["commandDigest"]) == (expected.line, expected.digest)
    assert detail["commandEnvKeys"] == list(expected.env_keys) and "TOKEN" in detail["commandEnvKeys"]
    assert "commandDigest" not in client.get("/api/loops").json()["items"][0]  # (the detail only)
    page = client.get(f"/loops/{created['id']}").text
    line = re.search(r'<dd id="command-line" class="mono">([^<]*)</dd>', page)
    digest = re.search(r'<dd id="command-digest" [^>]*>([^<]*)</dd>', page)
    assert line and digest, page
    assert (html.unescape(line.group(1)), digest.group(1)) == (expected.line, expected.digest)
    assert "s3cret" not in page


def test_the_sdk_takes_expires_after_runs_and_names_a_bad_value(redis_server: RedisServer,
                                                                real_redis: redis.Redis) -> None:
    from loopsq.errors import ValidationError
    from loopsq.sdk import LoopsClient

    sdk = LoopsClient(redis_server.url)
    try:
        loop = sdk.create(loop_body("sdk-expiring", expiresAfterRuns=2, pauseAfterFailures=0))
        assert (loop.expires_after_runs, loop.success_streak, loop.pause_after_failures) == (2, 0, 0)
        before = redis_state(real_redis)
        with pytest.raises(ValidationError) as refused:
            sdk.create(loop_body("sdk-bad", expiresAfterRuns=0))
        assert refused.value.message == "expiresAfterRuns must be a positive integer, got 0"
        assert redis_state(real_redis) == before
    finally:
        sdk.close()
