"""Applying change-stream entries to the SQLite mirror: idempotent upserts and deletes, row <-> entity mapping.

A change carries FULL snapshots (camelCase entities, as stored in Redis) under ``upsert``, the changed fields of
rows the mirror holds under ``patch`` (a field set to null is cleared), ids under ``delete``,
and under ``trim`` the ids of runs that left Redis's history window: their rows stay, with ``archived_at`` set
(the mirror is the archive). ``apply_changes`` applies a batch in one transaction, skipping every change whose
stream id is not greater than the last one applied, so replays and redeliveries change nothing.

The mirror must accept every row Redis holds. The reference's secondary unique keys (one run per slot, one
active workflow per name, ...) can only collide here with a row Redis has already moved on from, e.g. when one
change lists a re-created workflow before the archived one it replaces. Such a stale row is evicted and the
upsert retried: its own newer snapshot follows in the stream (or in the same change), so the mirror converges
to Redis without ever wedging on an order the index did not expect.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loopsq.errors import LoopsqError
from loopsq.mirror import counters
from loopsq.mirror.schema import BOOLEAN_COLUMNS, JSON_COLUMNS, MIRRORED_COLUMNS, transaction

log = logging.getLogger(__name__)

LAST_APPLIED_KEY = "last_applied_id"
REDIS_INSTANCE_KEY = "redis_instance"
#: The mirror's name (``loopsq.mirror.identity``), which names its consumer group: it outlives every rebuild.
MIRROR_NAME_KEY = "mirror_name"
#: Deletes the meta a rebuild replaces: everything but the mirror's name.
CLEAR_META_SQL = f"DELETE FROM mirror_meta WHERE key <> '{MIRROR_NAME_KEY}'"

_STREAM_ID = re.compile(r"(\d+)-(\d+)")

# The reference's secondary unique keys per table: (columns, partial-index condition on the stored row as SQL,
# the same condition on an incoming row). A row outside a partial index's condition cannot collide on it.
_UniqueKey = tuple[tuple[str, ...], str, Callable[[Mapping[str, Any]], bool]]


def _always(_params: Mapping[str, Any]) -> bool:
    return True


_UNIQUE_KEYS: dict[str, tuple[_UniqueKey, ...]] = {
    "loop_runs": ((("loop_id", "scheduled_for"), "", _always),),
    "workflow_specs": ((("name",), "status = 'active'", lambda p: p.get("status") == "active"),),
    "workflow_runs": (
        (
            ("workflow_id", "idempotency_key"),
            "idempotency_key IS NOT NULL",
            lambda p: p.get("idempotency_key") is not None,
        ),
    ),
    "workflow_step_runs": ((("workflow_run_id", "step_id"), "", _always),),
    "workflow_events": ((("workflow_run_id", "sequence"), "", _always),),
}


def entity_key(column: str) -> str:
    """The camelCase entity key of a column: ``next_run_at`` -> ``nextRunAt``, ``schedule_json`` -> ``schedule``."""
    base = column.removesuffix("_json") if column in JSON_COLUMNS else column
    head, *rest = base.split("_")
    return head + "".join(part.capitalize() for part in rest)


_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    table: tuple((column, entity_key(column)) for column in columns)
    for table, columns in MIRRORED_COLUMNS.items()
}


def parse_stream_id(stream_id: str) -> tuple[int, int]:
    """Split a Redis stream id ``"<ms>-<seq>"`` into integers, so that ``"9-0" < "10-0"`` compares right.

    Raises:
        LoopsqError: when the text is not a stream id.
    """
    match = _STREAM_ID.fullmatch(stream_id)
    if match is None:
        raise LoopsqError(f"invalid stream id {stream_id!r}: expected '<milliseconds>-<sequence>'")
    return int(match.group(1)), int(match.group(2))


def get_meta(conn: sqlite3.Connection, key: str) -> str | None:
    """The value stored under ``key`` in ``mirror_meta``, or None."""
    row = conn.execute("SELECT value FROM mirror_meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
    """Store ``value`` under ``key`` in ``mirror_meta``, replacing any previous value."""
    conn.execute(
        "INSERT INTO mirror_meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        (key, value),
    )


def last_applied_id(conn: sqlite3.Connection) -> str | None:
    """The stream id of the last change applied to this mirror, or None when none has been."""
    return get_meta(conn, LAST_APPLIED_KEY)


def apply_changes(conn: sqlite3.Connection, changes: Sequence[Mapping[str, Any]]) -> int:
    """Apply a batch of changes in stream order, in one ``BEGIN IMMEDIATE`` transaction.

    Each change whose id is greater than the last applied id has its upserts (in the order given) and then
    its deletes applied (a row it deletes without upserting it goes first), and becomes the last applied id.
    Older or repeated changes are skipped.

    Args:
        conn: a connection from ``open_db``.
        changes: ``{"id", "type", "at", "upsert": {table: [entity]}, "delete": {table: [id]}}`` mappings.

    Returns:
        How many changes were applied.

    Raises:
        LoopsqError: on an unknown table, a malformed change or a row SQLite refuses; nothing of the batch
            is applied then.
    """
    applied = 0
    try:
        with transaction(conn):
            last = last_applied_id(conn)
            last_key = parse_stream_id(last) if last is not None else None
            for change in changes:
                change_id = change.get("id")
                if not isinstance(change_id, str):
                    raise LoopsqError(f"malformed change: 'id' must be a stream id string, got {change_id!r}")
                key = parse_stream_id(change_id)
                if last_key is not None and key <= last_key:
                    continue
                apply_one(conn, change, count=True)
                set_meta(conn, LAST_APPLIED_KEY, change_id)
                last_key = key
                applied += 1
    except (sqlite3.Error, OverflowError) as exc:  # OverflowError: an integer wider than SQLite's 64 bits
        raise LoopsqError(f"cannot apply changes to the mirror: {exc}") from exc
    return applied


def reset(conn: sqlite3.Connection) -> None:
    """Delete every mirrored row and the meta (all but the mirror's name) in one transaction (the first step of a
    rebuild)."""
    try:
        with transaction(conn):
            for table in MIRRORED_COLUMNS:
                conn.execute(f"DELETE FROM {table}")
            conn.execute(CLEAR_META_SQL)
    except sqlite3.Error as exc:
        raise LoopsqError(f"cannot reset the mirror: {exc}") from exc


def replace_all(
    conn: sqlite3.Connection,
    upsert: Mapping[str, Sequence[Mapping[str, Any]]],
    last_id: str,
    meta: Mapping[str, str] | None = None,
) -> None:
    """Replace the whole mirror with a snapshot, in ONE transaction (a rebuild readers never see half done).

    Deletes every mirrored row and the meta (all but the mirror's name), upserts the snapshot's entities, records
    ``last_id`` as the last applied change and stores ``meta`` (e.g. the Redis instance id).

    Raises:
        LoopsqError: on an unknown table, a malformed entity or a row SQLite refuses; nothing changes then.
    """
    parse_stream_id(last_id)
    try:
        with transaction(conn):
            for table in MIRRORED_COLUMNS:
                conn.execute(f"DELETE FROM {table}")
            conn.execute(CLEAR_META_SQL)
            apply_one(conn, {"id": last_id, "upsert": upsert})
            set_meta(conn, LAST_APPLIED_KEY, last_id)
            for key, value in (meta or {}).items():
                set_meta(conn, key, value)
    except (sqlite3.Error, OverflowError) as exc:
        raise LoopsqError(f"cannot rebuild the mirror: {exc}") from exc


def row_to_entity(table: str, row: sqlite3.Row | Mapping[str, Any]) -> dict[str, Any]:
    """Map a mirrored row back to its camelCase entity: NULL columns dropped, JSON columns parsed.

    Raises:
        LoopsqError: when ``table`` is not a mirrored table.
    """
    entity: dict[str, Any] = {}
    for column, key in _columns(table):
        value = row[column]
        if value is None:
            continue
        if column in JSON_COLUMNS:
            value = json.loads(value)
        elif column in BOOLEAN_COLUMNS:
            value = bool(value)
        entity[key] = value
    return entity


def entity_to_params(table: str, entity: Mapping[str, Any]) -> dict[str, Any]:
    """The column values for an entity: absent or None keys become NULL, JSON keys are serialised.

    Raises:
        LoopsqError: when ``table`` is not a mirrored table.
    """
    params: dict[str, Any] = {}
    for column, key in _columns(table):
        value = entity.get(key)
        if value is not None and column in JSON_COLUMNS:
            value = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        params[column] = value
    return params


#: The tables whose rows a ``trim`` marks archived (a workflow run's steps and events go with their run).
ARCHIVED_TABLES = ("loop_runs", "workflow_runs")


def apply_one(conn: sqlite3.Connection, change: Mapping[str, Any], *, count: bool = False) -> None:
    """Apply one change's upserts, deletes and trims (inside the caller's transaction; no id check); with
    ``count``, loop run transitions are counted too (a rebuild's snapshot is not a transition, and is not
    counted)."""
    upserts = change.get("upsert") or {}
    deletes = change.get("delete") or {}
    trims = change.get("trim") or {}
    patches = change.get("patch") or {}
    if not all(isinstance(part, Mapping) for part in (upserts, deletes, trims, patches)):
        raise LoopsqError(
            f"malformed change {change.get('id')!r}: 'upsert', 'patch', 'delete' and 'trim' must be objects")
    # A row the change deletes and does not upsert goes first: an upsert in the same change may take its unique
    # key (a backfill run taking the slot of the missed row it ends), which is then free, not a stale row to evict.
    for table, ids in deletes.items():
        _columns(table)
        kept = {e.get("id") for e in upserts.get(table) or () if isinstance(e, Mapping)}
        conn.executemany(f"DELETE FROM {table} WHERE id = ?", [(i,) for i in ids if i not in kept])
    for table, entities in upserts.items():
        _columns(table)
        for entity in entities:
            if count and table == "loop_runs" and isinstance(entity, Mapping) and isinstance(entity.get("id"), str):
                before = counters.previous_state(conn, entity["id"])
                _upsert(conn, table, entity)
                counters.count_transition(conn, before, entity)
            else:
                _upsert(conn, table, entity)
    for table, changed in patches.items():
        for fields in changed:
            _patch(conn, table, fields)
    for table, ids in deletes.items():
        _columns(table)
        conn.executemany(f"DELETE FROM {table} WHERE id = ?", [(entity_id,) for entity_id in ids])
    for table, ids in trims.items():
        if table not in ARCHIVED_TABLES:
            raise LoopsqError(f"malformed change {change.get('id')!r}: cannot trim table {table!r}")
        at = str(change.get("at") or "")
        conn.executemany(f"UPDATE {table} SET archived_at = ? WHERE id = ? AND archived_at IS NULL",
                         [(at, entity_id) for entity_id in ids])


def _patch(conn: sqlite3.Connection, table: str, fields: Mapping[str, Any]) -> None:
    """Set the changed fields of a row the mirror holds (a row it does not hold is left to its full snapshot)."""
    if not isinstance(fields, Mapping) or not isinstance(fields.get("id"), str):
        raise LoopsqError(f"malformed {table} patch: expected an object with a string 'id'")
    params = {column: value for column, value in entity_to_params(table, fields).items()
              if entity_key(column) in fields and column != "id"}
    if params:
        assignments = ", ".join(f"{column} = :{column}" for column in params)
        conn.execute(f"UPDATE {table} SET {assignments} WHERE id = :id", {**params, "id": fields["id"]})


def _upsert(conn: sqlite3.Connection, table: str, entity: Mapping[str, Any]) -> None:
    if not isinstance(entity, Mapping) or not isinstance(entity.get("id"), str):
        raise LoopsqError(
            f"malformed {table} entity: expected an object with a string 'id', got {type(entity).__name__}"
        )
    params = entity_to_params(table, entity)
    sql = _UPSERT_SQL[table]
    try:
        conn.execute(sql, params)
    except sqlite3.IntegrityError:
        if not _evict_conflicts(conn, table, params):
            raise
        conn.execute(sql, params)


def _evict_conflicts(conn: sqlite3.Connection, table: str, params: Mapping[str, Any]) -> bool:
    """Delete rows with another id that hold one of ``params``' secondary unique keys; True if any went."""
    evicted = False
    for columns, condition, applies in _UNIQUE_KEYS.get(table, ()):
        values = [params[column] for column in columns]
        if not applies(params) or any(value is None for value in values):
            continue
        where = " AND ".join(f"{column} = ?" for column in columns)
        if condition:
            where += f" AND {condition}"
        query = f"SELECT id FROM {table} WHERE {where} AND id != ?"
        for row in conn.execute(query, (*values, params["id"])).fetchall():
            log.warning(
                "mirror: evicting stale %s row %s: %s now holds its unique key %s",
                table,
                row[0],
                params["id"],
                dict(zip(columns, values, strict=True)),
            )
            conn.execute(f"DELETE FROM {table} WHERE id = ?", (row[0],))
            evicted = True
    return evicted


def _upsert_sql(table: str) -> str:
    columns = MIRRORED_COLUMNS[table]
    names = ", ".join(columns)
    values = ", ".join(f":{column}" for column in columns)
    updates = ", ".join(f"{column} = excluded.{column}" for column in columns if column != "id")
    return f"INSERT INTO {table} ({names}) VALUES ({values}) ON CONFLICT(id) DO UPDATE SET {updates}"


_UPSERT_SQL = {table: _upsert_sql(table) for table in MIRRORED_COLUMNS}


def _columns(table: str) -> tuple[tuple[str, str], ...]:
    try:
        return _KEYS[table]
    except (KeyError, TypeError):
        raise LoopsqError(f"unknown mirror table {table!r}: expected one of {', '.join(_KEYS)}") from None
