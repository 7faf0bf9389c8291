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
from schemathesis.specs.openapi.checks import status_code_conformance

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.state.keys import Keys
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
        case.call_and_validate(app=app, headers=AUTH,
                               checks=[not_a_server_error, response_schema_conformance, status_code_conformance])

    check()


# -- how well the create schema fits the server -------------------------------------------------------------------
POSITIVE_BODIES = 200
UNRESOLVED_WORKFLOW = "target.workflowId must name a stored workflow, got "


def test_at_least_80_percent_of_generated_positive_loop_bodies_are_created(
        redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every body the document calls valid is created, except those naming a workflow that does not exist: no
    # schema can know the stored workflows (the stateful phase below creates one and links to it). Nor the pools:
    # the pool a body names is made first (an unknown pool's 400 is test_web_api's).
    monkeypatch.setenv("TZ", "UTC")
    application = app_for(redis_server.url, tmp_path / "data")
    operation = schemathesis.openapi.from_asgi("/api/openapi.json", application)["/api/loops"]["POST"]
    statuses: list[int] = []
    other_failures: list[tuple[Any, str]] = []

    @given(case=operation.as_strategy(GenerationMode.POSITIVE))
    @settings(max_examples=POSITIVE_BODIES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def create(case: schemathesis.Case) -> None:
        pool = case.body.get("pool") if isinstance(case.body, dict) else None
        if isinstance(pool, str):
            real_redis.hset(Keys().pools, pool, '{"limit":1}')
        response = case.call(app=application, headers=AUTH)
        statuses.append(response.status_code)
        if response.status_code == 201:
            LoopStore(real_redis).remove(response.json()["id"], timeutil.now())  # names stay free
        elif not response.json()["error"]["message"].startswith(UNRESOLVED_WORKFLOW):
            other_failures.append((case.body, response.text))

    create()
    created = statuses.count(201) / len(statuses)
    print(f"positive POST /api/loops bodies created: {statuses.count(201)}/{len(statuses)} = {created:.0%}")
    assert len(statuses) >= POSITIVE_BODIES * 0.9
    assert other_failures == []
    assert created >= 0.8


def test_the_stateful_phase_chains_create_show_trigger_and_runs(
        redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    application = app_for(redis_server.url, tmp_path / "data")
    loops_schema = schemathesis.openapi.from_asgi("/api/openapi.json", application).include(
        path_regex=r"^/api/(loops|runs)")
    loops_schema.config.generation.modes = [GenerationMode.POSITIVE]
    created: set[str] = set()
    chained: list[tuple[str, int]] = []

    class Scenario(loops_schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            redis_server.client().flushall()  # each scenario starts empty, so names never collide

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"headers": AUTH}

        def validate_response(self, response: Any, case: schemathesis.Case, additional_checks: Any = None,
                              **kwargs: Any) -> None:
            case.validate_response(response, checks=[not_a_server_error, response_schema_conformance,
                                                     status_code_conformance])

        def after_call(self, response: Any, case: schemathesis.Case) -> None:
            super().after_call(response, case)
            used = {(case.path_parameters or {}).get("loop"), (case.query or {}).get("loop")}
            if used & created:
                chained.append((case.operation.label, response.status_code))
            if case.operation.label == "POST /api/loops" and response.status_code == 201:
                created.add(response.json()["id"])

    Scenario.run(settings=settings(max_examples=40, stateful_step_count=8, deadline=None, derandomize=True,
                                   database=None, suppress_health_check=list(HealthCheck)))
    reached = {call for call in chained if call[1] < 300}
    print(f"stateful: {len(created)} loops created; calls on them: {sorted(set(chained))}")
    assert created
    # Which link the state machine follows from a created loop depends on how many there are (archive, rename, the
    # lifecycle routes and the run filters came after this test): any successful call on a loop it created shows
    # the chaining; that the trigger link resolves is the deterministic link test's.
    assert any(label.startswith(("GET /api/loops/{loop}", "POST /api/loops/{loop}/")) or label == "GET /api/runs"
               for label, _status in reached), chained
