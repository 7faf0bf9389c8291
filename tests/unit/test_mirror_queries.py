"""Read queries over the mirror: the reference's orderings, filters and id-or-name lookups."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopsq.mirror import queries
from loopsq.mirror.apply import apply_changes
from loopsq.mirror.schema import open_db


def ts(minute: int) -> str:
    return f"2024-05-01T10:{minute:02d}:00.000Z"


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    db = open_db(tmp_path / "mirror.db")
    yield db
    db.close()


def put(conn: sqlite3.Connection, table: str, *entities: dict[str, Any]) -> None:
    last = conn.execute("SELECT value FROM mirror_meta WHERE key = 'last_applied_id'").fetchone()
    next_ms = int(last[0].split("-")[0]) + 1 if last else 1
    apply_changes(conn, [{"id": f"{next_ms}-0", "type": "t", "at": ts(0), "upsert": {table: list(entities)}}])


def loop(
    loop_id: str, status: str = "active", next_run_at: str | None = None, **extra: Any
) -> dict[str, Any]:
    entity: dict[str, Any] = {
        "id": loop_id,
        "name": extra.pop("name", loop_id),
        "status": status,
        "schedule": {"type": "cron", "expression": "* * * * *"},
        "target": {"type": "command", "command": "true"},
        "catchUp": "latest",
        "catchUpLimit": 50,
        "overlap": "skip",
        "maxAttempts": 1,
        "retryDelayMs": 60000,
        "leaseMs": 1800000,
        "createdAt": extra.pop("createdAt", ts(0)),
        "updatedAt": ts(0),
        "timezone": "UTC",
    }
    if next_run_at is not None:
        entity["nextRunAt"] = next_run_at
    entity.update(extra)
    return entity


def run(run_id: str, loop_id: str, created: str, status: str = "succeeded") -> dict[str, Any]:
    return {
        "id": run_id,
        "loopId": loop_id,
        "loopName": loop_id,
        "scheduledFor": f"{created}#{run_id}",
        "attempt": 1,
        "status": status,
        "createdAt": created,
        "updatedAt": created,
    }


def spec(spec_id: str, name: str, status: str = "active", updated: str = "") -> dict[str, Any]:
    return {
        "id": spec_id,
        "name": name,
        "version": 1,
        "status": status,
        "steps": [{"id": "s", "target": {"type": "command", "command": "true"}}],
        "createdAt": ts(0),
        "updatedAt": updated or ts(0),
    }


def ids(entities: list[dict[str, Any]]) -> list[str]:
    return [e["id"] for e in entities]


def test_loops_filtered_by_status_are_ordered_by_next_run_with_nulls_first(conn: sqlite3.Connection) -> None:
    put(
        conn,
        "loops",
        loop("l3", next_run_at=ts(3)),
        loop("l1", next_run_at=ts(1)),
        loop("ln"),
        loop("lp", "paused"),
    )
    assert ids(queries.list_loops(conn, status="active")) == ["ln", "l1", "l3"]
    assert ids(queries.list_loops(conn, status="active", limit=2)) == ["ln", "l1"]


def test_unfiltered_loops_are_ordered_by_status_then_next_run(conn: sqlite3.Connection) -> None:
    put(
        conn,
        "loops",
        loop("s1", "stopped"),
        loop("a2", next_run_at=ts(2)),
        loop("p1", "paused", ts(1)),
        loop("a1", next_run_at=ts(1)),
        loop("e1", "expired"),
    )
    assert ids(queries.list_loops(conn)) == ["a1", "a2", "e1", "p1", "s1"]


def test_a_loop_is_found_by_id_before_name_and_by_name_the_newest_created(conn: sqlite3.Connection) -> None:
    put(
        conn,
        "loops",
        loop("old", name="nightly", createdAt=ts(1)),
        loop("new", name="nightly", createdAt=ts(5)),
        loop("nightly", name="other", createdAt=ts(0)),
    )
    assert queries.find_loop(conn, "old")["id"] == "old"  # type: ignore[index]
    assert queries.find_loop(conn, "nightly")["id"] == "nightly"  # type: ignore[index]
    put(conn, "loops", loop("x1", name="daily", createdAt=ts(1)), loop("x2", name="daily", createdAt=ts(2)))
    assert queries.find_loop(conn, "daily")["id"] == "x2"  # type: ignore[index]
    assert queries.find_loop(conn, "missing") is None
    assert queries.get_loop(conn, "missing") is None


def test_loops_are_counted_in_total_and_per_status(conn: sqlite3.Connection) -> None:
    put(conn, "loops", loop("a"), loop("b"), loop("c", "paused"))
    assert queries.count_loops(conn) == 3
    assert queries.count_loops(conn, "active") == 2
    assert queries.count_loops(conn, "stopped") == 0


def test_runs_list_newest_created_first_with_id_breaking_ties(conn: sqlite3.Connection) -> None:
    put(
        conn,
        "loop_runs",
        run("r1", "l", ts(1)),
        run("r3", "l", ts(3)),
        run("r2a", "l", ts(2)),
        run("r2b", "l", ts(2)),
    )
    assert ids(queries.list_runs(conn)) == ["r3", "r2b", "r2a", "r1"]
    assert ids(queries.list_runs(conn, limit=2)) == ["r3", "r2b"]


def test_runs_filter_by_loop_and_status_together(conn: sqlite3.Connection) -> None:
    put(
        conn,
        "loop_runs",
        run("r1", "l1", ts(1), "failed"),
        run("r2", "l1", ts(2)),
        run("r3", "l2", ts(3), "failed"),
    )
    assert ids(queries.list_runs(conn, loop_id="l1")) == ["r2", "r1"]
    assert ids(queries.list_runs(conn, status="failed")) == ["r3", "r1"]
    assert ids(queries.list_runs(conn, loop_id="l1", status="failed")) == ["r1"]
    assert (queries.count_runs(conn), queries.count_runs(conn, "failed")) == (3, 2)
    assert queries.get_run(conn, "r2") == run("r2", "l1", ts(2))


def test_workflows_list_by_status_then_newest_updated(conn: sqlite3.Connection) -> None:
    put(
        conn,
        "workflow_specs",
        spec("w1", "a", updated=ts(1)),
        spec("w2", "b", updated=ts(2)),
        spec("w0", "a", "archived", ts(9)),
    )
    assert ids(queries.list_workflows(conn)) == ["w2", "w1", "w0"]
    assert ids(queries.list_workflows(conn, status="active")) == ["w2", "w1"]
    assert ids(queries.list_workflows(conn, status="archived")) == ["w0"]


def test_an_archived_workflow_is_found_by_id_but_never_by_name(conn: sqlite3.Connection) -> None:
    put(conn, "workflow_specs", spec("w0", "deploy", "archived", ts(9)), spec("w9", "build", "archived"))
    assert queries.find_workflow(conn, "w0")["status"] == "archived"  # type: ignore[index]
    assert queries.find_workflow(conn, "build") is None
    put(conn, "workflow_specs", spec("w1", "deploy", updated=ts(1)))
    assert queries.find_workflow(conn, "deploy")["id"] == "w1"  # type: ignore[index]
    assert queries.get_workflow(conn, "nope") is None


def test_workflow_runs_list_newest_first_filtered_by_workflow_or_loop_run(conn: sqlite3.Connection) -> None:
    def wrun(run_id: str, workflow_id: str, created: str, loop_run_id: str | None = None) -> dict[str, Any]:
        entity = {
            "id": run_id,
            "workflowId": workflow_id,
            "workflowName": workflow_id,
            "status": "running",
            "createdAt": created,
            "updatedAt": created,
        }
        if loop_run_id:
            entity["loopRunId"] = loop_run_id
        return entity

    put(conn, "workflow_runs", wrun("a", "w1", ts(1), "lr1"), wrun("b", "w2", ts(2)), wrun("c", "w1", ts(3)))
    assert ids(queries.list_workflow_runs(conn)) == ["c", "b", "a"]
    assert ids(queries.list_workflow_runs(conn, workflow_id="w1")) == ["c", "a"]
    assert ids(queries.list_workflow_runs(conn, loop_run_id="lr1")) == ["a"]
    assert ids(queries.list_workflow_runs(conn, limit=1)) == ["c"]
    assert queries.get_workflow_run(conn, "b") == wrun("b", "w2", ts(2))


def test_step_runs_and_events_list_by_sequence(conn: sqlite3.Connection) -> None:
    steps = [
        {
            "id": f"s{n}",
            "workflowRunId": "wr",
            "stepId": f"step{n}",
            "sequence": n,
            "status": "pending",
            "createdAt": ts(0),
            "updatedAt": ts(0),
        }
        for n in (2, 0, 1)
    ]
    events = [
        {"id": f"e{n}", "workflowRunId": "wr", "sequence": n, "eventType": "x", "createdAt": ts(n)}
        for n in (3, 1, 2)
    ]
    put(conn, "workflow_step_runs", *steps)
    put(conn, "workflow_events", *events)
    assert ids(queries.list_step_runs(conn, "wr")) == ["s0", "s1", "s2"]
    assert ids(queries.list_events(conn, "wr")) == ["e1", "e2", "e3"]
    assert ids(queries.list_events(conn, "wr", limit=2)) == ["e1", "e2"]
    assert queries.list_step_runs(conn, "other") == []


def test_queries_work_on_a_connection_without_a_row_factory(tmp_path: Path) -> None:
    open_db(tmp_path / "m.db").close()
    plain = sqlite3.connect(tmp_path / "m.db")
    try:
        apply_changes(plain, [{"id": "1-0", "upsert": {"loops": [loop("a", next_run_at=ts(1))]}}])
        assert queries.list_loops(plain) == [loop("a", next_run_at=ts(1))]
    finally:
        plain.close()
