"""Schemathesis against the OpenAPI document, in-process (ASGI): no 5xx, and every response matches its schema.

Bounded (``MAX_EXAMPLES`` per operation, no deadline) so that the whole file runs in well under a minute. The
app runs on the session's private redis-server with a loop, a workflow and a workflow run already stored, so
that generated ids sometimes hit (most are 404s, which must match the error body's schema too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.state.loops import LoopStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, PIPELINE, TOKEN, loop_body
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 25
response_schema_conformance = schemathesis.checks.response_schema_conformance


def app_for(redis_url: str, data_dir: Path) -> Any:
    return create_app(WebSettings(redis_url=redis_url, data_dir=data_dir, token=TOKEN, follow_mirror=False,
                                  rq_dashboard=False))


# The document does not depend on Redis (nothing connects until a request needs it), so it is loaded at import
# from an app on no server; each test calls the app built on the session's server by ``app`` below.
schema = schemathesis.openapi.from_asgi("/api/openapi.json", app_for("redis://127.0.0.1:9/0", Path("/nonexistent")))


@pytest.fixture
def app(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TZ", "UTC")
    LoopStore(real_redis).create(new_loop(loop_body(), timeutil.now()))
    spec = WorkflowStore(real_redis).create(PIPELINE, timeutil.now())
    WorkflowRunStore(real_redis).create(spec, timeutil.now())
    return app_for(redis_server.url, tmp_path / "data")


OPERATIONS = [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda operation: operation.label)
def test_no_operation_answers_with_a_server_error_or_off_schema(operation: Any, app: Any) -> None:
    # Valid and invalid inputs alike: invalid ones must get a 400 in the one error body, never a 5xx.
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

    @given(case=cases)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(app=app, headers=AUTH, checks=[not_a_server_error, response_schema_conformance])

    check()
