"""The OpenAPI document says exactly what the server takes, and real clients can use it.

- ``cursor``, ``since``/``until``, the ``name`` filter, ``Idempotency-Key`` and the trigger body: every value the
  document calls valid is accepted (schemathesis' ``positive_data_acceptance``) and every value it calls invalid
  is refused (``negative_data_rejection``), in both generation modes;
- ``cwd: null`` (and ``args: null``), which the server reads as "the default", is valid in loops and in workflow
  steps by the document too;
- ``openapi-python-client``, with its default settings, generates a client from the document, and that client
  reads the server's answers;
- HEAD is answered on GET routes (``/api/health`` included) with the GET's status and headers and no body.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
import schemathesis
import uvicorn
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.state.loops import LoopStore
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, PIPELINE, TOKEN, loop_body
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration

EXAMPLES = 120
GENERATOR = Path(sys.executable).with_name("openapi-python-client")


def app_for(redis_url: str, data_dir: Path) -> Any:
    return create_app(WebSettings(redis_url=redis_url, data_dir=data_dir, token=TOKEN, follow_mirror=False,
                                  rq_dashboard=False))


@pytest.fixture
def app(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TZ", "UTC")
    return app_for(redis_server.url, tmp_path / "data")


def document(app: Any) -> dict[str, Any]:
    return app.openapi()  # type: ignore[no-any-return]


# -- exactness of the parameters the server checks itself --------------------------------------------------------
def _empty_range(case: schemathesis.Case) -> bool:
    """``since`` not before ``until``: valid each alone, refused together (documented; no schema can say it)."""
    query = case.query or {}
    return "since" in query and "until" in query and str(query["since"]) >= str(query["until"])


def _unknown_parameter(case: schemathesis.Case) -> bool:
    """A query parameter the operation does not have: ignored, as HTTP servers do (never a negative value)."""
    known = {parameter.name for parameter in case.operation.query}
    return bool(set(case.query or {}) - known)


@pytest.mark.parametrize("label", ["GET /api/runs", "GET /api/loops", "POST /api/loops/{loop}/trigger"])
def test_the_document_says_exactly_which_values_the_server_takes(
        app: Any, real_redis: redis.Redis, label: str) -> None:
    loop = LoopStore(real_redis).create(new_loop(loop_body(), timeutil.now()))
    method, path = label.split(" ")
    operation = schemathesis.openapi.from_asgi("/api/openapi.json", app)[path][method]
    wrong: list[tuple[str, Any, Any, Any, int, str]] = []

    def judge(mode: GenerationMode, check: Any) -> None:
        @given(case=operation.as_strategy(mode))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def call(case: schemathesis.Case) -> None:
            if case.path_parameters:
                case.path_parameters["loop"] = loop.id  # an existing loop: its 404 is not what is judged here
            if _empty_range(case) or (mode is GenerationMode.NEGATIVE and _unknown_parameter(case)):
                return
            response = case.call(app=app, headers=AUTH)
            try:
                case.validate_response(response, checks=[check])
            except BaseException:  # schemathesis' failure group: collected, judged below
                body = None if isinstance(case.body, schemathesis.core.NotSet) else case.body
                wrong.append((mode.name, case.query, case.headers, body, response.status_code, response.text[:200]))

        call()

    judge(GenerationMode.POSITIVE, positive_data_acceptance)
    judge(GenerationMode.NEGATIVE, negative_data_rejection)
    assert wrong == []


def test_an_empty_time_range_and_an_empty_or_malformed_time_are_400(app: Any) -> None:
    with TestClient(app, headers=AUTH) as client:
        for query, message in [
            ("since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
             'since must be before until, got since="2026-01-02T00:00:00Z" until="2026-01-01T00:00:00Z"'),
            ("since=", 'since must be an ISO 8601 time (e.g. 2026-12-01T09:00:00Z), got ""'),
            ("until=0001-01-01T00:00:00%2B01:00",  # past what a datetime holds: was a 500
             'until must be an ISO 8601 time (e.g. 2026-12-01T09:00:00Z), got "0001-01-01T00:00:00+01:00"'),
            ("since=2026-02-30T00:00:00Z", 'since must be an ISO 8601 time (e.g. 2026-12-01T09:00:00Z), got '
                                           '"2026-02-30T00:00:00Z"'),
            ("cursor=W10", 'cursor is not a cursor from a previous page, got "W10"'),
        ]:
            answer = client.get(f"/api/runs?{query}")
            assert (answer.status_code, answer.json()["error"]["message"]) == (400, message), query
        # Any text of a cursor's shape is a position to continue from.
        assert client.get("/api/runs?cursor=.").status_code == 200


# -- null means the default: the document says so ----------------------------------------------------------------
def _validator(app: Any, name: str) -> jsonschema.Draft202012Validator:
    doc = document(app)
    # The component with the document's components beside it, so that its "#/components/..." references resolve.
    return jsonschema.Draft202012Validator({**doc["components"]["schemas"][name], "components": doc["components"]})


@pytest.mark.parametrize("field", ["cwd", "args"])
def test_a_null_optional_field_of_a_command_target_is_valid_by_the_document_and_the_server(
        app: Any, field: str) -> None:
    loop = loop_body(name=f"null-{field}")
    loop["target"] = {**loop["target"], field: None}
    step = json.loads(json.dumps(PIPELINE))
    step["name"] = f"null-{field}"
    step["steps"][0]["target"] = {**step["steps"][0]["target"], field: None}
    assert list(_validator(app, "LoopCreate").iter_errors(loop)) == []
    assert list(_validator(app, "WorkflowCreate").iter_errors(step)) == []
    with TestClient(app, headers=AUTH) as client:
        created = client.post("/api/loops", json=loop)
        assert created.status_code == 201, created.text
        assert field not in created.json()["target"]  # null: the default, nothing stored
        workflow = client.post("/api/workflows", json=step)
        assert workflow.status_code == 201, workflow.text


# -- a generated client ------------------------------------------------------------------------------------------
@pytest.fixture
def served(app: Any) -> Iterator[str]:
    """The app served by uvicorn on a free port in a thread (a generated client needs a real socket)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def test_openapi_python_client_generates_a_working_client_with_its_defaults(
        app: Any, served: str, real_redis: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = tmp_path / "openapi.json"
    spec.write_text(json.dumps(document(app)))
    # Its post-generation hook runs ruff from PATH: the venv's.
    env = {**os.environ, "PATH": f"{GENERATOR.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    generated = subprocess.run([str(GENERATOR), "generate", "--path", str(spec), "--output-path",
                                str(tmp_path / "client")], capture_output=True, text=True, env=env, timeout=300)
    output = generated.stdout + generated.stderr
    assert generated.returncode == 0, output
    assert "Warning" not in output and "Error" not in output, output
    monkeypatch.syspath_prepend(str(tmp_path / "client"))
    package = importlib.import_module("loopsq_client")
    health = importlib.import_module("loopsq_client.api.health.health_api_health_get")
    list_loops = importlib.import_module("loopsq_client.api.loops.list_loops_api_loops_get")
    trigger = importlib.import_module("loopsq_client.api.loops.trigger_loop_api_loops_loop_trigger_post")
    client = package.AuthenticatedClient(base_url=served, token=TOKEN)
    assert health.sync(client=client).status.value == "ok"
    loop = LoopStore(real_redis).create(new_loop(loop_body(name="generated"), timeutil.now()))
    listed = list_loops.sync(client=client)
    assert [item.name for item in listed.items] == ["generated"]
    triggered = trigger.sync_detailed(loop.id, client=client)
    assert triggered.status_code == 201 and triggered.parsed.created is True


# -- HEAD ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/api/health", "/api/loops", "/api/runs", "/api/openapi.json", "/api/workflows",
                                  "/", "/fleet", "/metrics", "/api/loops/nope"])
def test_head_answers_a_get_route_with_its_status_and_headers_and_no_body(app: Any, path: str) -> None:
    with TestClient(app, headers=AUTH) as client:
        got = client.get(path)
        head = client.head(path)
    assert (head.status_code, head.content) == (got.status_code, b"")
    assert head.headers["content-type"] == got.headers["content-type"]
    if path != "/metrics":  # its figures move between the two requests
        assert head.headers["content-length"] == got.headers["content-length"]


def test_head_is_refused_where_get_is_and_a_405_names_head_with_get(app: Any) -> None:
    with TestClient(app, headers=AUTH) as client:
        assert client.head("/api/health", headers={"Authorization": ""}).status_code == 200  # public, as GET
        assert client.head("/api/loops", headers={"Authorization": "Bearer wrong-token-0000"}).status_code == 401
        post_only = client.head("/api/loops/nope/pause")
        assert (post_only.status_code, post_only.headers["allow"]) == (405, "POST")
        both = client.put("/api/loops")
        assert (both.status_code, both.headers["allow"]) == (405, "GET, HEAD, POST")
