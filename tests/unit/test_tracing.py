"""Tracing (issue 31.5) with the OpenTelemetry SDK's in-memory exporter: the spans of a fire, a trigger, a run-now
and a workflow (names, parents, attributes, status), a trigger's W3C context as their parent, ``TRACEPARENT`` in
the target's environment, and when tracing is on or off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.engine import runner, triggers
from loopsq.engine.runtime import Runtime
from loopsq.engine.workflow_runner import execute_workflow
from loopsq.errors import ValidationError
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system import otel, tracing

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(otel.Backend(provider))
    yield exporter
    tracing.use(None)
    provider.shutdown()


@pytest.fixture
def rt(fake_redis: redis.Redis) -> Iterator[Runtime]:
    with Runtime(client=fake_redis, keys=KEYS, role="worker", worker_id="worker:t") as runtime:
        yield runtime


def make_loop(client: redis.Redis, command: str, name: str = "l") -> str:
    body = {"name": name, "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 3_600_000},
            "target": {"type": "command", "command": command, "shell": True}}
    return LoopStore(client, KEYS).create(new_loop(body, T0)).id


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    finished = exporter.get_finished_spans()
    named = {s.name: s for s in finished}
    assert len(named) == len(finished), [s.name for s in finished]
    return named


def hex_id(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def parent_of(span: ReadableSpan) -> str | None:
    return hex_id(span.parent.span_id, 16) if span.parent is not None else None


def span_id(span: ReadableSpan) -> str:
    assert span.context is not None
    return hex_id(span.context.span_id, 16)


def test_a_triggered_run_continues_its_triggers_trace_and_its_target_sees_traceparent(
    rt: Runtime, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    seen = tmp_path / "traceparent"
    loop_id = make_loop(rt.client, f'printf "%s %s" "$TRACEPARENT" "$TRACESTATE" > {seen}')
    run_id, created = triggers.trigger_with(rt.client, KEYS, loop_id, None, enqueue=False,
                                            trace={"traceparent": TRACEPARENT, "tracestate": "k=v"})
    assert created
    final = runner.run_triggered(rt, run_id)
    assert final is not None and final.status == "succeeded"

    named = by_name(spans)
    assert sorted(named) == ["loopsq.claim", "loopsq.execute", "loopsq.finalize", "loopsq.trigger"]
    trigger = named["loopsq.trigger"]
    assert parent_of(trigger) == PARENT_ID
    assert {hex_id(s.context.trace_id, 32) for s in named.values() if s.context} == {TRACE_ID}
    for child in ("loopsq.claim", "loopsq.execute", "loopsq.finalize"):
        assert parent_of(named[child]) == span_id(trigger), child
    execute = named["loopsq.execute"]
    assert dict(execute.attributes or {}) == {
        "loopsq.loop.id": loop_id, "loopsq.run.id": run_id, "loopsq.attempt": 1, "loopsq.slot": final.scheduled_for,
        "loopsq.source": "trigger", "loopsq.status": "succeeded", "loopsq.exit_code": 0}
    assert execute.status.status_code == StatusCode.UNSET
    assert dict(named["loopsq.claim"].attributes or {})["loopsq.run.id"] == run_id
    # The target runs inside the execute span: a traced target's spans are its children.
    assert seen.read_text() == f"00-{TRACE_ID}-{span_id(execute)}-01 k=v"


def test_a_failed_run_marks_its_execute_span_an_error(rt: Runtime, spans: InMemorySpanExporter) -> None:
    loop_id = make_loop(rt.client, "exit 3")
    final = runner.run_now(rt, loop_id, trace={"traceparent": TRACEPARENT})
    assert final.status == "failed"
    named = by_name(spans)
    assert parent_of(named["loopsq.run_now"]) == PARENT_ID
    execute = named["loopsq.execute"]
    assert execute.status.status_code == StatusCode.ERROR
    assert (execute.attributes or {})["loopsq.exit_code"] == 3
    assert (named["loopsq.finalize"].attributes or {})["loopsq.status"] == "failed"


def test_a_fire_holds_the_claim_execute_and_finalize_of_its_due_slot(
    rt: Runtime, spans: InMemorySpanExporter
) -> None:
    loop_id = make_loop(rt.client, "true")  # due at once: its first slot is now
    out = runner.fire(rt, loop_id)
    assert out.claimed == 1
    named = by_name(spans)
    fire = named["loopsq.fire"]
    assert fire.parent is None
    assert dict(fire.attributes or {}) == {"loopsq.loop.id": loop_id, "loopsq.claimed": 1, "loopsq.skipped": 0}
    for child in ("loopsq.claim", "loopsq.execute", "loopsq.finalize"):
        assert parent_of(named[child]) == span_id(fire), child
    assert (named["loopsq.claim"].attributes or {})["loopsq.source"] == "scheduled"


def test_each_workflow_step_has_a_span_under_the_workflow_and_its_target_sees_it(
    rt: Runtime, spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    spec = WorkflowStore(rt.client, KEYS).create(workflow_body_from_json({"name": "w", "maxParallel": 2, "steps": [
        {"id": "a", "target": {"type": "command", "shell": True,
                                         "command": f'printf %s "$TRACEPARENT" > {tmp_path / "a"}'}},
        {"id": "b", "target": {"type": "command", "command": "exit 4", "shell": True}, "continueOnFailure": True},
        {"id": "c", "dependsOn": ["a"], "target": {"type": "command", "command": "true"}}]}), T0)
    outcome = execute_workflow(rt, spec)
    assert outcome.status == "succeeded", outcome
    finished = spans.get_finished_spans()
    workflow = next(s for s in finished if s.name == "loopsq.workflow")
    steps = {str((s.attributes or {})["loopsq.step.id"]): s for s in finished if s.name == "loopsq.step"}
    assert sorted(steps) == ["a", "b", "c"]
    assert all(parent_of(s) == span_id(workflow) for s in steps.values())
    assert (workflow.attributes or {})["loopsq.workflow_run.id"] == outcome.run_id
    assert steps["b"].status.status_code == StatusCode.ERROR
    assert (steps["b"].attributes or {})["loopsq.exit_code"] == 4
    assert (tmp_path / "a").read_text().split("-")[2] == span_id(steps["a"])


def test_the_trigger_record_keeps_a_valid_context_only(rt: Runtime) -> None:
    loop_id = make_loop(rt.client, "true")
    kept, _ = triggers.trigger_with(rt.client, KEYS, loop_id, None, enqueue=False,
                                    trace={"traceparent": TRACEPARENT})
    ignored, _ = triggers.trigger_with(rt.client, KEYS, loop_id, None, enqueue=False,
                                       trace={"traceparent": "00-zz-00f067aa0ba902b7-01", "tracestate": "k=v"})
    plain, _ = triggers.trigger_with(rt.client, KEYS, loop_id, None, enqueue=False)
    assert json.loads(rt.client.get(KEYS.trigger(kept)))["traceparent"] == TRACEPARENT
    assert set(json.loads(rt.client.get(KEYS.trigger(ignored)))) == {"loopId", "at", "key"}
    assert set(json.loads(rt.client.get(KEYS.trigger(plain)))) == {"loopId", "at", "key"}


def test_an_old_trigger_record_without_a_context_runs_under_no_parent(
    rt: Runtime, spans: InMemorySpanExporter
) -> None:
    loop_id = make_loop(rt.client, "true")
    run_id, _ = triggers.trigger_with(rt.client, KEYS, loop_id, None, enqueue=False)
    assert runner.run_triggered(rt, run_id) is not None
    assert by_name(spans)["loopsq.trigger"].parent is None


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    ({"LOOPSQ_TRACING": "1"}, True),
    ({"LOOPSQ_TRACING": "0", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
    ({"OTEL_SDK_DISABLED": "true", "LOOPSQ_TRACING": "1"}, False),
])
def test_tracing_is_on_only_when_asked_for(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_a_bad_loopsq_tracing_is_bad_input() -> None:
    with pytest.raises(ValidationError) as caught:
        tracing.wanted({"LOOPSQ_TRACING": "maybe"})
    assert caught.value.message == "LOOPSQ_TRACING must be 1 or 0, got 'maybe'"


def test_off_a_span_is_the_shared_no_op_and_carries_nothing() -> None:
    tracing.use(False)
    try:
        with tracing.span("loopsq.fire", attributes={"loopsq.loop.id": "x"}) as traced:
            assert traced is tracing.NOOP
            assert traced.carrier() == {}
        assert tracing.current() is None
    finally:
        tracing.use(None)


@pytest.mark.parametrize(("headers", "carrier"), [
    ({"traceparent": TRACEPARENT}, {"traceparent": TRACEPARENT}),
    ({"TraceParent": TRACEPARENT, "TraceState": "a=1"}, {"traceparent": TRACEPARENT, "tracestate": "a=1"}),
    ({"traceparent": f"00-{'0' * 32}-{PARENT_ID}-01"}, {}),
    ({"traceparent": f"00-{TRACE_ID}-{'0' * 16}-01"}, {}),
    ({"traceparent": TRACEPARENT.upper()}, {}),
    ({"tracestate": "a=1"}, {}),
    ({"traceparent": TRACEPARENT, "tracestate": "a" * 513}, {"traceparent": TRACEPARENT}),
    (None, {}),
])
def test_only_a_valid_w3c_context_is_carried(headers: dict[str, str] | None, carrier: dict[str, str]) -> None:
    assert tracing.valid_carrier(headers) == carrier


def test_the_sdk_trigger_carries_the_callers_current_span(fake_redis: redis.Redis) -> None:
    from loopsq.sdk import LoopsClient

    provider = TracerProvider(shutdown_on_exit=False)
    loop_id = make_loop(fake_redis, "true")
    sdk = LoopsClient(client=fake_redis)
    with provider.get_tracer("app").start_as_current_span("caller") as caller:
        run_id = sdk.trigger(loop_id)
        context = caller.get_span_context()
        expected = f"00-{hex_id(context.trace_id, 32)}-{hex_id(context.span_id, 16)}-{hex_id(context.trace_flags, 2)}"
    record = json.loads(fake_redis.get(KEYS.trigger(run_id)))
    assert record["traceparent"] == expected
    outside = sdk.trigger(loop_id)
    assert "traceparent" not in json.loads(fake_redis.get(KEYS.trigger(outside)))


ABSENT = r"""
import importlib.abc, json, logging, sys

class Absent(importlib.abc.MetaPathFinder):
    # The ``otel`` extra not installed: the SDK and its exporter cannot be imported (the API comes with FastAPI).
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[:2] in (["opentelemetry", "sdk"], ["opentelemetry", "exporter"]):
            raise ImportError(f"No module named {name!r}")
        return None

if sys.argv[1] == "absent":
    sys.meta_path.insert(0, Absent())
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
import fakeredis  # (redis-py 8 imports OpenTelemetry's API itself when it is there: not loopsq's doing)

def otel_modules():
    return {m for m in sys.modules if m.split(".")[0] == "opentelemetry"}

before = otel_modules()
from datetime import UTC, datetime
from loopsq.domain.loop_spec import new_loop
from loopsq.engine import runner
from loopsq.engine.runtime import Runtime
from loopsq.state.loops import LoopStore
from loopsq.system import tracing

client = fakeredis.FakeRedis(decode_responses=True)
body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 3600000},
        "target": {"type": "command", "command": "env", "shell": True}}
loop_id = LoopStore(client).create(new_loop(body, datetime(2026, 1, 1, tzinfo=UTC))).id
with Runtime(client=client, role="worker") as rt:
    run = runner.run_now(rt, loop_id, trace={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
print(json.dumps({"status": run.status, "enabled": tracing.enabled(), "noop": tracing.span("x").__enter__() is tracing.NOOP,
                  "traceparent": "TRACEPARENT=" in run.stdout, "otel": "loopsq.system.otel" in sys.modules,
                  "imported": sorted(otel_modules() - before)}))
"""

ABSENT_WARNING = ("tracing off: the OpenTelemetry SDK is not installed (pip install 'loopsq[otel]'): "
                  "No module named 'opentelemetry.sdk'")


@pytest.mark.parametrize(("sdk", "env", "warnings"), [
    ("absent", {"LOOPSQ_TRACING": "1"}, [ABSENT_WARNING]),
    ("absent", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, [ABSENT_WARNING]),
    ("installed", {}, []),
    ("installed", {"LOOPSQ_TRACING": "0", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, []),
])
def test_tracing_off_or_without_the_extra_is_a_no_op_that_imports_nothing(
    sdk: str, env: dict[str, str], warnings: list[str]
) -> None:
    import os
    import subprocess
    import sys

    base = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSQ_", "TRACE"))}
    done = subprocess.run([sys.executable, "-c", ABSENT, sdk], env={**base, **env}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    *logged, last = done.stdout.strip().splitlines()
    assert logged == warnings
    assert json.loads(last) == {"status": "succeeded", "enabled": False, "noop": True, "traceparent": False,
                                "otel": False, "imported": []}


@pytest.mark.parametrize("command", ["worker", "scheduler", "up"])
def test_a_process_refuses_a_bad_loopsq_tracing_at_start(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from loopsq.cli import cli

    monkeypatch.setenv("LOOPSQ_TRACING", "maybe")
    done = CliRunner().invoke(cli, [command])
    assert (done.exit_code, done.output) == (2, "error: LOOPSQ_TRACING must be 1 or 0, got 'maybe'\n")
