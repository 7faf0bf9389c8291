"""The mirror counts run transitions as it applies them, exactly once: finished attempts by status, retries,
recoveries by reason; a repeated snapshot, a replayed change and a rebuild's snapshot count nothing."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain.run_rules import SHUTDOWN_ERROR
from loopsq.engine.recovery import LEASE_EXPIRED
from loopsq.mirror import counters
from loopsq.mirror.apply import apply_changes, replace_all, reset
from loopsq.mirror.schema import open_db

T0 = "2026-01-01T00:00:00.000Z"


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    db = open_db(tmp_path / "loops.db")
    yield db
    db.close()


def run(run_id: str = "r1", loop_id: str = "l1", **fields: Any) -> dict[str, Any]:
    return {"id": run_id, "loopId": loop_id, "loopName": f"name-{loop_id}", "scheduledFor": T0, "attempt": 1,
            "status": "running", "createdAt": T0, "updatedAt": T0, **fields}


class Stream:
    """Changes with increasing ids."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.n = 0

    def apply(self, *runs: dict[str, Any]) -> None:
        self.n += 1
        apply_changes(self.conn, [{"id": f"{self.n}-0", "type": "t", "at": T0, "upsert": {"loop_runs": list(runs)}}])


def totals(conn: sqlite3.Connection, metric: str, per_loop: bool = False) -> dict[tuple[str, ...], int]:
    rows = counters.read(conn, metric, per_loop=per_loop)
    return {((a, c) if per_loop else (c,)): v for a, _b, c, v in rows}


def test_a_failed_attempt_then_its_retry_count_two_finished_attempts_and_one_retry(conn: sqlite3.Connection) -> None:
    stream = Stream(conn)
    stream.apply(run())
    stream.apply(run(status="failed", error="process exited with code 1"))
    stream.apply(run(attempt=2))
    stream.apply(run(attempt=2, status="succeeded"))
    assert totals(conn, counters.RUNS) == {("failed",): 1, ("succeeded",): 1}
    assert totals(conn, counters.RETRIES) == {("",): 1}
    assert totals(conn, counters.RECOVERIES) == {}


def test_a_repeated_snapshot_a_replayed_change_and_a_lease_renewal_count_nothing(conn: sqlite3.Connection) -> None:
    stream = Stream(conn)
    stream.apply(run())
    stream.apply(run(leaseExpiresAt=T0))  # renewal: still running
    stream.apply(run(status="succeeded"))
    stream.apply(run(status="succeeded"))  # the same row again, in a later change
    apply_changes(conn, [{"id": "3-0", "type": "t", "at": T0, "upsert": {"loop_runs": [run(status="failed")]}}])
    assert totals(conn, counters.RUNS) == {("succeeded",): 1}


@pytest.mark.parametrize(("error", "reason"), [
    ("worker worker:h:1:ab died before completion", "worker_died"),
    (LEASE_EXPIRED, "lease_expired"),
    (SHUTDOWN_ERROR, "worker_shutdown"),
    ("something new", "other"),
])
def test_an_abandoned_run_counts_a_recovery_by_its_reason(conn: sqlite3.Connection, error: str, reason: str) -> None:
    stream = Stream(conn)
    stream.apply(run())
    stream.apply(run(status="abandoned", error=error))
    assert totals(conn, counters.RECOVERIES) == {(reason,): 1}
    assert totals(conn, counters.RUNS) == {("abandoned",): 1}


def test_counts_are_kept_per_loop_and_summed_without_per_loop_labels(conn: sqlite3.Connection) -> None:
    stream = Stream(conn)
    stream.apply(run("a", "l1", status="skipped"), run("b", "l2", status="skipped"), run("c", "l2", status="failed"))
    assert totals(conn, counters.RUNS) == {("failed",): 1, ("skipped",): 2}
    assert totals(conn, counters.RUNS, per_loop=True) == {("l1", "skipped"): 1, ("l2", "failed"): 1,
                                                           ("l2", "skipped"): 1}


def test_a_rebuild_counts_nothing_and_keeps_the_counts(conn: sqlite3.Connection) -> None:
    stream = Stream(conn)
    stream.apply(run())
    stream.apply(run(status="failed"))
    replace_all(conn, {"loop_runs": [run(status="failed"), run("r2", status="succeeded")]}, "9-0")
    reset(conn)
    assert totals(conn, counters.RUNS) == {("failed",): 1}
