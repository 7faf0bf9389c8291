"""``/metrics`` in Prometheus text format: a custom collector that reads the state at scrape time.

Everything is computed from the (caught-up) mirror and Redis when scraped, so nothing is lost on restart:

- counters, for alerting (``loopsq.mirror.counters``: transitions counted exactly once as the mirror applies
  them): ``loopsq_runs_total{status}`` (finished attempts), ``loopsq_retries_total`` (retry attempts started),
  ``loopsq_recoveries_total{reason}`` (runs abandoned: ``worker_died``, ``lease_expired``, ``worker_shutdown``,
  ``other``); ``loopsq_slots_missed_total{reason}`` (slots that did not run, by kind: ``catch_up``,
  ``no_free_worker``, ``no_worker_labels``, ``no_scheduler``; counted in Redis, ``keys.missed_counts``, as each
  missed streak is recorded, so every process reports the same totals); ``loopsq_loops_repaired_total{cause}``
  (stalled loops the progress watchdog repaired: ``lost_fire_job``, ``hot_loop``; ``engine.stalls``, counted in
  Redis, ``keys.repaired_counts``);
- ``loopsq_runs_current{status}``: recorded runs by their current status (a retried slot's row counts once);
- ``loopsq_loops{status}``: loops per status;
- ``loopsq_scheduling_lag_seconds``: histogram of the start delay of first attempts, measured from when the slot
  could first have run: its time, or the loop's creation if later (a loop created with a past ``--at`` would
  otherwise add a sample years long); a retry starts late on purpose and is left out;
- ``loopsq_run_duration_seconds``: histogram of the finished runs' durations;
- ``loopsq_workers_alive``, ``loopsq_schedulers_alive``;
- the fleet (``engine.fleet``, one read per scrape): ``loopsq_queue_depth{queue}`` (runs waiting in each of
  loopsq's RQ queues), ``loopsq_queue_oldest_age_seconds{queue}`` (how long the oldest has waited; 0 when none
  waits), ``loopsq_queue_unserved{queue}`` (1 when no live worker has the labels its runs need),
  ``loopsq_worker_slots{worker}`` and ``loopsq_worker_slots_busy{worker}`` (each live worker's capacity and slots
  in use), ``loopsq_fleet_slots``, ``loopsq_fleet_slots_busy`` (their sums), ``loopsq_timers_overdue`` (armed timers
  past their time by more than ``engine.fleet.OVERDUE_AFTER_MS``), ``loopsq_pool_limit{pool}``,
  ``loopsq_pool_holders{pool}`` and ``loopsq_pool_waiters{pool}`` (the fleet-wide pools).

Per-loop labels (``loop_id``, ``loop``) on the run counts come only with ``LOOPSQ_METRICS_PER_LOOP=1``: by default
the number of series does not grow with the number of loops. The fleet's labels are bounded too: ``queue`` takes
one value per requirement set in use (a handful: sets of labels such as ``gpu``, not per loop or per run), and
``worker`` one per live worker (a worker's series ends with it; a restarted worker has a new id).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from loopsq.domain import missed
from loopsq.domain import stalls as stall_rules
from loopsq.domain.models import LOOP_STATUSES
from loopsq.domain.run_rules import MISSED, RUN_STATUSES, TERMINAL
from loopsq.engine import stalls
from loopsq.engine.fleet import FleetSnapshot, read_fleet
from loopsq.errors import ValidationError
from loopsq.mirror import counters
from loopsq.ops.health import live_processes
from loopsq.state import missed as missed_state
from loopsq.web.context import WebContext
from loopsq.web.deps import error_responses

LAG_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
DURATION_BUCKETS_S = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0)

PER_LOOP_ENV = "LOOPSQ_METRICS_PER_LOOP"

# Whole milliseconds, so that bucket bounds compare exactly. julianday() reads loopsq's ISO timestamps ('Z'). A slot
# could not run before its loop existed: the lag counts from the later of the two (a removed loop: from the slot).
_LAG_MS = ("MAX(0, CAST(ROUND((julianday(r.started_at) - MAX(julianday(r.scheduled_for), "
           "COALESCE(julianday(l.created_at), julianday(r.scheduled_for)))) * 86400000.0) AS INTEGER))")
_LAG_FROM = ("FROM loop_runs r LEFT JOIN loops l ON l.id = r.loop_id "
             "WHERE r.started_at IS NOT NULL AND r.attempt = 1")
_DURATION_FROM = "FROM loop_runs WHERE duration_ms IS NOT NULL"


def histogram(conn: sqlite3.Connection, value_ms: str, source: str,
              bounds_s: Sequence[float]) -> tuple[list[tuple[str, float]], float]:
    """Cumulative buckets and the sum (seconds) of ``value_ms`` over ``source``, counted by SQLite in one pass."""
    counts = ", ".join(f"TOTAL({value_ms} <= {round(b * 1000)})" for b in bounds_s)
    row = conn.execute(f"SELECT COUNT(*), TOTAL({value_ms}), {counts} {source}").fetchone()
    buckets = [(str(float(b)), float(row[2 + i])) for i, b in enumerate(bounds_s)]
    buckets.append(("+Inf", float(row[0])))
    return buckets, float(row[1]) / 1000.0


def per_loop_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """``LOOPSQ_METRICS_PER_LOOP``: ``1`` adds per-loop labels, ``0`` or unset leaves them out.

    Raises:
        ValidationError: any other value.
    """
    value = (os.environ if environ is None else environ).get(PER_LOOP_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValidationError(f"{PER_LOOP_ENV} must be 1 or 0, got '{value}'")
    return value == "1"


def _counter(conn: sqlite3.Connection, name: str, doc: str, metric: str, label: str | None, per_loop: bool,
             zeros: Sequence[str] = ()) -> CounterMetricFamily:
    """One counter family from the mirror's counts; ``zeros`` are label values shown at 0 before any count (so an
    alert on ``increase()`` has a series to start from)."""
    labels = (["loop_id", "loop"] if per_loop else []) + ([label] if label else [])
    family = CounterMetricFamily(name, doc, labels=labels)
    rows = counters.read(conn, metric, per_loop=per_loop)
    seen = {value for _, _, value, _ in rows}
    if not per_loop:
        rows += [("", "", value, 0) for value in zeros if value not in seen]
        rows.sort(key=lambda row: row[2])
    for loop_id, loop_name, value, count in rows:
        family.add_metric(([loop_id, loop_name] if per_loop else []) + ([value] if label else []), count)
    return family


def _missed_counter(counts: Mapping[str, int]) -> CounterMetricFamily:
    """``loopsq_slots_missed_total{reason}`` from Redis's counts per kind; every kind shown, at 0 before any."""
    family = CounterMetricFamily("loopsq_slots_missed", "Slots that did not run, by reason.", labels=["reason"])
    for kind in sorted({*missed.KINDS, *counts}):
        family.add_metric([kind], counts.get(kind, 0))
    return family


def _repaired_counter(counts: Mapping[str, int]) -> CounterMetricFamily:
    """``loopsq_loops_repaired_total{cause}`` from Redis's counts per cause; every cause shown, at 0 before any."""
    family = CounterMetricFamily("loopsq_loops_repaired", "Stalled loops the watchdog repaired, by cause.",
                                 labels=["cause"])
    for cause in sorted({*stall_rules.CAUSES, *counts}):
        family.add_metric([cause], counts.get(cause, 0))
    return family


class StateCollector(Collector):
    """Reads loopsq's state on every scrape."""

    def __init__(self, ctx: WebContext, *, per_loop: bool = False) -> None:
        self.ctx = ctx
        self.per_loop = per_loop

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: registering must not touch Redis."""
        return []

    def collect(self) -> Iterable[Metric]:
        """The metric families, from the caught-up mirror and Redis."""
        per_loop = self.per_loop
        with self.ctx.mirror() as conn:
            # (a missed row is no attempt: its slots are loopsq_slots_missed_total)
            terminal = [s for s in RUN_STATUSES if s in TERMINAL and s != MISSED]
            families: list[Metric] = [
                _counter(conn, "loopsq_runs", "Finished loop run attempts by status.", counters.RUNS, "status",
                         per_loop, terminal),
                _counter(conn, "loopsq_retries", "Retry attempts of loop runs started.", counters.RETRIES, None,
                         per_loop, [""]),
                _counter(conn, "loopsq_recoveries", "Loop runs abandoned, by reason.", counters.RECOVERIES,
                         "reason", per_loop, counters.RECOVERY_REASONS),
            ]
            keys = "loop_id, loop_name, status" if per_loop else "status"
            runs = GaugeMetricFamily("loopsq_runs_current", "Recorded loop runs by their current status.",
                                     labels=(["loop_id", "loop"] if per_loop else []) + ["status"])
            for row in conn.execute(f"SELECT {keys}, COUNT(*) FROM loop_runs GROUP BY {keys} ORDER BY {keys}"):
                runs.add_metric([str(v) for v in row[:-1]], int(row[-1]))
            loops = GaugeMetricFamily("loopsq_loops", "Loops by status.", labels=["status"])
            by_status = {str(s): int(n) for s, n in conn.execute(
                "SELECT status, COUNT(*) FROM loops WHERE archived_at IS NULL GROUP BY status")}
            for status in sorted({*LOOP_STATUSES, *by_status}):
                loops.add_metric([status], by_status.get(status, 0))
            lag = HistogramMetricFamily("loopsq_scheduling_lag_seconds",
                                        "Start delay of first attempts, from when the slot could first have run "
                                        "(its time, or its loop's creation if later).")
            lag.add_metric([], *histogram(conn, _LAG_MS, _LAG_FROM, LAG_BUCKETS_S))
            duration = HistogramMetricFamily("loopsq_run_duration_seconds", "Duration of finished runs.")
            duration.add_metric([], *histogram(conn, "duration_ms", _DURATION_FROM, DURATION_BUCKETS_S))
        yield from (*families, runs, loops, lag, duration)
        yield _missed_counter(missed_state.counts(self.ctx.client, self.ctx.keys))
        yield _repaired_counter(stalls.repaired_counts(self.ctx.client, self.ctx.keys))
        yield GaugeMetricFamily("loopsq_workers_alive", "Workers with a fresh liveness key.",
                                value=len(live_processes(self.ctx.client, self.ctx.keys, "worker")))
        yield GaugeMetricFamily("loopsq_schedulers_alive", "Schedulers with a fresh liveness key.",
                                value=len(live_processes(self.ctx.client, self.ctx.keys, "scheduler")))
        yield from fleet_families(read_fleet(self.ctx.client, self.ctx.keys))


def fleet_families(fleet: FleetSnapshot) -> list[Metric]:
    """The fleet's gauges. Label values are bounded: one ``queue`` per requirement set in use (a handful), one
    ``worker`` per live worker."""
    depth = GaugeMetricFamily("loopsq_queue_depth", "Runs waiting in each of loopsq's RQ queues.", labels=["queue"])
    oldest = GaugeMetricFamily("loopsq_queue_oldest_age_seconds",
                               "How long the oldest run waiting in each queue has waited (0 when none waits).",
                               labels=["queue"])
    unserved = GaugeMetricFamily("loopsq_queue_unserved",
                                 "1 when no live worker has the labels the queue's runs require, else 0.",
                                 labels=["queue"])
    for queue in fleet.queues:
        depth.add_metric([queue.name], queue.depth)
        oldest.add_metric([queue.name], (queue.oldest_age_ms or 0) / 1000.0)
        unserved.add_metric([queue.name], 1 if queue.unserved else 0)
    slots = GaugeMetricFamily("loopsq_worker_slots", "Slots (runs it can hold at once) of each live worker.",
                              labels=["worker"])
    busy = GaugeMetricFamily("loopsq_worker_slots_busy", "Slots in use on each live worker.", labels=["worker"])
    for worker in fleet.workers:
        slots.add_metric([worker.id], worker.slots)
        busy.add_metric([worker.id], worker.busy)
    limit = GaugeMetricFamily("loopsq_pool_limit", "Each fleet-wide pool's limit.", labels=["pool"])
    held = GaugeMetricFamily("loopsq_pool_holders", "Slots of each pool held now.", labels=["pool"])
    waiting = GaugeMetricFamily("loopsq_pool_waiters", "Runs and steps waiting for a slot of each pool.",
                                labels=["pool"])
    for pool in fleet.pools:  # (pools are few: operators create them by name)
        limit.add_metric([pool.pool.name], pool.pool.limit)
        held.add_metric([pool.pool.name], len(pool.holders))
        waiting.add_metric([pool.pool.name], len(pool.waiters))
    return [
        depth, oldest, unserved, slots, busy, limit, held, waiting,
        GaugeMetricFamily("loopsq_fleet_slots", "Slots across the live workers.", value=fleet.capacity),
        GaugeMetricFamily("loopsq_fleet_slots_busy", "Slots in use across the live workers.", value=fleet.busy),
        GaugeMetricFamily("loopsq_timers_overdue", "Armed timers past their time by more than a few seconds.",
                          value=fleet.timers.overdue),
    ]


def registry_for(ctx: WebContext, *, per_loop: bool = False) -> CollectorRegistry:
    """A registry of its own per app (no process-wide default registry, no client-library metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector(ctx, per_loop=per_loop))
    return registry


router = APIRouter()


@router.get("/metrics", tags=["metrics"], summary="Prometheus metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}},
                             "description": "Prometheus text format."}, **error_responses()})
def metrics(request: Request) -> Response:
    """The metrics, read at scrape time (the API token is required, as a bearer header)."""
    registry: CollectorRegistry = request.app.state.metrics_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
