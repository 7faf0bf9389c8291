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
from tests.fuzz_values import HOSTILE
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
REQUIRES = JSON | st.lists(st.sampled_from(["gpu", "GPU!", "repo:web", ""]), max_size=3)
POOLS = JSON | st.sampled_from(["gpu", "Big Pool"])
LOOP_BODIES = st.one_of(
    JSON,
    st.fixed_dictionaries({}, optional={
        "name": JSON | st.sampled_from(["a", " ", "x" * 300]), "schedule": SCHEDULES, "target": TARGETS,
        "catchUp": JSON | st.sampled_from(["none", "latest", "all"]), "overlap": JSON, "maxAttempts": JSON,
        "retryDelayMs": JSON, "leaseMs": JSON, "timezone": JSON | st.sampled_from(["UTC", "Mars/Base"]),
        "expiresAt": JSON, "description": JSON, "requires": REQUIRES, "pool": POOLS,
    }),
)
SPEC_BODIES = st.one_of(
    JSON,
    st.fixed_dictionaries({}, optional={
        "name": JSON | st.just("wf"), "maxParallel": JSON, "requires": REQUIRES, "pool": POOLS,
        "steps": JSON | st.lists(st.fixed_dictionaries({"id": JSON | st.sampled_from(["a", "b"]), "target": TARGETS},
                                                       optional={"dependsOn": JSON, "requires": REQUIRES,
                                                                 "pool": POOLS}), max_size=3),
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


# -- hostile values in every field: over-long, control- and separator-laden ----------------------------------------
LOOP_PATHS = [("name",), ("description",), ("timezone",), ("expiresAt",), ("schedule", "at"),
              ("schedule", "expression"), ("target", "command"), ("target", "args", 0), ("target", "cwd"),
              ("target", "env", "KEY"), ("target", "env", None), ("target", "account", "profile"),
              ("target", "prompt"), ("target", "model"), ("target", "agent"), ("target", "provider"),
              ("target", "extraArgs", 0), ("target", "workflowId"), ("pool",)]
SPEC_PATHS = [("name",), ("description",), ("steps", 0, "id"), ("steps", 0, "dependsOn", 0),
              ("steps", 0, "target", "command"), ("steps", 0, "target", "env", None), ("steps", 0, "target", "cwd"),
              ("steps", 1, "target", "prompt"), ("steps", 1, "target", "extraArgs", 0), ("pool",), ("steps", 0, "pool")]


def _loop_for(path: tuple[Any, ...]) -> dict[str, Any]:
    schedule = {"type": "once", "at": "2030-01-01T00:00:00Z"} if path[-1] == "at" else (
        {"type": "cron", "expression": "* * * * *"} if path[-1] == "expression" else {"type": "interval",
                                                                                     "everyMs": 60_000})
    if path[-1] in ("prompt", "model", "agent", "provider") or path[1:2] == ("extraArgs",):
        target: dict[str, Any] = {"type": "agent", "provider": "claude", "prompt": "hi", "extraArgs": ["x"]}
    elif path[-1] == "workflowId":
        target = {"type": "workflow", "workflowId": "w"}
    else:
        target = {"type": "command", "command": "true", "args": ["x"], "env": {}, "account": {"profile": "p"}}
    return {"name": "hostile", "schedule": schedule, "target": target}


def _place(body: Any, path: tuple[Any, ...], value: str) -> None:
    """Put ``value`` at ``path``; a final ``None`` means "as a key" (an env key), with a plain value."""
    for part in path[:-2] if path[-1] is None else path[:-1]:
        body = body[part]
    if path[-1] is None:
        body[path[-2]] = {value: "v"}
    else:
        body[path[-1]] = value


def _check_hostile(http: TestClient, client: redis.Redis, path: str, body: Any) -> Any:
    from loopsq.domain.checks import first_invisible

    client.flushall()
    response = http.post(path, json=body)
    if response.status_code == 201:
        return response.json()
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error["status"] == response.status_code and "\n" not in error["message"]
    assert len(error["message"]) < 1000 and first_invisible(error["message"]) is None, error["message"][:300]
    assert client.keys("*") == [], response.text[:300]
    return None


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          database=None)
@given(path=st.sampled_from(LOOP_PATHS), value=HOSTILE)
def test_hostile_values_in_any_loop_field_get_one_error_and_write_nothing(
    api: tuple[TestClient, redis.Redis], path: tuple[Any, ...], value: str
) -> None:
    from loopsq.domain import limits
    from loopsq.domain.checks import first_invisible

    body = _loop_for(path)
    _place(body, path, value)
    created = _check_hostile(*api, "/api/loops", body)
    if created is not None:
        assert len(created["name"]) <= limits.MAX_NAME_LENGTH and first_invisible(created["name"]) is None
        env = created["target"].get("env")
        assert env in (None, "[redacted]")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          database=None)
@given(path=st.sampled_from(SPEC_PATHS), value=HOSTILE)
def test_hostile_values_in_any_spec_field_get_one_error_and_write_nothing(
    api: tuple[TestClient, redis.Redis], path: tuple[Any, ...], value: str
) -> None:
    import re

    from loopsq.domain import limits

    body = {"name": "w", "steps": [
        {"id": "a", "dependsOn": ["b"], "target": {"type": "command", "command": "true", "env": {}, "cwd": "/"}},
        {"id": "b", "target": {"type": "agent", "provider": "claude", "prompt": "hi", "extraArgs": ["x"]}}]}
    _place(body, path, value)
    created = _check_hostile(*api, "/api/workflows", body)
    if created is not None:
        assert all(re.fullmatch(limits.STEP_ID_PATTERN, step["id"]) for step in created["steps"])
