"""Authentication of the HTTP API and dashboard, and ``loopsq web``'s start-up rules and process."""

from __future__ import annotations

import hmac
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner
from fastapi.testclient import TestClient

from loopsq import __version__
from loopsq.cli import cli
from loopsq.domain import timeutil
from loopsq.state.layout import LAYOUT
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.web import WebSettings, auth, create_app
from tests.integration.test_web_api import PIPELINE, TOKEN, assert_error, loop_body, redis_state
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration

MISSING = "missing API token: send the header 'Authorization: Bearer <LOOPSQ_API_TOKEN>'"


@pytest.fixture
def app_client(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path) -> Iterator[TestClient]:
    """A client that sends no token by default, on an app with a loop, a workflow and a running workflow run."""
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False)
    with TestClient(create_app(settings)) as client:
        authed = {"Authorization": f"Bearer {TOKEN}"}
        assert client.post("/api/loops", json=loop_body(), headers=authed).status_code == 201
        spec = WorkflowStore(real_redis).create(PIPELINE, timeutil.now())
        state, _ = WorkflowRunStore(real_redis).create(spec, timeutil.now())
        client.app.state.run_id = state.run_id  # type: ignore[attr-defined]
        yield client


def every_operation(client: TestClient) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(method, concrete path, JSON body) for each operation of the OpenAPI document that needs the token."""
    doc = client.get("/api/openapi.json").json()
    run_id = client.app.state.run_id  # type: ignore[attr-defined]
    bodies = {("post", "/api/loops"): loop_body("another"), ("post", "/api/workflows"): {**PIPELINE, "name": "w2"},
              ("post", "/api/workflow-runs/{run_id}/cancel"): {"reason": "x"},
              ("post", "/api/loops/{loop}/rename"): {"name": "renamed"},
              ("patch", "/api/loops/{loop}"): {"maxAttempts": 2},
              ("post", "/api/apply"): {"loops": [], "dryRun": True}}
    out = []
    for template, operations in doc["paths"].items():
        for method, operation in operations.items():
            if operation.get("security") == []:
                continue
            path = template.replace("{loop}", "hello").replace("{workflow}", "pipeline").replace("{run_id}", run_id)
            out.append((method, path, bodies.get((method, template))))
    return out


@pytest.mark.parametrize("authorization", [None, f"Bearer {TOKEN}x", "Bearer wrong", f"bearer {TOKEN[:-1]}"])
def test_every_endpoint_refuses_a_missing_or_wrong_token_with_401_and_changes_nothing(
        app_client: TestClient, real_redis: redis.Redis, authorization: str | None) -> None:
    operations = every_operation(app_client)
    # All but the health probe, /metrics included (archive, unarchive, restore, rename, update, apply too), the
    # four of pools and the four of notifications.
    assert len(operations) == 35
    headers = {"Authorization": authorization} if authorization else {}
    before = redis_state(real_redis)
    for method, path, body in operations:
        response = app_client.request(method, path, json=body, headers=headers)
        assert_error(response, 401, MISSING if authorization is None else "invalid API token")
        assert response.headers["www-authenticate"] == 'Bearer realm="loopsq"'
    assert redis_state(real_redis) == before


def test_a_malformed_authorization_header_is_401(app_client: TestClient) -> None:
    for header in ("Basic dXNlcjpwYXNz", "Bearer", "Bearer  ", TOKEN):
        assert_error(app_client.get("/api/loops", headers={"Authorization": header}), 401,
                     "malformed Authorization header: expected 'Bearer <token>'")


def test_the_token_is_compared_in_constant_time(app_client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    original = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return original(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    assert app_client.get("/api/loops", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert calls == [(b"nope", TOKEN.encode())]


def test_health_and_the_openapi_document_need_no_token(app_client: TestClient) -> None:
    assert app_client.get("/api/health").status_code == 200
    assert app_client.get("/api/openapi.json").json()["info"]["title"] == "loopsq"


def test_pages_redirect_a_browser_to_the_login_form_and_answer_others_with_401(app_client: TestClient) -> None:
    browser = {"Accept": "text/html,application/xhtml+xml"}
    for path in ("/", "/workflow-runs?x=1", "/fleet", "/rq/"):
        response = app_client.get(path, headers=browser, follow_redirects=False)
        assert (response.status_code, response.headers["location"]) == (
            303, "/login?next=" + path.replace("?", "%3F").replace("=", "%3D"))
    assert_error(app_client.get("/"), 401, MISSING)
    assert_error(app_client.get("/metrics", headers=browser), 401, MISSING)
    assert_error(app_client.get("/rq/0/data/queues.json"), 401, MISSING)


def test_logging_in_sets_an_httponly_strict_session_cookie_that_opens_the_pages(app_client: TestClient) -> None:
    form = app_client.get("/login?next=/workflow-runs")
    assert form.status_code == 200 and 'name="next" value="/workflow-runs"' in form.text
    response = app_client.post("/login", data={"token": TOKEN, "next": "/workflow-runs"}, follow_redirects=False)
    assert (response.status_code, response.headers["location"]) == (303, "/workflow-runs")
    cookie = response.headers["set-cookie"]
    assert re.match(rf"{auth.COOKIE_NAME}=v2\.[0-9a-f]{{32}}\.[0-9]+\.[0-9a-f]{{64}}; ", cookie), cookie
    assert TOKEN not in cookie
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite", "path", "max-age"} <= attributes and "samesite=strict" in cookie.lower()
    assert app_client.get("/workflow-runs").status_code == 200
    assert app_client.get("/fleet").status_code == 200
    assert app_client.get("/rq/").status_code == 200
    assert app_client.get("/metrics").status_code == 200


def test_the_session_cookie_does_not_open_the_api(app_client: TestClient) -> None:
    app_client.post("/login", data={"token": TOKEN})
    assert_error(app_client.get("/api/loops"), 401, MISSING)


def test_a_wrong_token_at_login_is_401_and_sets_no_cookie(app_client: TestClient) -> None:
    response = app_client.post("/login", data={"token": "guess", "next": "/"}, follow_redirects=False)
    assert response.status_code == 401 and "set-cookie" not in response.headers
    assert "invalid API token" in response.text
    app_client.cookies.set(auth.COOKIE_NAME, "forged")
    assert_error(app_client.get("/"), 401, "session expired or logged out: log in again")


def test_an_oversized_login_form_is_refused_without_a_cookie(app_client: TestClient) -> None:
    response = app_client.post("/login", data={"token": TOKEN, "next": "/" + "x" * 5000})
    assert_error(response, 400, "login form is larger than 4096 bytes")
    assert "set-cookie" not in response.headers


@pytest.mark.parametrize("target", ["//evil.example/", "https://evil.example/", "\\\\evil", "javascript:x", ""])
def test_login_only_redirects_to_local_paths(app_client: TestClient, target: str) -> None:
    response = app_client.post("/login", data={"token": TOKEN, "next": target}, follow_redirects=False)
    assert response.headers["location"] == "/"


def test_logging_out_clears_the_cookie(app_client: TestClient) -> None:
    app_client.post("/login", data={"token": TOKEN})
    response = app_client.post("/logout", follow_redirects=False)
    assert (response.status_code, response.headers["location"]) == (303, "/login")
    assert response.headers["set-cookie"].startswith(f'{auth.COOKIE_NAME}=""; ')
    assert_error(app_client.get("/"), 401, MISSING)


# -- loopsq web -------------------------------------------------------------------------------------------------
@pytest.fixture
def cli_env(redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", redis_server.url)
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("LOOPSQ_API_TOKEN", raising=False)
    monkeypatch.delenv("PORT", raising=False)
    served: dict[str, Any] = {}

    def fake_bind(host: str, port: int) -> socket.socket:
        # Where loopsq web would listen, without taking that port on a shared machine.
        served.update(host=host, port=port)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        return sock

    def fake_run(server: Any, sockets: Any = None) -> None:
        served.update(app=server.config.app, sockets=sockets)
        server.started = True

    monkeypatch.setattr("loopsq.cli.web_cmd.bind", fake_bind)
    monkeypatch.setattr("uvicorn.Server.run", fake_run)
    return served


def test_web_refuses_to_start_without_a_token(cli_env: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["web"])
    assert (result.exit_code, result.stderr) == (2, "error: LOOPSQ_API_TOKEN is not set: set it (or "
                                                    "LOOPSQ_API_TOKEN_FILE) to a secret of at least 16 characters, or "
                                                    "pass --generate-token to have one made and printed\n")
    assert cli_env == {}


def test_web_refuses_a_short_token(cli_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_API_TOKEN", "short")
    result = CliRunner().invoke(cli, ["web"])
    assert (result.exit_code, result.stderr) == (2, "error: LOOPSQ_API_TOKEN must be at least 16 characters, got 5\n")


def test_web_generates_and_prints_a_token_and_binds_loopback_by_default(cli_env: dict[str, Any]) -> None:
    result = CliRunner().invoke(cli, ["web", "--generate-token"])
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert line.startswith("LOOPSQ_API_TOKEN=")
    token = line.split("=", 1)[1]
    assert len(token) >= 40
    # The layout guard watched while the server served, and stops with it (a guard left behind in this process
    # would watch the session's Redis for good, and exit the process on a layout another test stamps).
    deadline = time.monotonic() + 10
    while any(t.name == "loopsq-layout-guard" and t.is_alive() for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the web app's layout guard outlived its server"
        time.sleep(0.05)
    assert (cli_env["host"], cli_env["port"]) == ("127.0.0.1", 8080)
    with TestClient(cli_env["app"]) as client:
        assert client.get("/api/loops", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        assert client.get("/api/loops").status_code == 401


def test_web_uses_the_token_from_the_environment_and_the_given_address(
        cli_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_API_TOKEN", TOKEN)
    result = CliRunner().invoke(cli, ["web", "--host", "0.0.0.0", "--port", "9999", "--generate-token"])
    assert (result.exit_code, result.stdout) == (0, "")
    assert (cli_env["host"], cli_env["port"]) == ("0.0.0.0", 9999)
    with TestClient(cli_env["app"]) as client:
        assert client.get("/api/loops", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


#: How long ``loopsq web`` may take to answer its first request (a loaded machine starts Python slowly).
WEB_START_S = 60


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it has not ended within ``timeout``; returns once it has ended."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_loopsq_web_serves_http_until_terminated(redis_server: RedisServer, real_redis: redis.Redis,
                                                 tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "LOOPSQ_REDIS_URL": redis_server.url, "LOOPSQ_DATA_DIR": str(tmp_path),
           "LOOPSQ_API_TOKEN": TOKEN}
    # Its output goes to a file, read once it has ended: a pipe read while it runs would block (and a pipe nobody
    # reads could fill and stall it).
    log = tmp_path / "web.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "loopsq", "web", "--port", str(port)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + WEB_START_S
        health: httpx.Response | None = None
        while health is None and proc.poll() is None and time.monotonic() < deadline:
            try:
                health = httpx.get(f"{base}/api/health", timeout=2)
            except httpx.TransportError:
                time.sleep(0.1)
        if health is None:
            exited = proc.poll()
            stop_process(proc)
            pytest.fail(f"loopsq web did not answer within {WEB_START_S}s "
                        f"({'still running' if exited is None else f'exited with {exited}'}):\n"
                        f"{log.read_text(errors='replace')[-4000:]}")
        assert health.json() == {"status": "ok", "redis": "ok", "mirrorLag": 0, "version": __version__, "layout": LAYOUT}
        assert httpx.get(f"{base}/api/loops").status_code == 401
        created = httpx.post(f"{base}/api/loops", json=loop_body(), headers={"Authorization": f"Bearer {TOKEN}"})
        assert created.status_code == 201
        assert real_redis.hget("loopsq:loop-names", "hello") == created.json()["id"]
    finally:
        stop_process(proc)
    output = log.read_text(errors="replace")
    # uvicorn shuts down gracefully, then re-raises the signal it caught.
    assert proc.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete." in output
    assert f"serving http://127.0.0.1:{port} (redis {redis_server.url}" in output


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
                                  "/.well-known/oauth-authorization-server",
                                  "/.well-known/oauth-authorization-server/mcp",
                                  "/.well-known/openid-configuration"])
def test_oauth_discovery_paths_answer_404_without_a_token(app_client: TestClient, path: str) -> None:
    # A 401 there makes an MCP client start an OAuth flow; loopsq takes a static token, so there is nothing to find.
    response = app_client.get(path)
    assert response.status_code == 404
    assert response.json() == {"error": {"status": 404, "code": "not_found",
                                         "message": f"no such endpoint: GET {path}"}}
    assert "www-authenticate" not in response.headers


def test_other_well_known_paths_and_the_mcp_endpoint_still_need_the_token(app_client: TestClient) -> None:
    for path in ("/.well-known/oauth-protected-resourcex", "/.well-known/other", "/mcp"):
        response = app_client.get(path)
        assert response.status_code == 401, path
        assert response.json()["error"]["message"] == MISSING
