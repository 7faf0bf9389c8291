"""The SQLite query mirror's schema: the reference's 0.3.0 tables and indexes, loopsq's additive columns, open_db.

The ``CREATE`` statements are the reference's (same tables, columns, types, constraints and index names), so a
database created by the reference opens here and is upgraded in place: loopsq's own columns are only ever added
by ``add_column_if_missing``, never folded into the ``CREATE TABLE`` text. ``MIRRORED_COLUMNS`` is the single
list of the columns the mirror writes and reads, per table, in the order they exist in a fresh database.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

from loopsq.domain.timeutil import now, to_iso
from loopsq.errors import LoopsqError
from loopsq.mirror import counters
from loopsq.mirror import page_indexes as pages
from loopsq.mirror.damage import is_malformed, malformed_error
from loopsq.state.layout import LAYOUT, StateLayoutError, reads

INITIAL_MIGRATION = "0001_initial_and_workflows"
LOOPSQ_MIGRATION = "0100_loopsq_columns"
#: loopsq's table of run-transition counters (``loopsq.mirror.counters``).
COUNTERS_MIGRATION = "0101_run_counters"
#: ``loop_runs.missed_last``, ``missed_count`` and ``missed_kind``: a ``missed`` row's streak (``domain.missed``).
MISSED_MIGRATION = "0103_missed_slots"
#: The reference's own id for ``loops.archived_at`` and ``loops.archived_from_status`` (0.3.15).
ARCHIVE_MIGRATION = "0004_loop_archive_metadata"

_REFERENCE_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS schema_migrations (
        id TEXT PRIMARY KEY,
        applied_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS loops (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        description TEXT,
        status TEXT NOT NULL,
        schedule_json TEXT NOT NULL,
        target_json TEXT NOT NULL,
        next_run_at TEXT,
        retry_scheduled_for TEXT,
        catch_up TEXT NOT NULL,
        catch_up_limit INTEGER NOT NULL,
        overlap TEXT NOT NULL,
        max_attempts INTEGER NOT NULL,
        retry_delay_ms INTEGER NOT NULL,
        lease_ms INTEGER NOT NULL,
        expires_at TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS idx_loops_status_next ON loops(status, next_run_at)",
    "CREATE INDEX IF NOT EXISTS idx_loops_name ON loops(name)",
    """CREATE TABLE IF NOT EXISTS loop_runs (
        id TEXT PRIMARY KEY,
        loop_id TEXT NOT NULL,
        loop_name TEXT NOT NULL,
        scheduled_for TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        status TEXT NOT NULL,
        started_at TEXT,
        finished_at TEXT,
        claimed_by TEXT,
        lease_expires_at TEXT,
        pid INTEGER,
        exit_code INTEGER,
        duration_ms INTEGER,
        stdout TEXT,
        stderr TEXT,
        error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE(loop_id, scheduled_for)
    )""",
    "CREATE INDEX IF NOT EXISTS idx_runs_loop ON loop_runs(loop_id, created_at)",
    "CREATE INDEX IF NOT EXISTS idx_runs_status ON loop_runs(status)",
    "CREATE INDEX IF NOT EXISTS idx_runs_scheduled ON loop_runs(scheduled_for)",
    """CREATE TABLE IF NOT EXISTS daemon_lease (
        id TEXT PRIMARY KEY,
        pid INTEGER NOT NULL,
        hostname TEXT NOT NULL,
        heartbeat_at TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS workflow_specs (
        id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        description TEXT,
        version INTEGER NOT NULL,
        status TEXT NOT NULL,
        steps_json TEXT NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS idx_workflows_status_name ON workflow_specs(status, name)",
    "CREATE UNIQUE INDEX IF NOT EXISTS idx_workflows_name_active ON workflow_specs(name) WHERE status = 'active'",
    """CREATE TABLE IF NOT EXISTS workflow_runs (
        id TEXT PRIMARY KEY,
        workflow_id TEXT NOT NULL REFERENCES workflow_specs(id) ON DELETE CASCADE,
        workflow_name TEXT NOT NULL,
        loop_id TEXT REFERENCES loops(id) ON DELETE SET NULL,
        loop_run_id TEXT REFERENCES loop_runs(id) ON DELETE SET NULL,
        scheduled_for TEXT,
        idempotency_key TEXT,
        status TEXT NOT NULL,
        started_at TEXT,
        finished_at TEXT,
        duration_ms INTEGER,
        error TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    )""",
    """CREATE UNIQUE INDEX IF NOT EXISTS idx_workflow_runs_idempotency
        ON workflow_runs(workflow_id, idempotency_key) WHERE idempotency_key IS NOT NULL""",
    "CREATE INDEX IF NOT EXISTS idx_workflow_runs_workflow_created ON workflow_runs(workflow_id, created_at DESC)",
    "CREATE INDEX IF NOT EXISTS idx_workflow_runs_loop_run ON workflow_runs(loop_run_id)",
    "CREATE INDEX IF NOT EXISTS idx_workflow_runs_status ON workflow_runs(status)",
    """CREATE TABLE IF NOT EXISTS workflow_step_runs (
        id TEXT PRIMARY KEY,
        workflow_run_id TEXT NOT NULL REFERENCES workflow_runs(id) ON DELETE CASCADE,
        step_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        status TEXT NOT NULL,
        started_at TEXT,
        finished_at TEXT,
        exit_code INTEGER,
        pid INTEGER,
        duration_ms INTEGER,
        stdout TEXT,
        stderr TEXT,
        error TEXT,
        account_profile TEXT,
        account_tool TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE(workflow_run_id, step_id)
    )""",
    """CREATE INDEX IF NOT EXISTS idx_workflow_step_runs_run_sequence
        ON workflow_step_runs(workflow_run_id, sequence)""",
    "CREATE INDEX IF NOT EXISTS idx_workflow_step_runs_status ON workflow_step_runs(status)",
    """CREATE TABLE IF NOT EXISTS workflow_events (
        id TEXT PRIMARY KEY,
        workflow_run_id TEXT NOT NULL REFERENCES workflow_runs(id) ON DELETE CASCADE,
        sequence INTEGER NOT NULL,
        event_type TEXT NOT NULL,
        step_id TEXT,
        payload_json TEXT,
        created_at TEXT NOT NULL,
        UNIQUE(workflow_run_id, sequence)
    )""",
    "CREATE INDEX IF NOT EXISTS idx_workflow_events_run_sequence ON workflow_events(workflow_run_id, sequence)",
)

_MIRROR_META_DDL = "CREATE TABLE IF NOT EXISTS mirror_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"

# (table, column, declaration): loopsq's additive columns, nullable so old rows and old readers stay valid.
LOOPSQ_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("loops", "timezone", "TEXT"),
    ("loops", "retry_backoff", "TEXT"),
    ("loops", "retry_max_delay_ms", "INTEGER"),
    ("loops", "pause_after_failures", "INTEGER"),
    ("loops", "failure_streak", "INTEGER"),
    ("loops", "status_reason", "TEXT"),
    ("loops", "retry_at", "TEXT"),
    ("loops", "keep_runs", "INTEGER"),
    ("loops", "archived_at", "TEXT"),  # the reference's 0.3.15 columns (0004_loop_archive_metadata)
    ("loops", "archived_from_status", "TEXT"),
    ("loop_runs", "source", "TEXT"),
    ("loop_runs", "host", "TEXT"),
    ("loop_runs", "pid_start_time", "REAL"),
    ("loop_runs", "idempotency_key", "TEXT"),
    ("loop_runs", "worker_id", "TEXT"),
    ("loop_runs", "previous_attempts_json", "TEXT"),
    # When the row left Redis's history window (NULL while Redis holds it): the mirror is the archive.
    ("loop_runs", "archived_at", "TEXT"),
    ("workflow_runs", "archived_at", "TEXT"),
    ("loop_runs", "rerun", "INTEGER"),
    ("loop_runs", "no_retry", "INTEGER"),
    ("workflow_specs", "max_parallel", "INTEGER"),
    # Beyond the reference (issue 19): steering, gates, jitter, workspaces, outcomes.
    ("loops", "steerable", "INTEGER"),
    ("loops", "min_interval_ms", "INTEGER"),
    ("loops", "max_interval_ms", "INTEGER"),
    ("loops", "gate_json", "TEXT"),
    ("loops", "jitter_ms", "INTEGER"),
    ("loops", "workspace", "TEXT"),
    ("loops", "workspace_wait_ms", "INTEGER"),
    ("loops", "budget_runs_json", "TEXT"),
    ("loops", "budget_cost_json", "TEXT"),
    ("loops", "usage_json", "TEXT"),
    ("loop_runs", "outcome", "TEXT"),
    ("loop_runs", "control_json", "TEXT"),
    ("loop_runs", "control_warning", "TEXT"),
    ("loop_runs", "workspace", "TEXT"),
    ("loop_runs", "workspace_fence", "INTEGER"),
    ("loop_runs", "input_tokens", "INTEGER"),
    ("loop_runs", "output_tokens", "INTEGER"),
    ("loop_runs", "cost_usd", "REAL"),
    # The fleet: where runs may go (``domain.placement``).
    ("loops", "requires_json", "TEXT"),
    ("loops", "pool", "TEXT"),
    ("workflow_specs", "requires_json", "TEXT"),
    ("workflow_specs", "pool", "TEXT"),
    # A missed row stands for a streak of slots (MISSED_MIGRATION): scheduled_for is its first, these the rest.
    ("loop_runs", "missed_last", "TEXT"),
    ("loop_runs", "missed_count", "INTEGER"),
    ("loop_runs", "missed_kind", "TEXT"),
    # Expiry after N consecutive successful runs (OpenLoops 0.5.3) and the count so far.
    ("loops", "expires_after_runs", "INTEGER"),
    ("loops", "success_streak", "INTEGER"),
    # Tags (issue 31): ``{"key": "value"}`` of a loop and of a workflow (``domain.tags``).
    ("loops", "tags_json", "TEXT"),
    ("workflow_specs", "tags_json", "TEXT"),
)

_MIRRORED_TABLES = (
    "loops",
    "loop_runs",
    "workflow_specs",
    "workflow_runs",
    "workflow_step_runs",
    "workflow_events",
)
_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+) \(")
_COLUMN_LINE = re.compile(r"^\s+([a-z_]+) (?:TEXT|INTEGER|REAL)\b", re.MULTILINE)


def _reference_columns(table: str) -> tuple[str, ...]:
    """The column names of ``table`` in the reference DDL above, in order (the DDL is the one source)."""
    for statement in _REFERENCE_DDL:
        match = _CREATE_TABLE.match(statement)
        if match and match.group(1) == table:
            return tuple(_COLUMN_LINE.findall(statement))
    raise AssertionError(f"no reference DDL for table {table}")


# Every column the mirror writes and reads, per mirrored table (the keys are the change's table names).
MIRRORED_COLUMNS: dict[str, tuple[str, ...]] = {
    table: _reference_columns(table) + tuple(col for tbl, col, _ in LOOPSQ_COLUMNS if tbl == table)
    for table in _MIRRORED_TABLES
}

# Columns holding a boolean (stored 0/1; read back as false/true).
BOOLEAN_COLUMNS = frozenset({"no_retry", "steerable"})

# Columns holding JSON text; the entity key drops the ``_json`` suffix.
JSON_COLUMNS = frozenset({"schedule_json", "target_json", "steps_json", "payload_json", "previous_attempts_json",
                          "gate_json", "control_json", "budget_runs_json", "budget_cost_json", "usage_json",
                          "requires_json", "tags_json"})


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """Run the block in one ``BEGIN IMMEDIATE`` transaction: commit on success, roll back on any exception.

    The connection must be in autocommit mode (``isolation_level=None``), as ``open_db`` returns it.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def column_names(conn: sqlite3.Connection, table: str) -> list[str]:
    """The columns ``table`` has in this database, in declaration order (empty when the table is missing)."""
    return [str(row[1]) for row in conn.execute(f"PRAGMA table_info({_quote(table)})")]


def add_column_if_missing(conn: sqlite3.Connection, table: str, column: str, declaration: str) -> bool:
    """Add ``column`` to ``table`` unless it is already there; the additive migration step.

    Args:
        conn: an open connection (call inside a transaction to make it atomic with other steps).
        table: an existing table.
        column: the column to add.
        declaration: its type and constraints, e.g. ``"INTEGER"``; must be valid for ``ALTER TABLE ADD``.

    Returns:
        True when the column was added, False when it already existed.
    """
    if column in column_names(conn, table):
        return False
    conn.execute(f"ALTER TABLE {_quote(table)} ADD COLUMN {_quote(column)} {declaration}")
    return True


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the database to the current schema, idempotently and in one transaction.

    Creates the reference's tables and indexes when missing, adds the step ``pid`` column a 0.2.0 database
    lacks (as the reference does), adds loopsq's columns and the ``mirror_meta`` table, and records both
    migration ids in ``schema_migrations``.
    """
    if _is_current(conn):
        return
    applied_at = to_iso(now())
    with transaction(conn):
        for statement in _REFERENCE_DDL:
            conn.execute(statement)
        add_column_if_missing(conn, "workflow_step_runs", "pid", "INTEGER")
        conn.execute(
            "INSERT OR IGNORE INTO schema_migrations (id, applied_at) VALUES (?, ?)",
            (INITIAL_MIGRATION, applied_at),
        )
        for table, column, declaration in LOOPSQ_COLUMNS:
            add_column_if_missing(conn, table, column, declaration)
        conn.execute(_MIRROR_META_DDL)
        for migration in (ARCHIVE_MIGRATION, LOOPSQ_MIGRATION):
            conn.execute(
                "INSERT OR IGNORE INTO schema_migrations (id, applied_at) VALUES (?, ?)", (migration, applied_at)
            )
        conn.execute(counters.DDL)
        conn.execute(
            "INSERT OR IGNORE INTO schema_migrations (id, applied_at) VALUES (?, ?)",
            (COUNTERS_MIGRATION, applied_at),
        )
        for statement in pages.DDL:  # keyset pages (mirror/pages.py)
            conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO schema_migrations (id, applied_at) VALUES (?, ?)",
                     (pages.MIGRATION, applied_at))
        # (its columns were added with LOOPSQ_COLUMNS above)
        conn.execute("INSERT OR IGNORE INTO schema_migrations (id, applied_at) VALUES (?, ?)",
                     (MISSED_MIGRATION, applied_at))


def _is_current(conn: sqlite3.Connection) -> bool:
    """True when nothing is left to migrate, so that a reader's open takes no write lock."""
    if not all(column_names(conn, t) for t in ("schema_migrations", "mirror_meta", counters.TABLE)):
        return False
    ids = {str(row[0]) for row in conn.execute("SELECT id FROM schema_migrations")}
    if not {INITIAL_MIGRATION, ARCHIVE_MIGRATION, LOOPSQ_MIGRATION, COUNTERS_MIGRATION, pages.MIGRATION,
            MISSED_MIGRATION} <= ids:
        return False
    expected = {(table, column) for table, columns in MIRRORED_COLUMNS.items() for column in columns}
    present = {(table, column) for table in MIRRORED_COLUMNS for column in column_names(conn, table)}
    return expected <= present


def open_db(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open (creating if needed) the mirror database at ``path`` and migrate it.

    The parent directory is created with mode 0700 (and tightened to 0700 when it exists and we own it), the
    file with mode 0600 before SQLite touches it. The connection is in autocommit mode
    (``isolation_level=None``), with ``busy_timeout`` 5000, WAL journal, ``synchronous = NORMAL`` and
    ``sqlite3.Row`` rows. ``":memory:"`` gives a private in-memory database.

    Raises:
        LoopsqError: when the directory, the file or the database cannot be opened or migrated.
    """
    target = os.fspath(path)
    try:
        if target != ":memory:":
            _prepare_file(Path(target))
        conn = sqlite3.connect(target, isolation_level=None, check_same_thread=True)
    except (OSError, sqlite3.Error) as exc:
        raise LoopsqError(f"cannot open the mirror database {target}: {exc}") from exc
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout = 5000")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        migrate(conn)
        _check_layout(conn, target)
        if target != ":memory:":
            for suffix in ("-wal", "-shm"):
                _tighten(Path(target + suffix), 0o600)
    except StateLayoutError:
        conn.close()
        raise
    except (OSError, sqlite3.Error) as exc:
        conn.close()
        if is_malformed(exc):
            raise malformed_error(target, exc) from exc
        raise LoopsqError(f"cannot open the mirror database {target}: {exc}") from exc
    return conn


def _check_layout(conn: sqlite3.Connection, target: str) -> None:
    """The mirror's layout is ``PRAGMA user_version``, the Redis layout (``state.layout``) it was last written
    by: a newer one is refused (its rows may mean what this release does not know), an older or unset one (0: a
    mirror from before versioning, migrated above) is stamped as this release's."""
    found = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if found > LAYOUT:
        raise StateLayoutError(f"the mirror {target} holds loopsq state v{found}; this loopsq reads {reads()}: "
                               "upgrade it")
    if found < LAYOUT:
        conn.execute(f"PRAGMA user_version = {int(LAYOUT)}")


def _prepare_file(file: Path) -> None:
    parent = file.parent
    # A bare file name lives in the working directory: never chmod the user's cwd.
    if str(parent) not in ("", "."):
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _tighten(parent, 0o700, directory=True)
    try:
        fd = os.open(file, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        _tighten(file, 0o600)
    else:
        os.close(fd)
        # The umask may have cleared bits from 0600; it cannot have added any, but make the mode exact.
        os.chmod(file, 0o600)


def _tighten(path: Path, mode: int, *, directory: bool = False) -> None:
    """Set ``path``'s permission bits to ``mode`` when it exists, is of the expected kind and belongs to us."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if kind_ok and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) != mode:
        os.chmod(path, mode)


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
