"""A rebuild that merges: what Redis holds now goes into the existing mirror, and history Redis no longer has
stays, marked archived. The mirror is the archive, so no rebuild (asked for, or automatic after a flushed or
replaced Redis or a change stream trimmed past the mirror) ever drops a run.

Definitions (loops, workflow specs) are not history: those Redis no longer has are removed, as their own
changes would have. Runs (loop runs, workflow runs with their steps and events) Redis no longer has are kept,
and counted.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

from loopsq.errors import LoopsqError
from loopsq.mirror.apply import CLEAR_META_SQL, LAST_APPLIED_KEY, apply_one, parse_stream_id, set_meta
from loopsq.mirror.schema import transaction

#: Tables that are definitions: the mirror holds exactly what Redis holds.
DEFINITIONS = ("loops", "workflow_specs")
#: History tables, each with the column naming the run its rows belong to (None: the row is the run).
HISTORY = {"loop_runs": None, "workflow_runs": None, "workflow_step_runs": "workflow_run_id",
           "workflow_events": "workflow_run_id"}


def merge_all(
    conn: sqlite3.Connection,
    upsert: Mapping[str, Sequence[Mapping[str, Any]]],
    last_id: str,
    meta: Mapping[str, str] | None = None,
    at: str = "",
) -> int:
    """Merge a Redis snapshot into the mirror in ONE transaction (readers never see it half done).

    Definitions not in the snapshot are deleted. Runs not in the snapshot stay, with ``archived_at`` set to
    ``at`` where it was not set yet; a run the snapshot has gets exactly its snapshot (its steps and events
    too: rows of such a run that the snapshot lacks go). ``last_id`` becomes the last applied change; the
    other meta is replaced by ``meta`` (the mirror's name stays).

    Returns:
        How many runs (loop runs and workflow runs) the mirror kept that Redis no longer holds.

    Raises:
        LoopsqError: on an unknown table, a malformed entity or a row SQLite refuses; nothing changes then.
    """
    parse_stream_id(last_id)
    try:
        with transaction(conn):
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS merge_ids (tbl TEXT NOT NULL, id TEXT NOT NULL)")
            conn.execute("DELETE FROM merge_ids")
            for table in (*DEFINITIONS, "loop_runs", "workflow_runs"):
                conn.executemany("INSERT INTO merge_ids (tbl, id) VALUES (?, ?)",
                                 [(table, str(e["id"])) for e in upsert.get(table, ()) if "id" in e])
            for table in DEFINITIONS:
                conn.execute(f"DELETE FROM {table} WHERE id NOT IN (SELECT id FROM merge_ids WHERE tbl = ?)",
                             (table,))
            for table, parent in HISTORY.items():
                if parent is not None:  # a held workflow run's steps and events are replaced by the snapshot's
                    conn.execute(f"DELETE FROM {table} WHERE {parent} IN "
                                 "(SELECT id FROM merge_ids WHERE tbl = 'workflow_runs')")
            kept = 0
            for table in ("loop_runs", "workflow_runs"):
                missing = f"id NOT IN (SELECT id FROM merge_ids WHERE tbl = '{table}')"
                kept += int(conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {missing}").fetchone()[0])
                conn.execute(f"UPDATE {table} SET archived_at = ? WHERE archived_at IS NULL AND {missing}", (at,))
            conn.execute(CLEAR_META_SQL)
            apply_one(conn, {"id": last_id, "upsert": upsert})
            set_meta(conn, LAST_APPLIED_KEY, last_id)
            for key, value in (meta or {}).items():
                set_meta(conn, key, value)
            conn.execute("DELETE FROM merge_ids")
    except (sqlite3.Error, OverflowError) as exc:
        raise LoopsqError(f"cannot rebuild the mirror: {exc}") from exc
    return kept
