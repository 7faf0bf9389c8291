"""Keyset pages over the mirror (``loopsq.mirror.pages``): order, cursors, filters, and that a page after a
cursor is an index seek (the query plan), so its cost does not grow with its depth (``bench/keyset_pages.py``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopsq.errors import ValidationError
from loopsq.mirror import pages
from loopsq.mirror.schema import open_db


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    db = open_db(tmp_path / "loops.db")
    for i in range(12):
        stamp = f"2026-01-01T00:00:{i // 2:02d}.000Z"  # two runs per timestamp: the id breaks the tie
        db.execute("INSERT INTO loop_runs (id, loop_id, loop_name, scheduled_for, attempt, status, created_at, "
                   "updated_at) VALUES (?, ?, 'x', ?, 1, ?, ?, ?)",
                   (f"r{i:02d}", f"l{i % 2}", f"s{i}", "failed" if i % 3 == 0 else "succeeded", stamp, stamp))
    yield db
    db.close()


def walk(conn: sqlite3.Connection, limit: int, **where: Any) -> list[list[str]]:
    out, cursor = [], None
    while True:
        page = pages.runs_page(conn, cursor=cursor, limit=limit, **where)
        out.append([r["id"] for r in page.items])
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


def test_runs_page_newest_first_through_ties_without_gaps_or_repeats(conn: sqlite3.Connection) -> None:
    assert walk(conn, 5) == [["r11", "r10", "r09", "r08", "r07"], ["r06", "r05", "r04", "r03", "r02"], ["r01", "r00"]]
    assert walk(conn, 2, loop_id="l1", status="succeeded") == [["r11", "r07"], ["r05", "r01"]]
    assert walk(conn, 10, since="2026-01-01T00:00:02.000Z", until="2026-01-01T00:00:04.000Z") == [
        ["r07", "r06", "r05", "r04"]]


@pytest.mark.parametrize("cursor", ["zzz", "", "W10", "WyJhIl0", "eyJhIjogMX0"])
def test_a_cursor_this_module_did_not_make_is_bad_input(conn: sqlite3.Connection, cursor: str) -> None:
    with pytest.raises(ValidationError, match=r"^cursor is not a cursor from a previous page, got "):
        pages.decode_cursor(cursor)


@pytest.mark.parametrize(("sql", "index"), [
    ("SELECT * FROM loop_runs WHERE {k} ORDER BY created_at DESC, id DESC LIMIT 5", "idx_runs_created_id"),
    ("SELECT * FROM loop_runs WHERE loop_id = 'x' AND {k} ORDER BY created_at DESC, id DESC LIMIT 5",
     "idx_runs_loop_created_id"),
    ("SELECT * FROM loop_runs WHERE status = 'x' AND {k} ORDER BY created_at DESC, id DESC LIMIT 5",
     "idx_runs_status_created_id"),
])
def test_a_page_after_a_cursor_seeks_in_its_index(conn: sqlite3.Connection, sql: str, index: str) -> None:
    """The keyset condition ``runs_page`` builds is the one planned here: a SEARCH on the index, no sort."""
    page = pages.runs_page(conn, cursor=pages.encode_cursor(("2026-01-01T00:00:03.000Z", "r07")), limit=3)
    assert [r["id"] for r in page.items] == ["r06", "r05", "r04"]
    plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql.format(k=pages.RUN_KEYSET), ("a", "b"))]
    assert plan == [f"SEARCH loop_runs USING INDEX {index} ({plan[0].split('(', 1)[1]}"]
    assert "(created_at,id)<(?,?)" in plan[0]
