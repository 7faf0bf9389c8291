"""Tracing on real processes (issue 31.5): a worker and a scheduler with the ``otel`` extra export OTLP/HTTP to a
receiver in this test, which parses the protobuf. A trigger's W3C context (API header, the CLI's TRACEPARENT, an RQ
job's keyword) becomes the parent of its run's spans, and the target sees the execute span as TRACEPARENT."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis
import rq
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

TOKEN = "t0ken-for-tracing"


@dataclass(frozen=True)
class Received:
    """One span as the receiver got it (ids in lowercase hex, as in a traceparent)."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


class Receiver:
    """An OTLP/HTTP trace receiver on a free loopback port (``POST /v1/traces``, protobuf, gzip or not)."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.take(self.path, ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        assert self.port, "the receiver has no port"
        self.thread = threading.Thread(target=self.server.serve_forever, name="otlp-receiver", daemon=True)
        self.thread.start()

    def take(self, path: str, request: ExportTraceServiceRequest) -> None:
        assert path == "/v1/traces", path
        got = []
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    got.append(Received(resource.get("service.name", ""), span.name, span.trace_id.hex(),
                                        span.span_id.hex(), span.parent_span_id.hex(), attributes))
        with self.lock:
            self.spans.extend(got)

    def named(self, name: str, trace_id: str | None = None) -> list[Received]:
        with self.lock:
            return [s for s in self.spans if s.name == name and (trace_id is None or s.trace_id == trace_id)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    yield got
    got.close()


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path, receiver: Receiver) -> Iterator[Cluster]:
    for cluster in open_cluster(redis_server.url, tmp_path):
        # Only the processes trace (their env); a short batch delay so spans reach the receiver while they run.
        cluster.env = {k: v for k, v in cluster.env.items() if not k.startswith(("OTEL_", "LOOPSQ_TRACING"))}
        cluster.env["OTEL_BSP_SCHEDULE_DELAY"] = "100"
        yield cluster


def traceparent(n: int) -> tuple[str, str, str]:
    """A distinct W3C traceparent per trigger: (header, trace id, parent span id)."""
    trace_id, span_id = f"{n:032x}".replace("0", "a", 1), f"{n:016x}".replace("0", "b", 1)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


@pytest.mark.timeout(120)
def test_a_triggers_context_becomes_its_runs_parent_and_the_target_continues_it(
    cluster: Cluster, receiver: Receiver, tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    from loopsq.web import WebSettings, create_app

    otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}"}
    seen = tmp_path / "seen"
    seen.mkdir()
    cluster.create("traced", f'printf %s "$TRACEPARENT" > {seen}/"$LOOPS_RUN_ID"', "--every", "1h")
    cluster.create("ticking", "true", "--every", "2s")
    cluster.start("scheduler", env=otel)
    cluster.start("worker", env=otel)

    api_tp, api_trace, api_parent = traceparent(1)
    settings = WebSettings(redis_url=cluster.url, data_dir=tmp_path / "web", token=TOKEN, follow_mirror=False)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {TOKEN}"}) as web:
        response = web.post("/api/loops/traced/trigger", headers={"traceparent": api_tp, "tracestate": "k=v"})
    assert response.status_code == 201, response.text
    api_run = response.json()["runId"]

    cli_tp, cli_trace, cli_parent = traceparent(2)
    cli_run = cluster.cli("trigger", "traced", env={"TRACEPARENT": cli_tp}).stdout.split()[0]

    rq_tp, rq_trace, rq_parent = traceparent(3)
    job = rq.Queue("loopsq", connection=redis.Redis.from_url(cluster.url)).enqueue(
        "worker.jobs.trigger", "traced", traceparent=rq_tp)
    cluster.wait_until(lambda: job.refresh() or job.is_finished or job.is_failed, 30, "the RQ trigger job")
    assert job.is_finished, f"{job.exc_info}\n{cluster.logs()}"
    rq_run = str(job.return_value())

    # run-now on a worker: the CLI's TRACEPARENT rides in the job's meta.
    now_tp, now_trace, now_parent = traceparent(4)
    now_run = cluster.cli("run-now", "traced", env={"TRACEPARENT": now_tp}).stdout.split()[0]

    triggered = {api_run: (api_trace, api_parent), cli_run: (cli_trace, cli_parent), rq_run: (rq_trace, rq_parent)}
    cluster.wait_until(lambda: all((r := cluster.run(i)) is not None and r.terminal for i in triggered), 45,
                       "the triggered runs")
    for run_id in triggered:
        run = cluster.run(run_id)
        assert run is not None and run.status == "succeeded", f"{run}\n{cluster.logs()}"

    def exported() -> bool:
        return all(receiver.named("loopsq.finalize", trace) for trace, _ in [*triggered.values(), (now_trace, "")]) and bool(
            receiver.named("loopsq.fire")) and bool(receiver.named("loopsq.timers.move"))

    cluster.wait_until(exported, 30, f"the spans at the receiver (got {receiver.spans})")
    for run_id, (trace_id, parent_id) in triggered.items():
        [trigger] = receiver.named("loopsq.trigger", trace_id)
        assert (trigger.parent_id, trigger.service) == (parent_id, "loopsq-worker"), trigger
        assert trigger.attributes["loopsq.run.id"] == run_id
        [execute] = receiver.named("loopsq.execute", trace_id)
        [claim] = receiver.named("loopsq.claim", trace_id)
        [finalize] = receiver.named("loopsq.finalize", trace_id)
        assert {execute.parent_id, claim.parent_id, finalize.parent_id} == {trigger.span_id}
        assert (execute.attributes["loopsq.run.id"], execute.attributes["loopsq.status"]) == (run_id, "succeeded")
        # The target ran inside the execute span: what it saw as TRACEPARENT is that span.
        assert (seen / run_id).read_text() == f"00-{trace_id}-{execute.span_id}-01"
    [run_now] = receiver.named("loopsq.run_now", now_trace)
    assert run_now.parent_id == now_parent
    [execute] = receiver.named("loopsq.execute", now_trace)
    assert (execute.parent_id, execute.attributes["loopsq.run.id"]) == (run_now.span_id, now_run)
    assert (seen / now_run).read_text() == f"00-{now_trace}-{execute.span_id}-01"
    # The scheduler's timer moves, and the worker's fire of a slot of the ticking loop: its own trace.
    assert {s.service for s in receiver.named("loopsq.timers.move")} == {"loopsq-scheduler"}
    fire = receiver.named("loopsq.fire")[0]
    assert [s.parent_id for s in receiver.named("loopsq.execute", fire.trace_id)] == [fire.span_id]


@pytest.mark.timeout(120)
def test_a_plain_rq_worker_traces_a_trigger_job_as_loopsq_worker(
    cluster: Cluster, receiver: Receiver, tmp_path: Path
) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()
    cluster.create("hook", f'printf %s "$TRACEPARENT" > {seen}/"$LOOPS_RUN_ID"', "--every", "1h")
    cluster.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{receiver.port}"
    cluster.start_rq_worker("plain-rq")
    tp, trace_id, parent_id = traceparent(5)
    job = rq.Queue("loopsq", connection=redis.Redis.from_url(cluster.url)).enqueue(
        "worker.jobs.trigger", "hook", tracestate="k=v", traceparent=tp)
    cluster.wait_until(lambda: job.refresh() or job.is_finished or job.is_failed, 30, "the RQ trigger job")
    assert job.is_finished, f"{job.exc_info}\n{cluster.logs()}"
    run_id = str(job.return_value())
    cluster.wait_until(lambda: receiver.named("loopsq.finalize", trace_id), 30, "the spans at the receiver")
    [trigger] = receiver.named("loopsq.trigger", trace_id)
    [execute] = receiver.named("loopsq.execute", trace_id)
    assert (trigger.service, trigger.parent_id, execute.parent_id) == ("loopsq-worker", parent_id, trigger.span_id)
    assert (seen / run_id).read_text() == f"00-{trace_id}-{execute.span_id}-01"
