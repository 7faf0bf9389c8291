"""Counters of run transitions, kept by the mirror as it applies the change stream (for ``/metrics``).

A Prometheus counter must never go down, which counts derived from the rows cannot promise (a retry reuses its
slot's row; a row keeps only its newest earlier attempts). So the mirror counts transitions instead, in the same
transaction that applies them, which makes them exactly-once like the rows: each loop run row that reaches a
terminal status counts one finished attempt (``runs``, by status), an attempt number that grows counts retries
(``retries``), and an ``abandoned`` end counts a recovery by its reason (``recoveries``). Counts are kept per loop;
``/metrics`` sums them unless per-loop labels are asked for.

A mirror counts what it has applied: one that rebuilt itself from Redis (the stream trimmed past it) keeps its
counts but has not seen the transitions it skipped, and a new mirror starts from zero, as any restarted counter.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from loopsq.domain.run_rules import MISSED, SHUTDOWN_ERROR, TERMINAL

TABLE = "run_counters"
DDL = (f"CREATE TABLE IF NOT EXISTS {TABLE} (metric TEXT NOT NULL, loop_id TEXT NOT NULL, loop_name TEXT NOT NULL,"
       " label TEXT NOT NULL, value INTEGER NOT NULL, PRIMARY KEY (metric, loop_id, label))")

RUNS, RETRIES, RECOVERIES = "runs", "retries", "recoveries"
RECOVERY_REASONS = ("worker_died", "lease_expired", "worker_shutdown", "other")


def recovery_reason(error: str | None) -> str:
    """The reason label of an abandoned run, from its error (the messages of ``engine.recovery`` and of a worker
    that shut down before its run ended)."""
    text = error or ""
    if text == SHUTDOWN_ERROR:
        return "worker_shutdown"
    if text.startswith("worker ") and text.endswith(" died before completion"):
        return "worker_died"
    if "lease expired" in text:
        return "lease_expired"
    return "other"


def _bump(conn: sqlite3.Connection, metric: str, run: Mapping[str, Any], label: str, by: int = 1) -> None:
    conn.execute(
        f"INSERT INTO {TABLE} (metric, loop_id, loop_name, label, value) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT(metric, loop_id, label) DO UPDATE SET value = value + excluded.value, "
        "loop_name = excluded.loop_name",
        (metric, str(run.get("loopId") or ""), str(run.get("loopName") or ""), label, by),
    )


def previous_state(conn: sqlite3.Connection, run_id: str) -> tuple[str, int] | None:
    """``(status, attempt)`` of a mirrored run row, or None when the mirror has no such row yet."""
    row = conn.execute("SELECT status, attempt FROM loop_runs WHERE id = ?", (run_id,)).fetchone()
    return None if row is None else (str(row[0]), int(row[1]))


def count_transition(conn: sqlite3.Connection, before: tuple[str, int] | None, run: Mapping[str, Any]) -> None:
    """Count what the upsert of ``run`` over a row that was ``before`` did (nothing for a repeated snapshot). A
    ``missed`` row is no attempt: its slots are counted in Redis (``keys.missed_counts``), not here."""
    status, attempt = str(run.get("status")), int(run.get("attempt") or 1)
    if status == MISSED:
        return
    if before is not None and attempt > before[1]:
        _bump(conn, RETRIES, run, "", attempt - before[1])
    if status in TERMINAL and (before is None or before[0] not in TERMINAL or before[1] != attempt):
        _bump(conn, RUNS, run, status)
        if status == "abandoned":
            _bump(conn, RECOVERIES, run, recovery_reason(run.get("error")))


def read(conn: sqlite3.Connection, metric: str, *, per_loop: bool) -> list[tuple[str, str, str, int]]:
    """``(loop_id, loop_name, label, value)`` rows of one metric; loop id and name are empty unless ``per_loop``."""
    if per_loop:
        sql = (f"SELECT loop_id, loop_name, label, value FROM {TABLE} WHERE metric = ? "
               "ORDER BY loop_id, label")
    else:
        sql = f"SELECT '', '', label, SUM(value) FROM {TABLE} WHERE metric = ? GROUP BY label ORDER BY label"
    return [(str(a), str(b), str(c), int(d)) for a, b, c, d in conn.execute(sql, (metric,))]
