"""Keyset pages over the mirror: runs filtered by loop, status and creation time; loops by name and status.

Each page is ``limit`` rows after a cursor (the last row's sort key), never an ``OFFSET``: a page deep in a long
history costs what the first one does. Runs are newest first (``created_at DESC, id DESC``; indexes
``idx_runs_created_id``, ``idx_runs_loop_created_id``, ``idx_runs_status_created_id``), loops by name
(``name ASC, id ASC``; ``idx_loops_name_id``). A cursor is opaque text (URL-safe base64 of the key); one that
does not decode is bad input naming the parameter.
"""

from __future__ import annotations

import base64
import binascii
import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from loopsq.errors import ValidationError
from loopsq.mirror.page_indexes import DDL, MIGRATION
from loopsq.mirror.queries import _ARCHIVED_SQL, Entity, _all
from loopsq.mirror.tag_filters import loop_tag_where, run_tag_where

__all__ = ["DDL", "LOOP_KEYSET", "MIGRATION", "RUN_KEYSET", "Page", "decode_cursor", "encode_cursor", "loops_page", "runs_page"]

#: After a cursor: a row value, so the index seeks to it (the equivalent OR of two comparisons scans from the top).
RUN_KEYSET = "(created_at, id) < (?, ?)"
LOOP_KEYSET = "(name, id) > (?, ?)"


@dataclass(frozen=True)
class Page:
    """One page of rows, and the cursor of the next one (None on the last page)."""

    items: list[Entity]
    next_cursor: str | None


def encode_cursor(key: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_cursor(cursor: str, param: str = "cursor") -> tuple[str, str]:
    """The key of a cursor; ``ValidationError`` naming ``param`` when it is not one this module made."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = json.loads(raw)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        key = None
    if not (isinstance(key, list) and len(key) == 2 and all(isinstance(k, str) for k in key)):
        shown = cursor if len(cursor) <= 60 else cursor[:57] + "..."
        raise ValidationError(f"{param} is not a cursor from a previous page, got {json.dumps(shown)}")
    return key[0], key[1]


def runs_page(conn: sqlite3.Connection, tags: Mapping[str, str] | None = None, /, *, loop_id: str | None = None, loop_name: str | None = None,
              status: str | None = None, since: str | None = None, until: str | None = None,
              cursor: str | None = None, limit: int = 50, outcome: str | None = None) -> Page:
    """Loop runs newest first, created in ``[since, until)`` (ISO times), after ``cursor``; ``outcome``: only runs
    whose control file said it; ``tags``: only runs of loops carrying every one of these tags."""
    where, params = run_tag_where(tags)
    for column, value in (("loop_id", loop_id), ("loop_name", loop_name), ("status", status), ("outcome", outcome)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if since is not None:
        where.append("created_at >= ?")
        params.append(since)
    if until is not None:
        where.append("created_at < ?")
        params.append(until)
    if cursor is not None:
        created, run_id = decode_cursor(cursor)
        where.append(RUN_KEYSET)
        params += [created, run_id]
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    sql = f"SELECT * FROM loop_runs{clause} ORDER BY created_at DESC, id DESC LIMIT ?"
    rows = _all(conn, "loop_runs", sql, (*params, limit + 1))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, encode_cursor((str(rows[-1]["createdAt"]), str(rows[-1]["id"]))) if more else None)


def loops_page(conn: sqlite3.Connection, *, name: str | None = None, status: str | None = None,
               archived: str = "exclude", cursor: str | None = None, limit: int = 100,
               tags: Mapping[str, str] | None = None) -> Page:
    """Loops by name whose name contains ``name`` (case-insensitive), with ``status``, carrying every one of
    ``tags``, after ``cursor``; archived ones only with ``archived="only"`` or ``"include"`` (as
    ``queries.list_loops``)."""
    where, params = loop_tag_where(tags)
    where.insert(0, _ARCHIVED_SQL[archived])
    if name:
        escaped = name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where.append("name LIKE ? ESCAPE '\\'")
        params.append(f"%{escaped}%")
    if status is not None:
        where.append("status = ?")
        params.append(status)
    if cursor is not None:
        after_name, after_id = decode_cursor(cursor)
        where.append(LOOP_KEYSET)
        params += [after_name, after_id]
    sql = f"SELECT * FROM loops WHERE {' AND '.join(where)} ORDER BY name ASC, id ASC LIMIT ?"
    rows = _all(conn, "loops", sql, (*params, limit + 1))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, encode_cursor((str(rows[-1]["name"]), str(rows[-1]["id"]))) if more else None)
