"""Repairing a malformed mirror (``loopsq mirror --rebuild``): set the damaged file aside, let the rebuild make a
fresh one from Redis, then keep what can still be read of the damaged file's history.

Only history tables are salvaged (loop runs, workflow runs, their steps and events): they are the archive, the rows
Redis may have trimmed. Loops and workflow specs all live in Redis, so the rebuild alone restores them (a loop row
in the damaged file that Redis lacks is a removed loop and stays removed). A salvaged row never replaces one the
rebuild wrote: Redis's version wins. Each table is read forward, then backward from its last row, so rows on both
sides of a damaged page are kept; whatever lies between is reported as lost. The mirror's name (its consumer
group's, ``identity``) is kept too when it can be read, so the repaired mirror follows on in its own group.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from loopsq.mirror.apply import MIRROR_NAME_KEY, get_meta, set_meta
from loopsq.mirror.damage import is_malformed
from loopsq.mirror.schema import MIRRORED_COLUMNS, open_db, transaction

#: The tables whose rows a repair copies from the damaged file (parents first).
SALVAGED_TABLES = ("loop_runs", "workflow_runs", "workflow_step_runs", "workflow_events")
_SUFFIXES = ("", "-wal", "-shm")


@dataclass(frozen=True)
class Salvage:
    """What a repair kept of one table of the damaged file."""

    table: str
    read: int
    kept: int
    error: str | None = None
    #: How many rows the damage hid, judged from the gap in rowids between the two scans (None: no damage seen).
    missing: int | None = None


@dataclass(frozen=True)
class Repair:
    """A repaired mirror: where the damaged file went, why it was set aside, and what was kept of it."""

    damaged: Path
    reason: str
    tables: tuple[Salvage, ...] = ()
    unreadable: str | None = None

    @property
    def lost(self) -> dict[str, str]:
        """Table -> what of it could not be kept, and why (every table when the file could not be read)."""
        if self.unreadable is not None:
            return dict.fromkeys(SALVAGED_TABLES, self.unreadable)
        return {t.table: (f"about {t.missing} rows" if t.missing is not None else "some rows") + f" ({t.error})"
                for t in self.tables if t.error is not None}


def damage_of(path: Path) -> str | None:
    """Why the mirror file at ``path`` cannot be trusted (``PRAGMA quick_check`` or the error reading it), or None
    when it is sound or absent."""
    if not path.exists():
        return None
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return str(exc) if is_malformed(exc) else None
    problems = [str(row[0]) for row in rows if str(row[0]) != "ok"]
    return "; ".join(problems[:3]) if problems else None


def set_aside(path: Path, now: datetime) -> Path:
    """Move the mirror file (and its ``-wal``/``-shm``) to ``<path>.corrupt-<YYYYmmddTHHMMSSZ>``; returns it."""
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    serial = 1
    while any(Path(f"{target}{suffix}").exists() for suffix in _SUFFIXES):
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{serial}")
        serial += 1
    for suffix in _SUFFIXES:
        source = Path(f"{path}{suffix}")
        if source.exists():
            os.replace(source, f"{target}{suffix}")
    return target


def open_for_rebuild(path: Path, now: datetime) -> tuple[sqlite3.Connection, Repair | None]:
    """Open the mirror a rebuild will fill. A malformed file is set aside first and a fresh one created; the
    returned ``Repair`` (None for a sound file) is completed by ``salvage`` once the rebuild is done."""
    reason = damage_of(path)
    if reason is None:
        return open_db(path), None
    damaged = set_aside(path, now)
    return open_db(path), Repair(damaged=damaged, reason=reason)


def _scan(conn: sqlite3.Connection, table: str, columns: Sequence[str], order: str,
          rows: dict[int, tuple[Any, ...]]) -> tuple[str | None, int | None]:
    """Read ``table`` in rowid ``order`` into ``rows`` until it ends, meets a row already read, or fails; returns
    why it failed (None when it did not) and the last rowid it read."""
    sql = f"SELECT rowid, {', '.join(columns)} FROM {table} ORDER BY rowid {order}"
    last: int | None = None
    try:
        for row in _rows(conn, sql):
            if row[0] in rows:
                return None, last
            rows[row[0]] = tuple(row[1:])
            last = int(row[0])
    except sqlite3.DatabaseError as exc:
        return str(exc), last
    return None, last


def _rows(conn: sqlite3.Connection, sql: str) -> Iterator[tuple[Any, ...]]:
    cursor = conn.execute(sql)
    while batch := cursor.fetchmany(500):
        yield from batch


def salvage(repair: Repair, conn: sqlite3.Connection) -> Repair:
    """Copy every readable history row of the damaged file that ``conn`` (the rebuilt mirror) lacks."""
    try:
        old = sqlite3.connect(f"file:{repair.damaged}?mode=ro", uri=True)
    except sqlite3.DatabaseError as exc:
        return Repair(repair.damaged, repair.reason, unreadable=str(exc))
    results: list[Salvage] = []
    try:
        _keep_name(old, conn)
        for table in SALVAGED_TABLES:
            try:
                present = {str(r[1]) for r in old.execute(f"PRAGMA table_info({table})")}
            except sqlite3.DatabaseError as exc:
                if table == SALVAGED_TABLES[0]:
                    return Repair(repair.damaged, repair.reason, unreadable=str(exc))
                results.append(Salvage(table, 0, 0, str(exc)))
                continue
            columns = [c for c in MIRRORED_COLUMNS[table] if c in present]
            if not columns:
                continue
            rows: dict[int, tuple[Any, ...]] = {}
            error, first_end = _scan(old, table, columns, "ASC", rows)
            missing = None
            if error is not None:
                _, second_end = _scan(old, table, columns, "DESC", rows)
                low = first_end or 0
                missing = max(0, second_end - low - 1) if second_end is not None else None
            before = conn.total_changes
            marks = ", ".join("?" for _ in columns)
            with transaction(conn):
                conn.executemany(f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({marks})",
                                 list(rows.values()))
            results.append(Salvage(table, len(rows), conn.total_changes - before, error, missing))
    finally:
        old.close()
    return Repair(repair.damaged, repair.reason, tuple(results))


def _keep_name(old: sqlite3.Connection, conn: sqlite3.Connection) -> None:
    """Give the rebuilt mirror the damaged file's name, when that can be read and the rebuilt one has none."""
    try:
        row = old.execute("SELECT value FROM mirror_meta WHERE key = ?", (MIRROR_NAME_KEY,)).fetchone()
    except sqlite3.DatabaseError:
        return
    if row is not None and get_meta(conn, MIRROR_NAME_KEY) is None:
        with transaction(conn):
            set_meta(conn, MIRROR_NAME_KEY, str(row[0]))
