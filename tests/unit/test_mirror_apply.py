"""Applying changes to the mirror: idempotence, stream-id order, atomic batches, deletes, round trips."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopsq.errors import LoopsqError
from loopsq.mirror.apply import (
    apply_changes,
    get_meta,
    last_applied_id,
    parse_stream_id,
    replace_all,
    reset,
    row_to_entity,
    set_meta,
)
from loopsq.mirror.schema import open_db

T0 = "2024-05-01T10:00:00.000Z"
T1 = "2024-05-01T10:01:00.000Z"


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    db = open_db(tmp_path / "mirror.db")
    yield db
    db.close()


def full_loop(**overrides: Any) -> dict[str, Any]:
    loop: dict[str, Any] = {
        "id": "a1a1a1a1a1a1",
        "name": "nightly",
        "description": "backs things up",
        "status": "active",
        "schedule": {"type": "interval", "everyMs": 60000, "anchor": "fixed_rate"},
        "target": {"type": "command", "command": "backup", "args": ["--all"], "env": {"TOKEN": "s3cret"}},
        "nextRunAt": T1,
        "retryScheduledFor": T0,
        "catchUp": "latest",
        "catchUpLimit": 50,
        "overlap": "replace",
        "maxAttempts": 3,
        "retryDelayMs": 60000,
        "leaseMs": 1800000,
        "expiresAt": "2030-01-01T00:00:00.000Z",
        "createdAt": T0,
        "updatedAt": T1,
        "timezone": "Europe/Paris",
        "retryBackoff": "exponential",
        "retryMaxDelayMs": 600000,
        "pauseAfterFailures": 5,
        "failureStreak": 2,
        "statusReason": "paused after 5 failures",
    }
    loop.update(overrides)
    return loop


def full_run(**overrides: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "id": "b2b2b2b2b2b2",
        "loopId": "a1a1a1a1a1a1",
        "loopName": "nightly",
        "scheduledFor": T0,
        "attempt": 2,
        "status": "failed",
        "startedAt": T0,
        "finishedAt": T1,
        "claimedBy": "worker-1",
        "leaseExpiresAt": T1,
        "pid": 4242,
        "exitCode": 3,
        "durationMs": 60000,
        "stdout": "out",
        "stderr": "err",
        "error": "exit code 3",
        "createdAt": T0,
        "updatedAt": T1,
        "source": "due_slot",
        "host": "box-1",
        "pidStartTime": 1714557600.25,
        "idempotencyKey": "key-1",
        "previousAttempts": [{"attempt": 1, "status": "timed_out", "error": "timed out after 1s", "stdout": "o"}],
    }
    run.update(overrides)
    return run


def full_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "id": "c3c3c3c3c3c3",
        "name": "deploy",
        "description": "ships it",
        "version": 2,
        "status": "active",
        "steps": [
            {"id": "build", "target": {"type": "command", "command": "make"}},
            {"id": "ship", "dependsOn": ["build"], "continueOnFailure": False, "target": {"type": "agent"}},
        ],
        "maxParallel": 4,
        "createdAt": T0,
        "updatedAt": T0,
    }
    spec.update(overrides)
    return spec


def full_workflow_run(**overrides: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "id": "d4d4d4d4d4d4",
        "workflowId": "c3c3c3c3c3c3",
        "workflowName": "deploy",
        "loopId": "a1a1a1a1a1a1",
        "loopRunId": "b2b2b2b2b2b2",
        "scheduledFor": T0,
        "idempotencyKey": "wf-key",
        "status": "failed",
        "startedAt": T0,
        "finishedAt": T1,
        "durationMs": 60000,
        "error": "step build failed",
        "createdAt": T0,
        "updatedAt": T1,
    }
    run.update(overrides)
    return run


def full_step_run(**overrides: Any) -> dict[str, Any]:
    step: dict[str, Any] = {
        "id": "e5e5e5e5e5e5",
        "workflowRunId": "d4d4d4d4d4d4",
        "stepId": "build",
        "sequence": 0,
        "status": "failed",
        "startedAt": T0,
        "finishedAt": T1,
        "exitCode": 2,
        "pid": 99,
        "durationMs": 1000,
        "stdout": "o",
        "stderr": "e",
        "error": "exit code 2",
        "accountProfile": "work",
        "accountTool": "claude",
        "createdAt": T0,
        "updatedAt": T1,
    }
    step.update(overrides)
    return step


def full_event(**overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "id": "f6f6f6f6f6f6",
        "workflowRunId": "d4d4d4d4d4d4",
        "sequence": 1,
        "eventType": "step_failed",
        "stepId": "build",
        "payload": {"exitCode": 2, "error": "exit code 2", "nested": [1, {"a": None}]},
        "createdAt": T1,
    }
    event.update(overrides)
    return event


FULL = {
    "loops": full_loop,
    "loop_runs": full_run,
    "workflow_specs": full_spec,
    "workflow_runs": full_workflow_run,
    "workflow_step_runs": full_step_run,
    "workflow_events": full_event,
}


def change(stream_id: str, upsert: dict[str, list[Any]] | None = None, delete: Any = None) -> dict[str, Any]:
    return {"id": stream_id, "type": "test", "at": T0, "upsert": upsert or {}, "delete": delete or {}}


def read(conn: sqlite3.Connection, table: str) -> list[dict[str, Any]]:
    return [row_to_entity(table, row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY id")]


def dump(conn: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {table: [tuple(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY id")] for table in FULL}


@pytest.mark.parametrize("table", sorted(FULL))
def test_a_fully_populated_entity_round_trips_through_its_row_unchanged(
    conn: sqlite3.Connection, table: str
) -> None:
    entity = FULL[table]()
    assert apply_changes(conn, [change("1-0", {table: [entity]})]) == 1
    assert read(conn, table) == [entity]


def test_absent_keys_stay_absent_and_unknown_keys_are_ignored(conn: sqlite3.Connection) -> None:
    minimal = {
        k: v
        for k, v in full_run().items()
        if k in {"id", "loopId", "loopName", "scheduledFor", "attempt", "status"}
    }
    minimal.update(createdAt=T0, updatedAt=T0)
    apply_changes(conn, [change("1-0", {"loop_runs": [{**minimal, "claimToken": "x", "pid": None}]})])
    assert read(conn, "loop_runs") == [minimal]


def test_json_columns_hold_json_text_and_an_absent_payload_is_null(conn: sqlite3.Connection) -> None:
    event = full_event()
    del event["payload"]
    apply_changes(conn, [change("1-0", {"loops": [full_loop()], "workflow_events": [event]})])
    schedule = conn.execute("SELECT schedule_json FROM loops").fetchone()[0]
    assert schedule == '{"type":"interval","everyMs":60000,"anchor":"fixed_rate"}'
    assert conn.execute("SELECT payload_json FROM workflow_events").fetchone()[0] is None
    assert "payload" not in read(conn, "workflow_events")[0]


def test_applying_the_same_change_twice_changes_nothing(conn: sqlite3.Connection) -> None:
    first = change("5-0", {"loops": [full_loop()], "loop_runs": [full_run()]})
    assert apply_changes(conn, [first]) == 1
    before = dump(conn)
    assert apply_changes(conn, [first]) == 0
    assert apply_changes(conn, [first, first]) == 0
    assert dump(conn) == before
    assert last_applied_id(conn) == "5-0"


def test_a_newer_snapshot_replaces_every_column_including_cleared_ones(conn: sqlite3.Connection) -> None:
    apply_changes(conn, [change("1-0", {"loops": [full_loop()]})])
    stopped = full_loop(status="stopped", updatedAt="2024-05-02T00:00:00.000Z")
    del stopped["nextRunAt"], stopped["retryScheduledFor"], stopped["statusReason"]
    apply_changes(conn, [change("2-0", {"loops": [stopped]})])
    assert read(conn, "loops") == [stopped]


def test_a_change_older_than_the_last_applied_is_skipped(conn: sqlite3.Connection) -> None:
    apply_changes(conn, [change("10-0", {"loops": [full_loop(name="new")]})])
    assert apply_changes(conn, [change("9-5", {"loops": [full_loop(name="old")]})]) == 0
    assert read(conn, "loops")[0]["name"] == "new"
    assert last_applied_id(conn) == "10-0"


def test_stream_ids_compare_as_numbers_not_strings(conn: sqlite3.Connection) -> None:
    assert apply_changes(conn, [change("9-0", {"loops": [full_loop(name="nine")]})]) == 1
    assert apply_changes(conn, [change("10-0", {"loops": [full_loop(name="ten")]})]) == 1
    assert apply_changes(conn, [change("10-2", {"loops": [full_loop(name="ten-2")]})]) == 1
    assert apply_changes(conn, [change("10-10", {"loops": [full_loop(name="ten-10")]})]) == 1
    assert read(conn, "loops")[0]["name"] == "ten-10"
    assert last_applied_id(conn) == "10-10"


def test_within_one_batch_a_later_listed_but_older_change_is_skipped(conn: sqlite3.Connection) -> None:
    batch = [
        change("10-0", {"loops": [full_loop(name="ten")]}),
        change("9-0", {"loops": [full_loop(name="nine")]}),
    ]
    assert apply_changes(conn, batch) == 1
    assert read(conn, "loops")[0]["name"] == "ten"
    assert last_applied_id(conn) == "10-0"


def test_an_unknown_table_rolls_back_the_whole_batch(conn: sqlite3.Connection) -> None:
    batch = [change("1-0", {"loops": [full_loop()]}), change("2-0", {"goals": [{"id": "x"}]})]
    with pytest.raises(
        LoopsqError, match=r"^unknown mirror table 'goals': expected one of loops, loop_runs, "
    ):
        apply_changes(conn, batch)
    assert read(conn, "loops") == []
    assert last_applied_id(conn) is None


def test_a_row_sqlite_refuses_rolls_back_the_whole_batch(conn: sqlite3.Connection) -> None:
    nameless = full_loop(id="zzzzzzzzzzzz")
    del nameless["name"]
    batch = [change("1-0", {"loops": [full_loop()]}), change("2-0", {"loops": [nameless]})]
    with pytest.raises(
        LoopsqError, match=r"^cannot apply changes to the mirror: NOT NULL constraint failed: loops.name$"
    ):
        apply_changes(conn, batch)
    assert read(conn, "loops") == []
    assert last_applied_id(conn) is None


def test_a_malformed_stream_id_is_refused(conn: sqlite3.Connection) -> None:
    with pytest.raises(LoopsqError, match=r"^invalid stream id '12': expected '<milliseconds>-<sequence>'$"):
        apply_changes(conn, [change("12", {"loops": [full_loop()]})])
    assert parse_stream_id("1717000000000-3") == (1717000000000, 3)


def test_deletes_remove_rows_and_missing_ids_are_harmless(conn: sqlite3.Connection) -> None:
    apply_changes(conn, [change("1-0", {"loops": [full_loop()], "loop_runs": [full_run()]})])
    apply_changes(conn, [change("2-0", delete={"loops": ["a1a1a1a1a1a1", "nope"]})])
    assert read(conn, "loops") == []
    assert len(read(conn, "loop_runs")) == 1  # like the reference, no cascade to runs


def test_archive_then_create_with_the_same_name_in_one_change_applies_in_order(
    conn: sqlite3.Connection,
) -> None:
    old = full_spec(id="old000000000")
    apply_changes(conn, [change("1-0", {"workflow_specs": [old]})])
    archived = full_spec(id="old000000000", status="archived", updatedAt=T1)
    new = full_spec(id="new000000000", updatedAt=T1)
    assert apply_changes(conn, [change("2-0", {"workflow_specs": [archived, new]})]) == 1
    assert read(conn, "workflow_specs") == [new, archived]


def test_archive_and_create_as_separate_changes_in_one_batch_apply(conn: sqlite3.Connection) -> None:
    apply_changes(conn, [change("1-0", {"workflow_specs": [full_spec(id="old000000000")]})])
    archived = full_spec(id="old000000000", status="archived", updatedAt=T1)
    new = full_spec(id="new000000000", updatedAt=T1)
    batch = [change("2-0", {"workflow_specs": [archived]}), change("3-0", {"workflow_specs": [new]})]
    assert apply_changes(conn, batch) == 2
    assert read(conn, "workflow_specs") == [new, archived]


def test_create_listed_before_the_archive_it_replaces_still_ends_with_both_rows(
    conn: sqlite3.Connection,
) -> None:
    apply_changes(conn, [change("1-0", {"workflow_specs": [full_spec(id="old000000000")]})])
    archived = full_spec(id="old000000000", status="archived", updatedAt=T1)
    new = full_spec(id="new000000000", updatedAt=T1)
    assert apply_changes(conn, [change("2-0", {"workflow_specs": [new, archived]})]) == 1
    assert read(conn, "workflow_specs") == [new, archived]


def test_a_stale_run_holding_the_same_slot_gives_way_to_the_newer_snapshot(conn: sqlite3.Connection) -> None:
    apply_changes(conn, [change("1-0", {"loop_runs": [full_run(id="stale0000000")]})])
    apply_changes(conn, [change("2-0", {"loop_runs": [full_run(id="fresh0000000")]})])
    assert [r["id"] for r in read(conn, "loop_runs")] == ["fresh0000000"]


def test_reset_empties_every_mirrored_table_and_the_meta_but_keeps_the_schema(
    conn: sqlite3.Connection,
) -> None:
    apply_changes(conn, [change("1-0", {table: [make()] for table, make in FULL.items()})])
    set_meta(conn, "redis_instance", "abc")
    reset(conn)
    assert all(rows == [] for rows in dump(conn).values())
    assert last_applied_id(conn) is None and get_meta(conn, "redis_instance") is None
    assert conn.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0] == 6  # with the missed slots (0103)


def test_replace_all_swaps_in_a_snapshot_with_its_last_id_and_meta(conn: sqlite3.Connection) -> None:
    apply_changes(conn, [change("1-0", {"loops": [full_loop(id="gone00000000")]})])
    replace_all(
        conn, {"loops": [full_loop()], "workflow_specs": [full_spec()]}, "7-1", {"redis_instance": "r1"}
    )
    assert [loop["id"] for loop in read(conn, "loops")] == ["a1a1a1a1a1a1"]
    assert read(conn, "workflow_specs") == [full_spec()]
    assert (last_applied_id(conn), get_meta(conn, "redis_instance")) == ("7-1", "r1")
    assert apply_changes(conn, [change("7-1", {"loops": [full_loop(name="x")]})]) == 0


def test_a_refused_snapshot_leaves_the_previous_mirror_intact(conn: sqlite3.Connection) -> None:
    apply_changes(conn, [change("1-0", {"loops": [full_loop()]})])
    before = dump(conn)
    with pytest.raises(LoopsqError, match=r"^unknown mirror table 'nope'"):
        replace_all(conn, {"loops": [], "nope": [{"id": "x"}]}, "9-0")
    assert dump(conn) == before
    assert last_applied_id(conn) == "1-0"


def test_meta_values_are_stored_and_replaced(conn: sqlite3.Connection) -> None:
    assert get_meta(conn, "k") is None
    set_meta(conn, "k", "one")
    set_meta(conn, "k", "two")
    assert get_meta(conn, "k") == "two"
