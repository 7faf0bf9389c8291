"""Missed rows in the SQLite mirror: their streak columns, updates as they are extended, idempotent apply, no
run counted, and a backfill taking a missed slot without a stale-row eviction."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import to_iso
from loopsq.mirror import counters, queries
from loopsq.mirror.apply import apply_changes, last_applied_id
from loopsq.mirror.follow import catch_up, parse_entry
from loopsq.mirror.schema import column_names, open_db
from loopsq.state.backfills import claim_backfill
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, RunStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = Owner("worker:a", "host-a", 100)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.fixture
def client() -> Iterator[redis.Redis]:
    fake = fakeredis.FakeRedis(decode_responses=True)
    yield fake
    fake.close()


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    db = open_db(tmp_path / "mirror.db")
    yield db
    db.close()


def make_loop(client: redis.Redis) -> str:
    body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 60_000},
            "target": {"type": "command", "command": "true"}}
    return LoopStore(client, KEYS).create(new_loop(body, T0 - timedelta(minutes=1))).id


def stream(client: redis.Redis) -> list[dict[str, Any]]:
    return [parse_entry(i, f) for i, f in client.xrange(KEYS.changes)]


def test_the_mirror_gets_the_streak_columns(conn: sqlite3.Connection) -> None:
    columns = column_names(conn, "loop_runs")
    assert columns[-3:] == ["missed_last", "missed_count", "missed_kind"]
    ids = {r[0] for r in conn.execute("SELECT id FROM schema_migrations")}
    assert "0103_missed_slots" in ids


def test_a_missed_row_reaches_the_mirror_and_its_extension_updates_it(client: redis.Redis,
                                                                    conn: sqlite3.Connection) -> None:
    loop_id = make_loop(client)
    store = RunStore(client, KEYS)
    row = store.record_missed(loop_id, at(0), at(3), 4, "catch_up", "catch-up latest skipped it", at(4))
    assert row is not None
    catch_up(client, KEYS, conn)
    assert queries.get_run(conn, row.id) == row.to_dict()
    extended = store.record_missed(loop_id, at(4), at(9), 6, "catch_up", "catch-up none skipped it", at(10))
    assert extended is not None
    catch_up(client, KEYS, conn)
    assert queries.get_run(conn, row.id) == extended.to_dict()
    stored = conn.execute("SELECT scheduled_for, missed_last, missed_count, missed_kind, error, status FROM loop_runs "
                          "WHERE id = ?", (row.id,)).fetchone()
    assert tuple(stored) == (to_iso(at(0)), to_iso(at(9)), 10, "catch_up", "catch-up none skipped it", "missed")
    assert [r["id"] for r in queries.list_runs(conn, status="missed")] == [row.id]
    # A missed row is no attempt: the run counters (loopsq_runs_total) leave it out.
    assert counters.read(conn, counters.RUNS, per_loop=False) == []


def test_applying_the_missed_changes_again_changes_nothing(client: redis.Redis, conn: sqlite3.Connection) -> None:
    loop_id = make_loop(client)
    store = RunStore(client, KEYS)
    store.record_missed(loop_id, at(0), at(3), 4, "catch_up", "catch-up latest skipped it", at(4))
    store.record_missed(loop_id, at(4), at(5), 2, "catch_up", "catch-up latest skipped it", at(6))
    changes = stream(client)
    assert apply_changes(conn, changes) == len(changes)
    rows = [tuple(r) for r in conn.execute("SELECT * FROM loop_runs ORDER BY id")]
    last = last_applied_id(conn)
    assert apply_changes(conn, changes) == 0  # a replay, or a redelivery
    assert apply_changes(conn, changes[-1:]) == 0
    assert [tuple(r) for r in conn.execute("SELECT * FROM loop_runs ORDER BY id")] == rows
    assert last_applied_id(conn) == last


def test_a_backfill_of_missed_slots_reaches_the_mirror_without_evicting_anything(
        client: redis.Redis, conn: sqlite3.Connection, caplog: pytest.LogCaptureFixture) -> None:
    loop_id = make_loop(client)
    store = RunStore(client, KEYS)
    row = store.record_missed(loop_id, at(0), at(1), 2, "no_free_worker", "no free worker for 42s", at(4))
    assert row is not None
    catch_up(client, KEYS, conn)
    caplog.set_level(logging.WARNING, logger="loopsq.mirror.apply")
    first = claim_backfill(store, loop_id, at(0), OWNER, at(5))
    assert isinstance(first, Claim)
    catch_up(client, KEYS, conn)
    slots = dict(conn.execute("SELECT scheduled_for, id FROM loop_runs").fetchall())
    assert slots == {to_iso(at(0)): first.run.id, to_iso(at(1)): row.id}
    second = claim_backfill(store, loop_id, at(1), OWNER, at(6))  # its last slot: the row goes
    assert isinstance(second, Claim)
    catch_up(client, KEYS, conn)
    slots = dict(conn.execute("SELECT scheduled_for, id FROM loop_runs").fetchall())
    assert slots == {to_iso(at(0)): first.run.id, to_iso(at(1)): second.run.id}
    assert not [r for r in caplog.records if "evicting" in r.getMessage()]


def test_a_mirror_of_the_previous_version_gains_the_columns_in_place_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = open_db(path)
    for column in ("missed_last", "missed_count", "missed_kind"):
        db.execute(f"ALTER TABLE loop_runs DROP COLUMN {column}")
    db.execute("DELETE FROM schema_migrations WHERE id = '0103_missed_slots'")
    db.execute("INSERT INTO loop_runs (id, loop_id, loop_name, scheduled_for, attempt, status, created_at, updated_at)"
               " VALUES ('r1', 'l1', 'l', ?, 1, 'succeeded', ?, ?)", (to_iso(at(0)),) * 3)
    db.close()
    again = open_db(path)
    try:
        assert column_names(again, "loop_runs")[-3:] == ["missed_last", "missed_count", "missed_kind"]
        assert [r[0] for r in again.execute("SELECT id FROM loop_runs")] == ["r1"]
        assert again.execute("SELECT 1 FROM schema_migrations WHERE id = '0103_missed_slots'").fetchone()
    finally:
        again.close()
