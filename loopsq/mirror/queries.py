"""Read queries over the SQLite mirror, with the reference store's filters and orderings; camelCase results.

Orderings are the reference's (``ORDER BY next_run_at ASC`` puts NULLs first, as SQLite does), with ``id`` as a
final tie-break so that equal timestamps list in a stable order. Lookups by name follow the reference: loops
take the newest ``created_at``; workflows consider active ones only, newest ``updated_at``; ids win over names.
"""

from __future__ import annotations

import sqlite3
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from loopsq.errors import LoopsqError
from loopsq.mirror.apply import row_to_entity
from loopsq.mirror.tag_filters import loop_tag_where, run_tag_where

Entity = dict[str, Any]


#: Which loops a list shows: not archived (the default, as 0.3.15), archived only, or both.
ARCHIVED_FILTERS = ("exclude", "only", "include")
_ARCHIVED_SQL = {"exclude": "archived_at IS NULL", "only": "archived_at IS NOT NULL", "include": "1 = 1"}


def list_loops(conn: sqlite3.Connection, status: str | None = None, limit: int = 200,
               archived: str = "exclude", tags: Mapping[str, str] | None = None) -> list[Entity]:
    """Loops, ``next_run_at ASC`` when filtered by status, else ``status ASC, next_run_at ASC``; archived loops
    only with ``archived="only"`` or ``"include"``; ``tags``: only loops carrying every one of them."""
    terms, params = loop_tag_where(tags)
    where = " AND ".join([_ARCHIVED_SQL[archived], *terms])
    if status is not None:
        sql = f"SELECT * FROM loops WHERE status = ? AND {where} ORDER BY next_run_at ASC, id ASC LIMIT ?"
        return _all(conn, "loops", sql, (status, *params, limit))
    sql = f"SELECT * FROM loops WHERE {where} ORDER BY status ASC, next_run_at ASC, id ASC LIMIT ?"
    return _all(conn, "loops", sql, (*params, limit))


def get_loop(conn: sqlite3.Connection, loop_id: str) -> Entity | None:
    """The loop with this id, or None."""
    return _one(conn, "loops", "SELECT * FROM loops WHERE id = ?", (loop_id,))


def find_loop(conn: sqlite3.Connection, id_or_name: str) -> Entity | None:
    """The loop with this id, else the newest-created loop with this name (names are not unique), or None."""
    found = get_loop(conn, id_or_name)
    if found is not None:
        return found
    sql = "SELECT * FROM loops WHERE name = ? ORDER BY created_at DESC, id DESC LIMIT 1"
    found = _one(conn, "loops", sql, (id_or_name,))
    composed = unicodedata.normalize("NFC", id_or_name)  # names are stored composed (``loop_spec.validate_name``)
    if found is None and composed != id_or_name:
        found = _one(conn, "loops", sql, (composed,))
    return found


def count_loops(conn: sqlite3.Connection, status: str | None = None) -> int:
    """How many loops there are, optionally with this status; archived loops are not counted (0.3.15)."""
    where, params = _where((("status", status),))
    where = f"{where} AND archived_at IS NULL" if where else " WHERE archived_at IS NULL"
    try:
        row = conn.execute(f"SELECT COUNT(*) FROM loops{where}", params).fetchone()
    except sqlite3.Error as exc:
        raise LoopsqError(f"cannot read loops from the mirror: {exc}") from exc
    return int(row[0])


def list_runs(
    conn: sqlite3.Connection, loop_id: str | None = None, status: str | None = None, limit: int = 100,
    loop_name: str | None = None, outcome: str | None = None, tags: Mapping[str, str] | None = None,
) -> list[Entity]:
    """Loop runs, newest ``created_at`` first, optionally of one loop (by id, or by the name the runs recorded),
    with one status and/or with one control-file outcome; ``tags``: only runs of loops carrying all of them."""
    where, params = _where((("loop_id", loop_id), ("loop_name", loop_name), ("status", status),
                            ("outcome", outcome)))
    terms, tag_params = run_tag_where(tags)
    if terms:
        where = f"{where} AND {terms[0]}" if where else f" WHERE {terms[0]}"
        params = [*params, *(str(p) for p in tag_params)]
    sql = f"SELECT * FROM loop_runs{where} ORDER BY created_at DESC, id DESC LIMIT ?"
    return _all(conn, "loop_runs", sql, (*params, limit))


def run_filter(conn: sqlite3.Connection, id_or_name: str) -> dict[str, str] | None:
    """How to select the runs of the loop ``id_or_name``: ``{"loop_id": id}`` for a loop the mirror holds (by id,
    else by name) or for runs recorded under that loop id; ``{"loop_name": name}`` for runs recorded under that
    name (a removed loop: its runs stay). None when neither a loop nor a run knows it."""
    loop = find_loop(conn, id_or_name)
    if loop is not None:
        return {"loop_id": str(loop["id"])}
    for column in ("loop_id", "loop_name"):
        try:
            row = conn.execute(f"SELECT 1 FROM loop_runs WHERE {column} = ? LIMIT 1", (id_or_name,)).fetchone()
        except sqlite3.Error as exc:
            raise LoopsqError(f"cannot read loop_runs from the mirror: {exc}") from exc
        if row is not None:
            return {column: id_or_name}
    return None


def get_run(conn: sqlite3.Connection, run_id: str) -> Entity | None:
    """The loop run with this id, or None."""
    return _one(conn, "loop_runs", "SELECT * FROM loop_runs WHERE id = ?", (run_id,))


def count_runs(conn: sqlite3.Connection, status: str | None = None) -> int:
    """How many loop runs there are, optionally with this status."""
    return _count(conn, "loop_runs", status)


def list_workflows(conn: sqlite3.Connection, status: str | None = None, limit: int = 200,
                   tags: Mapping[str, str] | None = None) -> list[Entity]:
    """Workflow specs, ``updated_at DESC`` when filtered by status, else ``status ASC, updated_at DESC``;
    ``tags``: only those carrying every one of them."""
    terms, params = loop_tag_where(tags)  # (the same column, tags_json, on workflow_specs)
    extra = "".join(f" AND {term}" for term in terms)
    if status is not None:
        sql = f"SELECT * FROM workflow_specs WHERE status = ?{extra} ORDER BY updated_at DESC, id DESC LIMIT ?"
        return _all(conn, "workflow_specs", sql, (status, *params, limit))
    sql = f"SELECT * FROM workflow_specs WHERE 1 = 1{extra} ORDER BY status ASC, updated_at DESC, id DESC LIMIT ?"
    return _all(conn, "workflow_specs", sql, (*params, limit))


def get_workflow(conn: sqlite3.Connection, workflow_id: str) -> Entity | None:
    """The workflow spec with this id, archived or not, or None."""
    return _one(conn, "workflow_specs", "SELECT * FROM workflow_specs WHERE id = ?", (workflow_id,))


def find_workflow(conn: sqlite3.Connection, id_or_name: str) -> Entity | None:
    """The workflow with this id (archived ones too), else the ACTIVE one with this name, or None."""
    found = get_workflow(conn, id_or_name)
    if found is not None:
        return found
    sql = (
        "SELECT * FROM workflow_specs WHERE name = ? AND status = 'active' "
        "ORDER BY updated_at DESC, id DESC LIMIT 1"
    )
    return _one(conn, "workflow_specs", sql, (id_or_name,))


def list_workflow_runs(
    conn: sqlite3.Connection,
    workflow_id: str | None = None,
    loop_run_id: str | None = None,
    limit: int = 100,
) -> list[Entity]:
    """Workflow runs, newest ``created_at`` first, optionally of one workflow and/or one loop run."""
    where, params = _where((("workflow_id", workflow_id), ("loop_run_id", loop_run_id)))
    sql = f"SELECT * FROM workflow_runs{where} ORDER BY created_at DESC, id DESC LIMIT ?"
    return _all(conn, "workflow_runs", sql, (*params, limit))


def get_workflow_run(conn: sqlite3.Connection, run_id: str) -> Entity | None:
    """The workflow run with this id, or None."""
    return _one(conn, "workflow_runs", "SELECT * FROM workflow_runs WHERE id = ?", (run_id,))


def list_step_runs(conn: sqlite3.Connection, run_id: str) -> list[Entity]:
    """The step runs of a workflow run, by ``sequence`` (the step's index in the spec)."""
    sql = "SELECT * FROM workflow_step_runs WHERE workflow_run_id = ? ORDER BY sequence ASC, step_id ASC"
    return _all(conn, "workflow_step_runs", sql, (run_id,))


def list_events(conn: sqlite3.Connection, run_id: str, limit: int = 200) -> list[Entity]:
    """The events of a workflow run, by ``sequence``, at most ``limit`` of them (the first ones)."""
    sql = "SELECT * FROM workflow_events WHERE workflow_run_id = ? ORDER BY sequence ASC LIMIT ?"
    return _all(conn, "workflow_events", sql, (run_id, limit))


def _where(filters: Sequence[tuple[str, str | None]]) -> tuple[str, list[str]]:
    clauses = [f"{column} = ?" for column, value in filters if value is not None]
    params = [value for _, value in filters if value is not None]
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _count(conn: sqlite3.Connection, table: str, status: str | None) -> int:
    where, params = _where((("status", status),))
    try:
        row = conn.execute(f"SELECT COUNT(*) FROM {table}{where}", params).fetchone()
    except sqlite3.Error as exc:
        raise LoopsqError(f"cannot read {table} from the mirror: {exc}") from exc
    return int(row[0])


def _all(conn: sqlite3.Connection, table: str, sql: str, params: Sequence[Any]) -> list[Entity]:
    try:
        cursor = conn.cursor()
        cursor.row_factory = sqlite3.Row  # whatever the connection's own row factory is
        rows = cursor.execute(sql, tuple(params)).fetchall()
    except sqlite3.Error as exc:
        raise LoopsqError(f"cannot read {table} from the mirror: {exc}") from exc
    return [row_to_entity(table, row) for row in rows]


def _one(conn: sqlite3.Connection, table: str, sql: str, params: Sequence[Any]) -> Entity | None:
    rows = _all(conn, table, sql, params)
    return rows[0] if rows else None
