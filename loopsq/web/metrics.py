"""``/metrics`` in Prometheus text format: a custom collector that reads the state at scrape time.

Everything is computed from the (caught-up) mirror and Redis when scraped, so every web process reports the
same numbers and nothing is lost on restart:

- ``loopsq_runs{loop_id,loop,status}``: recorded runs per loop and status;
- ``loopsq_loops{status}``: loops per status;
- ``loopsq_scheduling_lag_seconds``: histogram of ``startedAt - scheduledFor`` over first attempts (a retry
  starts late on purpose);
- ``loopsq_run_duration_seconds``: histogram of the finished runs' durations;
- ``loopsq_queue_depth``: jobs waiting in the RQ queue; ``loopsq_workers_alive``, ``loopsq_schedulers_alive``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from loopsq.domain.models import LOOP_STATUSES
from loopsq.engine import timers
from loopsq.ops.health import live_processes
from loopsq.web.context import WebContext
from loopsq.web.deps import error_responses

LAG_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DURATION_BUCKETS_S = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)

# Whole milliseconds, so that bucket bounds compare exactly. julianday() reads loopsq's ISO timestamps ('Z').
_LAG_MS = ("MAX(0, CAST(ROUND((julianday(started_at) - julianday(scheduled_for)) * 86400000.0) AS INTEGER))")
_LAG_FROM = "FROM loop_runs WHERE started_at IS NOT NULL AND attempt = 1"
_DURATION_FROM = "FROM loop_runs WHERE duration_ms IS NOT NULL"


def histogram(conn: sqlite3.Connection, value_ms: str, source: str,
              bounds_s: Sequence[float]) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets and the sum (seconds) of ``value_ms`` over ``source``, counted by SQLite in one pass."""
    counts = ", ".join(f"TOTAL({value_ms} <= {round(b * 1000)})" for b in bounds_s)
    row = conn.execute(f"SELECT COUNT(*), TOTAL({value_ms}), {counts} {source}").fetchone()
    buckets = [(str(float(b)), float(row[2 + i])) for i, b in enumerate(bounds_s)]
    buckets.append(("+Inf", float(row[0])))
    return buckets, float(row[1]) / 1000.0


class StateCollector(Collector):
    """Reads loopsq's state on every scrape."""

    def __init__(self, ctx: WebContext) -> None:
        self.ctx = ctx

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: registering must not touch Redis."""
        return []

    def collect(self) -> Iterable[Metric]:
        """The metric families, from the caught-up mirror and Redis."""
        with self.ctx.mirror() as conn:
            runs = GaugeMetricFamily("loopsq_runs", "Recorded loop runs by loop and status.",
                                     labels=["loop_id", "loop", "status"])
            for loop_id, loop_name, status, count in conn.execute(
                "SELECT loop_id, loop_name, status, COUNT(*) FROM loop_runs "
                "GROUP BY loop_id, loop_name, status ORDER BY loop_id, status"
            ):
                runs.add_metric([str(loop_id), str(loop_name), str(status)], int(count))
            loops = GaugeMetricFamily("loopsq_loops", "Loops by status.", labels=["status"])
            by_status = {str(s): int(n) for s, n in conn.execute(
                "SELECT status, COUNT(*) FROM loops WHERE archived_at IS NULL GROUP BY status")}
            for status in sorted({*LOOP_STATUSES, *by_status}):
                loops.add_metric([status], by_status.get(status, 0))
            lag = HistogramMetricFamily("loopsq_scheduling_lag_seconds",
                                        "Start delay of first attempts: startedAt - scheduledFor.")
            lag.add_metric([], *histogram(conn, _LAG_MS, _LAG_FROM, LAG_BUCKETS_S))
            duration = HistogramMetricFamily("loopsq_run_duration_seconds", "Duration of finished runs.")
            duration.add_metric([], *histogram(conn, "duration_ms", _DURATION_FROM, DURATION_BUCKETS_S))
        yield from (runs, loops, lag, duration)
        yield GaugeMetricFamily("loopsq_queue_depth", "Jobs waiting in the RQ queue.",
                                value=timers.queue_depth(self.ctx.raw()))
        yield GaugeMetricFamily("loopsq_workers_alive", "Workers with a fresh liveness key.",
                                value=len(live_processes(self.ctx.client, self.ctx.keys, "worker")))
        yield GaugeMetricFamily("loopsq_schedulers_alive", "Schedulers with a fresh liveness key.",
                                value=len(live_processes(self.ctx.client, self.ctx.keys, "scheduler")))


def registry_for(ctx: WebContext) -> CollectorRegistry:
    """A registry of its own per app (no process-wide default registry, no client-library metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(ctx))
    return registry


router = APIRouter()


@router.get("/metrics", tags=["metrics"], summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format."}, **error_responses()})
def metrics(request: Request) -> Response:
    """The metrics, read at scrape time (the API token is required, as a bearer header)."""
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
