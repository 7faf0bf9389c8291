"""The mirror's schema: the reference's tables, columns and indexes, loopsq's additive migration, file modes."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.errors import LoopsqError
from loopsq.mirror import schema
from loopsq.mirror.schema import add_column_if_missing, open_db

# (name, declared type, NOT NULL, primary key) per table, in declaration order: the reference's 0.3.0 columns
# followed by loopsq's added ones.
EXPECTED_COLUMNS: dict[str, list[tuple[str, str, bool, bool]]] = {
    "schema_migrations": [("id", "TEXT", False, True), ("applied_at", "TEXT", True, False)],
    "loops": [
        ("id", "TEXT", False, True),
        ("name", "TEXT", True, False),
        ("description", "TEXT", False, False),
        ("status", "TEXT", True, False),
        ("schedule_json", "TEXT", True, False),
        ("target_json", "TEXT", True, False),
        ("next_run_at", "TEXT", False, False),
        ("retry_scheduled_for", "TEXT", False, False),
        ("catch_up", "TEXT", True, False),
        ("catch_up_limit", "INTEGER", True, False),
        ("overlap", "TEXT", True, False),
        ("max_attempts", "INTEGER", True, False),
        ("retry_delay_ms", "INTEGER", True, False),
        ("lease_ms", "INTEGER", True, False),
        ("expires_at", "TEXT", False, False),
        ("created_at", "TEXT", True, False),
        ("updated_at", "TEXT", True, False),
        ("timezone", "TEXT", False, False),
        ("retry_backoff", "TEXT", False, False),
        ("retry_max_delay_ms", "INTEGER", False, False),
        ("pause_after_failures", "INTEGER", False, False),
        ("failure_streak", "INTEGER", False, False),
        ("status_reason", "TEXT", False, False),
        ("retry_at", "TEXT", False, False),
        ("keep_runs", "INTEGER", False, False),
        ("archived_at", "TEXT", False, False),
        ("archived_from_status", "TEXT", False, False),
        ("steerable", "INTEGER", False, False),
        ("min_interval_ms", "INTEGER", False, False),
        ("max_interval_ms", "INTEGER", False, False),
        ("gate_json", "TEXT", False, False),
        ("jitter_ms", "INTEGER", False, False),
        ("workspace", "TEXT", False, False),
        ("workspace_wait_ms", "INTEGER", False, False),
        ("budget_runs_json", "TEXT", False, False),
        ("budget_cost_json", "TEXT", False, False),
        ("usage_json", "TEXT", False, False),
        ("requires_json", "TEXT", False, False),
        ("pool", "TEXT", False, False),
        ("expires_after_runs", "INTEGER", False, False),
        ("success_streak", "INTEGER", False, False),
        ("tags_json", "TEXT", False, False),
    ],
    "loop_runs": [
        ("id", "TEXT", False, True),
        ("loop_id", "TEXT", True, False),
        ("loop_name", "TEXT", True, False),
        ("scheduled_for", "TEXT", True, False),
        ("attempt", "INTEGER", True, False),
        ("status", "TEXT", True, False),
        ("started_at", "TEXT", False, False),
        ("finished_at", "TEXT", False, False),
        ("claimed_by", "TEXT", False, False),
        ("lease_expires_at", "TEXT", False, False),
        ("pid", "INTEGER", False, False),
        ("exit_code", "INTEGER", False, False),
        ("duration_ms", "INTEGER", False, False),
        ("stdout", "TEXT", False, False),
        ("stderr", "TEXT", False, False),
        ("error", "TEXT", False, False),
        ("created_at", "TEXT", True, False),
        ("updated_at", "TEXT", True, False),
        ("source", "TEXT", False, False),
        ("host", "TEXT", False, False),
        ("pid_start_time", "REAL", False, False),
        ("idempotency_key", "TEXT", False, False),
        ("worker_id", "TEXT", False, False),
        ("previous_attempts_json", "TEXT", False, False),
        ("archived_at", "TEXT", False, False),
        ("rerun", "INTEGER", False, False),
        ("no_retry", "INTEGER", False, False),
        ("outcome", "TEXT", False, False),
        ("control_json", "TEXT", False, False),
        ("control_warning", "TEXT", False, False),
        ("workspace", "TEXT", False, False),
        ("workspace_fence", "INTEGER", False, False),
        ("input_tokens", "INTEGER", False, False),
        ("output_tokens", "INTEGER", False, False),
        ("cost_usd", "REAL", False, False),
        ("missed_last", "TEXT", False, False),
        ("missed_count", "INTEGER", False, False),
        ("missed_kind", "TEXT", False, False),
    ],
    "daemon_lease": [
        ("id", "TEXT", False, True),
        ("pid", "INTEGER", True, False),
        ("hostname", "TEXT", True, False),
        ("heartbeat_at", "TEXT", True, False),
        ("expires_at", "TEXT", True, False),
        ("created_at", "TEXT", True, False),
        ("updated_at", "TEXT", True, False),
    ],
    "workflow_specs": [
        ("id", "TEXT", False, True),
        ("name", "TEXT", True, False),
        ("description", "TEXT", False, False),
        ("version", "INTEGER", True, False),
        ("status", "TEXT", True, False),
        ("steps_json", "TEXT", True, False),
        ("created_at", "TEXT", True, False),
        ("updated_at", "TEXT", True, False),
        ("max_parallel", "INTEGER", False, False),
        ("requires_json", "TEXT", False, False),
        ("pool", "TEXT", False, False),
        ("tags_json", "TEXT", False, False),
    ],
    "workflow_runs": [
        ("id", "TEXT", False, True),
        ("workflow_id", "TEXT", True, False),
        ("workflow_name", "TEXT", True, False),
        ("loop_id", "TEXT", False, False),
        ("loop_run_id", "TEXT", False, False),
        ("scheduled_for", "TEXT", False, False),
        ("idempotency_key", "TEXT", False, False),
        ("status", "TEXT", True, False),
        ("started_at", "TEXT", False, False),
        ("finished_at", "TEXT", False, False),
        ("duration_ms", "INTEGER", False, False),
        ("error", "TEXT", False, False),
        ("created_at", "TEXT", True, False),
        ("updated_at", "TEXT", True, False),
        ("archived_at", "TEXT", False, False),
    ],
    "workflow_step_runs": [
        ("id", "TEXT", False, True),
        ("workflow_run_id", "TEXT", True, False),
        ("step_id", "TEXT", True, False),
        ("sequence", "INTEGER", True, False),
        ("status", "TEXT", True, False),
        ("started_at", "TEXT", False, False),
        ("finished_at", "TEXT", False, False),
        ("exit_code", "INTEGER", False, False),
        ("pid", "INTEGER", False, False),
        ("duration_ms", "INTEGER", False, False),
        ("stdout", "TEXT", False, False),
        ("stderr", "TEXT", False, False),
        ("error", "TEXT", False, False),
        ("account_profile", "TEXT", False, False),
        ("account_tool", "TEXT", False, False),
        ("created_at", "TEXT", True, False),
        ("updated_at", "TEXT", True, False),
    ],
    "workflow_events": [
        ("id", "TEXT", False, True),
        ("workflow_run_id", "TEXT", True, False),
        ("sequence", "INTEGER", True, False),
        ("event_type", "TEXT", True, False),
        ("step_id", "TEXT", False, False),
        ("payload_json", "TEXT", False, False),
        ("created_at", "TEXT", True, False),
    ],
    "mirror_meta": [("key", "TEXT", False, True), ("value", "TEXT", True, False)],
}

# name -> (table, [(column, descending)], unique, partial WHERE clause or None)
EXPECTED_INDEXES: dict[str, tuple[str, list[tuple[str, bool]], bool, str | None]] = {
    "idx_loops_status_next": ("loops", [("status", False), ("next_run_at", False)], False, None),
    "idx_loops_name": ("loops", [("name", False)], False, None),
    "idx_runs_loop": ("loop_runs", [("loop_id", False), ("created_at", False)], False, None),
    "idx_runs_status": ("loop_runs", [("status", False)], False, None),
    "idx_runs_scheduled": ("loop_runs", [("scheduled_for", False)], False, None),
    "idx_workflows_status_name": ("workflow_specs", [("status", False), ("name", False)], False, None),
    "idx_workflows_name_active": ("workflow_specs", [("name", False)], True, "status = 'active'"),
    "idx_workflow_runs_idempotency": (
        "workflow_runs",
        [("workflow_id", False), ("idempotency_key", False)],
        True,
        "idempotency_key IS NOT NULL",
    ),
    "idx_workflow_runs_workflow_created": (
        "workflow_runs",
        [("workflow_id", False), ("created_at", True)],
        False,
        None,
    ),
    "idx_workflow_runs_loop_run": ("workflow_runs", [("loop_run_id", False)], False, None),
    "idx_workflow_runs_status": ("workflow_runs", [("status", False)], False, None),
    "idx_workflow_step_runs_run_sequence": (
        "workflow_step_runs",
        [("workflow_run_id", False), ("sequence", False)],
        False,
        None,
    ),
    "idx_workflow_step_runs_status": ("workflow_step_runs", [("status", False)], False, None),
    "idx_workflow_events_run_sequence": (
        "workflow_events",
        [("workflow_run_id", False), ("sequence", False)],
        False,
        None,
    ),
    # loopsq's own, for the dashboard's keyset pages (migration 0102, loopsq/mirror/page_indexes.py).
    "idx_runs_created_id": ("loop_runs", [("created_at", True), ("id", True)], False, None),
    "idx_runs_loop_created_id": ("loop_runs", [("loop_id", False), ("created_at", True), ("id", True)], False, None),
    "idx_runs_status_created_id": ("loop_runs", [("status", False), ("created_at", True), ("id", True)], False, None),
    "idx_loops_name_id": ("loops", [("name", False), ("id", False)], False, None),
}

# The table-level UNIQUE constraints (SQLite's automatic indexes).
EXPECTED_UNIQUE_CONSTRAINTS = {
    ("loop_runs", ("loop_id", "scheduled_for")),
    ("workflow_step_runs", ("workflow_run_id", "step_id")),
    ("workflow_events", ("workflow_run_id", "sequence")),
}


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    db = open_db(tmp_path / "data" / "mirror.db")
    yield db
    db.close()


def _columns(conn: sqlite3.Connection, table: str) -> list[tuple[str, str, bool, bool]]:
    return [(r[1], r[2], bool(r[3]), bool(r[5])) for r in conn.execute(f"PRAGMA table_info({table})")]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_fresh_mirror_has_exactly_the_reference_tables_plus_mirror_meta_and_run_counters(
        conn: sqlite3.Connection) -> None:
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == set(EXPECTED_COLUMNS) | {"run_counters"}


@pytest.mark.parametrize("table", sorted(EXPECTED_COLUMNS))
def test_every_table_has_the_reference_columns_then_the_loopsq_columns(
    conn: sqlite3.Connection, table: str
) -> None:
    assert _columns(conn, table) == EXPECTED_COLUMNS[table]


def test_every_reference_index_exists_with_its_name_columns_uniqueness_and_condition(
    conn: sqlite3.Connection,
) -> None:
    rows = conn.execute(
        "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex%'"
    ).fetchall()
    assert {r[0] for r in rows} == set(EXPECTED_INDEXES)
    for name, table, sql in rows:
        expected_table, expected_columns, unique, where = EXPECTED_INDEXES[name]
        keys = [(r[2], bool(r[3])) for r in conn.execute(f"PRAGMA index_xinfo({name})") if r[5]]
        listed = {r[1]: r for r in conn.execute(f"PRAGMA index_list({table})")}
        assert (table, keys, bool(listed[name][2])) == (expected_table, expected_columns, unique), name
        assert bool(listed[name][4]) == (where is not None), name
        if where is not None:
            assert sql.endswith(f"WHERE {where}"), sql


def test_table_unique_constraints_are_the_references(conn: sqlite3.Connection) -> None:
    found = set()
    for table in EXPECTED_COLUMNS:
        for row in conn.execute(f"PRAGMA index_list({table})"):
            if row[3] == "u":
                columns = tuple(r[2] for r in conn.execute(f"PRAGMA index_info({row[1]})"))
                found.add((table, columns))
    assert found == EXPECTED_UNIQUE_CONSTRAINTS


def test_every_migration_id_is_recorded(conn: sqlite3.Connection) -> None:
    ids = [r[0] for r in conn.execute("SELECT id FROM schema_migrations ORDER BY id")]
    assert ids == ["0001_initial_and_workflows", "0004_loop_archive_metadata", "0100_loopsq_columns", "0101_run_counters",
                   "0102_keyset_page_indexes", "0103_missed_slots"]


def test_connection_is_autocommit_wal_normal_sync_with_busy_timeout_and_row_objects(
    conn: sqlite3.Connection,
) -> None:
    assert conn.isolation_level is None
    assert conn.row_factory is sqlite3.Row
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 0  # never enabled, as in the reference


def test_memory_database_is_supported_and_migrated() -> None:
    db = open_db(":memory:")
    try:
        assert _columns(db, "loops") == EXPECTED_COLUMNS["loops"]
    finally:
        db.close()


def test_reopening_a_current_mirror_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "mirror.db"
    open_db(path).close()
    plain = sqlite3.connect(path)
    first = plain.execute("SELECT id, applied_at FROM schema_migrations ORDER BY id").fetchall()
    plain.close()
    db = open_db(path)
    try:
        again = db.execute("SELECT id, applied_at FROM schema_migrations ORDER BY id").fetchall()
        assert [tuple(r) for r in again] == first
        assert _columns(db, "loop_runs") == EXPECTED_COLUMNS["loop_runs"]
    finally:
        db.close()


def test_a_reference_0_3_0_database_is_upgraded_in_place_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "loops.db"
    legacy = sqlite3.connect(path)
    for statement in schema._REFERENCE_DDL:
        legacy.execute(statement)
    legacy.execute(
        "INSERT INTO schema_migrations VALUES ('0001_initial_and_workflows', '2024-01-01T00:00:00.000Z')"
    )
    legacy.execute(
        "INSERT INTO loops (id, name, status, schedule_json, target_json, catch_up, catch_up_limit, overlap,"
        " max_attempts, retry_delay_ms, lease_ms, created_at, updated_at) VALUES ('aaaaaaaaaaaa', 'nightly',"
        " 'active', '{}', '{}', 'latest', 50, 'skip', 1, 60000, 1800000, '2024-01-01T00:00:00.000Z',"
        " '2024-01-01T00:00:00.000Z')"
    )
    legacy.commit()
    legacy.close()
    plain = sqlite3.connect(path)
    assert "timezone" not in [c[0] for c in _columns(plain, "loops")]
    plain.close()

    db = open_db(path)
    try:
        for table in ("loops", "loop_runs", "workflow_specs"):
            assert _columns(db, table) == EXPECTED_COLUMNS[table]
        assert [tuple(r) for r in db.execute("SELECT name, timezone FROM loops")] == [("nightly", None)]
        migrations = db.execute("SELECT id, applied_at FROM schema_migrations ORDER BY id").fetchall()
        assert tuple(migrations[0]) == ("0001_initial_and_workflows", "2024-01-01T00:00:00.000Z")
        assert [m[0] for m in migrations] == ["0001_initial_and_workflows", "0004_loop_archive_metadata",
                                              "0100_loopsq_columns", "0101_run_counters",
                                              "0102_keyset_page_indexes", "0103_missed_slots"]
    finally:
        db.close()


def test_a_0_2_0_step_runs_table_without_pid_gets_the_pid_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    legacy = sqlite3.connect(path)
    legacy.execute(
        "CREATE TABLE workflow_step_runs (id TEXT PRIMARY KEY, workflow_run_id TEXT NOT NULL, step_id TEXT NOT NULL,"
        " sequence INTEGER NOT NULL, status TEXT NOT NULL, started_at TEXT, finished_at TEXT, exit_code INTEGER,"
        " duration_ms INTEGER, stdout TEXT, stderr TEXT, error TEXT, account_profile TEXT, account_tool TEXT,"
        " created_at TEXT NOT NULL, updated_at TEXT NOT NULL, UNIQUE(workflow_run_id, step_id))"
    )
    legacy.commit()
    legacy.close()
    db = open_db(path)
    try:
        assert "pid" in [c[0] for c in _columns(db, "workflow_step_runs")]
    finally:
        db.close()


def test_a_mirror_of_an_earlier_loopsq_gets_columns_added_since(tmp_path: Path) -> None:
    path = tmp_path / "mirror.db"
    db = open_db(path)
    db.execute("INSERT INTO loop_runs (id, loop_id, loop_name, scheduled_for, attempt, status, created_at, updated_at)"
               " VALUES ('r', 'l', 'n', 't', 1, 'succeeded', 't', 't')")
    db.execute("ALTER TABLE loop_runs DROP COLUMN previous_attempts_json")  # as an earlier version made it
    db.close()
    db = open_db(path)
    assert "previous_attempts_json" in schema.column_names(db, "loop_runs")
    assert [tuple(r) for r in db.execute("SELECT id, previous_attempts_json FROM loop_runs")] == [("r", None)]
    db.close()


def test_add_column_if_missing_adds_once_and_then_reports_the_column_present(
    conn: sqlite3.Connection,
) -> None:
    assert add_column_if_missing(conn, "loops", "extra_note", "TEXT") is True
    assert add_column_if_missing(conn, "loops", "extra_note", "TEXT") is False
    assert _columns(conn, "loops")[-1] == ("extra_note", "TEXT", False, False)


def test_new_directory_is_0700_and_new_file_is_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "mirror.db"
    previous = os.umask(0)
    try:
        open_db(path).close()
    finally:
        os.umask(previous)
    assert _mode(path.parent) == 0o700
    assert _mode(path) == 0o600
    for suffix in ("-wal", "-shm"):
        side = Path(str(path) + suffix)
        if side.exists():
            assert _mode(side) == 0o600


def test_existing_0755_directory_and_0644_file_we_own_are_tightened(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    path = directory / "mirror.db"
    path.touch()
    os.chmod(path, 0o644)
    open_db(path).close()
    assert _mode(directory) == 0o700
    assert _mode(path) == 0o600


def test_wal_and_shm_files_are_0600_while_the_mirror_is_open(tmp_path: Path) -> None:
    path = tmp_path / "data" / "mirror.db"
    db = open_db(path)
    try:
        db.execute("INSERT INTO mirror_meta VALUES ('k', 'v')")
        sides = [Path(str(path) + suffix) for suffix in ("-wal", "-shm")]
        assert all(side.exists() for side in sides)
        assert [_mode(side) for side in sides] == [0o600, 0o600]
    finally:
        db.close()


def test_a_bare_file_name_never_changes_the_working_directory_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    os.chmod(tmp_path, 0o755)
    monkeypatch.chdir(tmp_path)
    open_db("mirror.db").close()
    assert _mode(tmp_path) == 0o755
    assert _mode(tmp_path / "mirror.db") == 0o600


def test_opening_a_directory_fails_with_a_loopsq_error_and_leaves_it_alone(tmp_path: Path) -> None:
    target = tmp_path / "data" / "not-a-file"
    target.mkdir(parents=True, mode=0o755)
    os.chmod(target, 0o755)
    with pytest.raises(LoopsqError, match=r"^cannot open the mirror database .*not-a-file: "):
        open_db(target)
    assert _mode(target) == 0o755
