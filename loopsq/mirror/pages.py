"""Keyset pages over the mirror: runs filtered by loop, status and creation time; loops by name and status.

Each page is ``limit`` rows after a cursor (the last row's sort key), never an ``OFFSET``: a page deep in a long
history costs what the first one does. Runs are newest first (``created_at DESC, id DESC``; indexes
``idx_runs_created_id``, ``idx_runs_loop_created_id``, ``idx_runs_status_created_id``), loops by name
(``name ASC, id ASC``; ``idx_loops_name_id``). A cursor is opaque text: the key's two parts, each URL-safe
base64 (unpadded) of its UTF-8, joined by a dot (``CURSOR_PATTERN``). Any text of that shape is a position to
continue from (the API's schema can then say exactly which cursors it takes; bytes that are not UTF-8 read as
U+FFFD); anything else is bad input naming the parameter.
"""

from __future__ import annotations

import base64
import json
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from loopsq.errors import ValidationError
from loopsq.mirror.page_indexes import DDL, MIGRATION
from loopsq.mirror.queries import _ARCHIVED_SQL, Entity, _all
from loopsq.mirror.tag_filters import loop_tag_where, run_tag_where

__all__ = ["CURSOR_PATTERN", "DDL", "LOOP_KEYSET", "MIGRATION", "RUN_KEYSET", "Page", "decode_cursor", "encode_cursor", "loops_page", "runs_page"]

#: After a cursor: a row value, so the index seeks to it (the equivalent OR of two comparisons scans from the top).
RUN_KEYSET = "(created_at, id) < (?, ?)"
LOOP_KEYSET = "(name, id) > (?, ?)"


@dataclass(frozen=True)
class Page:
    """One page of rows, and the cursor of the next one (None on the last page)."""

    items: list[Entity]
    next_cursor: str | None


#: One part of a cursor: unpadded URL-safe base64 (a length of 1 modulo 4 decodes to nothing).
_PART = "(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3})?"
#: Every cursor ``decode_cursor`` takes, and only those.
CURSOR_PATTERN = f"^{_PART}\\.{_PART}$"
_CURSOR = re.compile(CURSOR_PATTERN)


def _part(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8", "surrogatepass")).decode().rstrip("=")


def encode_cursor(key: tuple[str, str]) -> str:
    return f"{_part(key[0])}.{_part(key[1])}"


def decode_cursor(cursor: str, param: str = "cursor") -> tuple[str, str]:
    """The key of a cursor; ``ValidationError`` naming ``param`` when it is not of a cursor's shape."""
    if not _CURSOR.fullmatch(cursor):
        shown = cursor if len(cursor) <= 60 else cursor[:57] + "..."
        raise ValidationError(f"{param} is not a cursor from a previous page, got {json.dumps(shown)}")
    first, second = (base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode("utf-8", "replace")
                     for part in cursor.split("."))
    return first, second


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
