"""Fuzzing API bodies (hypothesis): any body to the create endpoints gives 201 or the one JSON error body with a
4xx status naming the problem — never a 500 — and a refused body writes nothing.

CI runs a few hundred examples; ``LOOPSQ_FUZZ_EXAMPLES=10000`` is the nightly-style mode.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopsq.web import WebSettings, create_app
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("LOOPSQ_FUZZ_EXAMPLES", "200"))
TOKEN = "fuzz-token-0123456789abcdef"

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
SCHEDULES = st.one_of(
    JSON,
    st.fixed_dictionaries({"type": st.sampled_from(["once", "interval", "cron", "dynamic", "x"])},
                          optional={"everyMs": JSON | st.integers(-5, 10**12), "expression": JSON
                                    | st.sampled_from(["* * * * *", "5/15 * * * *", "@daily", "1 2 3"]),
                                    "at": JSON | st.sampled_from(["2030-01-01T00:00:00Z", "nope"]),
                                    "anchor": JSON | st.sampled_from(["fixed_rate", "fixed_delay"])}),
)
TARGETS = st.one_of(
    JSON,
    st.fixed_dictionaries({"type": st.sampled_from(["command", "agent", "workflow", "shell"])},
                          optional={"command": JSON | st.sampled_from(["true", "echo hi", ""]),
                                    "shell": JSON, "args": JSON, "env": JSON, "timeoutMs": JSON,
                                    "provider": JSON | st.sampled_from(["claude", "codex", "gpt"]),
                                    "prompt": JSON, "workflowId": JSON}),
)
LOOP_BODIES = st.one_of(
    JSON,
    st.fixed_dictionaries({}, optional={
        "name": JSON | st.sampled_from(["a", " ", "x" * 300]), "schedule": SCHEDULES, "target": TARGETS,
        "catchUp": JSON | st.sampled_from(["none", "latest", "all"]), "overlap": JSON, "maxAttempts": JSON,
        "retryDelayMs": JSON, "leaseMs": JSON, "timezone": JSON | st.sampled_from(["UTC", "Mars/Base"]),
        "expiresAt": JSON, "description": JSON,
    }),
)
SPEC_BODIES = st.one_of(
    JSON,
    st.fixed_dictionaries({}, optional={
        "name": JSON | st.just("wf"), "maxParallel": JSON,
        "steps": JSON | st.lists(st.fixed_dictionaries({"id": JSON | st.sampled_from(["a", "b"]), "target": TARGETS},
                                                       optional={"dependsOn": JSON}), max_size=3),
    }),
)


@pytest.fixture
def api(redis_server: RedisServer, tmp_path: Path) -> Iterator[tuple[TestClient, redis.Redis]]:
    client = redis_server.client()
    app = create_app(WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "d", token=TOKEN,
                                 follow_mirror=False))
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        yield http, client
    client.close()


def _check(http: TestClient, client: redis.Redis, path: str, body: Any) -> None:
    client.flushall()
    response = http.post(path, json=body)
    if response.status_code == 201:
        return
    assert 400 <= response.status_code < 500, (body, response.status_code, response.text)
    error = response.json()["error"]
    assert error["status"] == response.status_code and error["message"] and "\n" not in error["message"]
    assert client.keys("*") == [], (body, response.text)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          database=None)
@given(body=LOOP_BODIES)
def test_any_loop_body_is_created_or_refused_with_one_error_and_nothing_written(
    api: tuple[TestClient, redis.Redis], body: Any
) -> None:
    _check(*api, "/api/loops", body)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          database=None)
@given(body=SPEC_BODIES)
def test_any_workflow_body_is_created_or_refused_with_one_error_and_nothing_written(
    api: tuple[TestClient, redis.Redis], body: Any
) -> None:
    _check(*api, "/api/workflows", body)
