"""The web surface's bounds: the request body limit (413 before parsing), the full ``Allow`` header of a 405,
sessions that expire and that logout revokes server-side, rq-dashboard's state-changing routes closed to GET, and
the API's lifecycle no-ops and refusals."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from fastapi.testclient import TestClient

from loopsq.domain.limits import MAX_BODY_BYTES
from loopsq.state.keys import Keys
from loopsq.web import WebSettings, auth, create_app, csrf
from tests.integration.test_web_api import AUTH, TOKEN, assert_error, loop_body, redis_state
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

KEYS = Keys()


def make_app(redis_server: RedisServer, tmp_path: Path, **settings: Any) -> Any:
    return create_app(WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN,
                                  follow_mirror=False, **settings))


@pytest.fixture
def api(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("TZ", "UTC")
    with TestClient(make_app(redis_server, tmp_path), headers=AUTH) as client:
        yield client


# -- the body limit ----------------------------------------------------------------------------------------------
def test_a_body_over_the_limit_is_413_before_it_is_parsed_and_changes_nothing(
        api: TestClient, real_redis: redis.Redis) -> None:
    before = redis_state(real_redis)
    huge = json.dumps(loop_body(description="x" * (100 * 1024 * 1024)))
    assert_error(api.post("/api/loops", content=huge, headers={"Content-Type": "application/json"}), 413,
                 f"request body must be at most 1048576 bytes, got {len(huge)}")
    assert redis_state(real_redis) == before


def test_a_chunked_body_over_the_limit_is_413_after_reading_one_byte_past_it(
        api: TestClient, real_redis: redis.Redis) -> None:
    before = redis_state(real_redis)
    sent: list[int] = []

    def chunks() -> Iterator[bytes]:
        for _ in range(200):  # 200 MiB offered; the server stops reading past 1 MiB
            sent.append(1)
            yield b" " * (1024 * 1024)

    response = api.post("/api/loops", content=chunks(), headers={"Content-Type": "application/json"})
    assert_error(response, 413, "request body must be at most 1048576 bytes, got more than 1048576")
    assert redis_state(real_redis) == before


def test_a_body_of_exactly_the_limit_is_parsed(api: TestClient) -> None:
    text = json.dumps(loop_body("padded"))
    padded = text + " " * (MAX_BODY_BYTES - len(text))
    assert len(padded.encode()) == MAX_BODY_BYTES
    assert api.post("/api/loops", content=padded, headers={"Content-Type": "application/json"}).status_code == 201


def test_an_unauthenticated_body_is_refused_without_being_read(api: TestClient) -> None:
    huge = b"{" * (2 * MAX_BODY_BYTES)
    response = api.post("/api/loops", content=huge, headers={"Authorization": "Bearer wrong-token-0123456789"})
    assert_error(response, 401, "invalid API token")


def test_413_is_documented_on_every_operation_with_a_body(api: TestClient) -> None:
    doc = api.get("/api/openapi.json").json()
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if "requestBody" in operation:
                assert "413" in operation["responses"], (method, path)


# -- 405 ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "path", "allow"), [
    ("PUT", "/api/loops", "GET, HEAD, POST"),
    ("PUT", "/api/loops/x", "GET, HEAD, PATCH, DELETE"),
    ("GET", "/api/loops/x/trigger", "POST"),
    ("DELETE", "/api/workflows", "GET, HEAD, POST"),
    ("PUT", "/api/workflow-runs/x", "GET, HEAD"),
])
def test_a_405_allow_header_lists_every_method_of_the_path(api: TestClient, method: str, path: str,
                                                           allow: str) -> None:
    response = api.request(method, path)
    assert_error(response, 405, f"method {method} is not allowed on {path}")
    assert response.headers["allow"] == allow


def test_the_allow_header_names_methods_the_app_really_takes(api: TestClient) -> None:
    for method in api.request("PUT", "/api/loops").headers["allow"].split(", "):
        assert api.request(method, "/api/loops", json=loop_body("allowed")).status_code in (200, 201)


# -- sessions ----------------------------------------------------------------------------------------------------
def login(client: TestClient) -> str:
    response = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert response.status_code == 303
    return str(client.cookies[auth.COOKIE_NAME])


def test_logout_revokes_the_session_on_the_server(redis_server: RedisServer, real_redis: redis.Redis,
                                                  tmp_path: Path) -> None:
    with TestClient(make_app(redis_server, tmp_path)) as browser:
        cookie = login(browser)
        assert browser.get("/").status_code == 200
        assert len(real_redis.keys(KEYS.web_session("*"))) == 1
        browser.post("/logout")
        assert real_redis.keys(KEYS.web_session("*")) == []
    with TestClient(make_app(redis_server, tmp_path)) as thief:  # another process, the copied cookie
        thief.cookies.set(auth.COOKIE_NAME, cookie)
        assert_error(thief.get("/"), 401, auth.EXPIRED)
        assert_error(thief.get("/metrics"), 401, auth.EXPIRED)


def test_a_session_expires_after_its_lifetime_even_if_the_cookie_is_kept(
        redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path) -> None:
    app = make_app(redis_server, tmp_path, session_ttl_s=120)
    with TestClient(app) as browser:
        response = browser.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert "max-age=120" in response.headers["set-cookie"].lower()
        key = real_redis.keys(KEYS.web_session("*"))[0]
        assert 110_000 < real_redis.pttl(key) <= 120_000
        assert browser.get("/").status_code == 200
        sessions = app.state.ctx.sessions
        issued = int(str(browser.cookies[auth.COOKIE_NAME]).split(".")[2])
        sessions.clock_ms = lambda: issued + 119_999
        assert browser.get("/").status_code == 200
        sessions.clock_ms = lambda: issued + 120_000  # the Redis key may linger; the cookie's own time says no
        assert_error(browser.get("/"), 401, auth.EXPIRED)


def test_the_default_lifetime_is_twelve_hours(redis_server: RedisServer, tmp_path: Path) -> None:
    with TestClient(make_app(redis_server, tmp_path)) as browser:
        response = browser.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert f"max-age={12 * 3600}" in response.headers["set-cookie"].lower()


def test_an_edited_or_foreign_cookie_opens_nothing(redis_server: RedisServer, tmp_path: Path) -> None:
    with TestClient(make_app(redis_server, tmp_path)) as browser:
        cookie = login(browser)
        version, session, issued, mac = cookie.split(".")
        for forged in (f"{version}.{session}.{int(issued) + 1}.{mac}", f"{version}.{'0' * 32}.{issued}.{mac}",
                       f"{version}.{session}.{issued}.{'0' * 64}", "v1.x", ""):
            browser.cookies.clear()
            browser.cookies.set(auth.COOKIE_NAME, forged)
            assert browser.get("/").status_code == 401, forged
    other = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "d2", token="another-token-0123456789",
                        follow_mirror=False)
    with TestClient(create_app(other)) as elsewhere:  # a deployment with another token
        elsewhere.cookies.set(auth.COOKIE_NAME, cookie)
        assert elsewhere.get("/").status_code == 401


def test_loopsq_web_takes_the_session_lifetime_from_a_flag_or_the_environment(
        redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopsq.cli import cli

    served: dict[str, Any] = {}
    from tests.redis_server import free_port

    def fake_run(server: Any, sockets: Any = None) -> None:  # the app as `loopsq web` builds it, not served
        served.update(app=server.config.app)
        server.started = True

    monkeypatch.setattr("uvicorn.Server.run", fake_run)
    monkeypatch.setenv("LOOPSQ_REDIS_URL", redis_server.url)
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LOOPSQ_API_TOKEN", TOKEN)
    port = str(free_port())
    result = CliRunner().invoke(cli, ["web", "--port", port, "--session-ttl", "2h"])
    assert result.exit_code == 0, result.output
    assert served["app"].state.ctx.settings.session_ttl_s == 7200
    monkeypatch.setenv("LOOPSQ_SESSION_TTL", "30m")
    assert CliRunner().invoke(cli, ["web", "--port", port]).exit_code == 0
    assert served["app"].state.ctx.settings.session_ttl_s == 1800
    result = CliRunner().invoke(cli, ["web", "--session-ttl", "30s"])
    assert (result.exit_code, result.stderr) == (2, "error: --session-ttl must be at least 1m, got '30s'\n")


# -- rq-dashboard ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/rq/requeue/loopsq", "/rq/queue/loopsq/compact", "/rq/queue/loopsq/failed/empty",
                                  "/rq/job/abc/requeue", "/rq/job/abc/delete"])
def test_rq_dashboards_state_changing_routes_cannot_be_reached_by_get(
        api: TestClient, real_redis: redis.Redis, path: str) -> None:
    before = redis_state(real_redis)
    for method in ("GET", "HEAD"):
        response = api.request(method, path)
        assert (response.status_code, response.headers["allow"]) == (405, "OPTIONS, POST"), (method, path)
    assert api.get(path).json() == {"error": {"status": 405, "code": "method_not_allowed", "message":
                                              f"method GET is not allowed on {path}: it changes state; use POST"}}
    assert redis_state(real_redis) == before


def test_rq_dashboards_pages_and_its_post_routes_still_work(api: TestClient) -> None:
    assert api.get("/rq/").status_code == 200
    assert api.get("/rq/0/data/queues.json").status_code == 200
    assert api.post("/rq/requeue/loopsq", headers={"X-CSRF-Token": csrf.token_of(TOKEN, "bearer")}).json() == {
        "status": "OK", "count": 0}


# -- lifecycle through the API -----------------------------------------------------------------------------------
def test_api_lifecycle_no_ops_write_nothing_and_refusals_are_409(api: TestClient, real_redis: redis.Redis) -> None:
    loop = api.post("/api/loops", json=loop_body()).json()
    assert api.post("/api/loops/hello/pause").json()["status"] == "paused"
    before = redis_state(real_redis)
    again = api.post("/api/loops/hello/pause")
    assert (again.status_code, again.json()["status"]) == (200, "paused")
    assert redis_state(real_redis) == before
    assert api.post("/api/loops/hello/stop").json()["status"] == "stopped"
    before = redis_state(real_redis)
    assert_error(api.post("/api/loops/hello/pause"), 409,
                 f"loop hello ({loop['id']}) is stopped: only an active loop can be paused")
    assert redis_state(real_redis) == before
    assert api.get("/api/loops/hello").json()["status"] == "stopped"


def test_a_loop_name_that_is_another_loops_id_is_409(api: TestClient, real_redis: redis.Redis) -> None:
    first = api.post("/api/loops", json=loop_body()).json()
    before = redis_state(real_redis)
    assert_error(api.post("/api/loops", json=loop_body(first["id"])), 409,
                 f"loop name is another loop's id: {first['id']}")
    assert redis_state(real_redis) == before


def test_a_malformed_mirror_is_named_with_its_repair_command(api: TestClient, tmp_path: Path) -> None:
    assert api.get("/api/loops").status_code == 200
    db = tmp_path / "data" / "loops.db"
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(b"\xa5" * 8192)
    assert_error(api.get("/api/loops"), 500, f"the mirror database {db} is malformed (file is not a database); "
                                             "repair it with: loopsq mirror --rebuild")
