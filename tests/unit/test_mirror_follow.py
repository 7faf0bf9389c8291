"""Feeding mirrors from the change stream: catch-up, rebuild, following with consumer groups."""

from __future__ import annotations

import sqlite3
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.mirror import queries
from loopsq.mirror.apply import last_applied_id
from loopsq.mirror.follow import catch_up, follow, mirror_id, rebuild
from loopsq.mirror.schema import open_db
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.workflows import WorkflowStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _make(store: LoopStore, name: str, at: datetime = T0) -> None:
    body = {"name": name, "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 10_000},
            "target": {"type": "command", "command": "true"}}
    store.create(new_loop(body, at))


def _rows(conn: sqlite3.Connection) -> dict[str, list[tuple[Any, ...]]]:
    tables = ["loops", "loop_runs", "workflow_specs", "workflow_runs", "workflow_step_runs", "workflow_events"]
    return {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY id")] for t in tables}


def _busy_history(client: redis.Redis) -> None:
    loops, wfs = LoopStore(client, KEYS), WorkflowStore(client, KEYS)
    for i in range(5):
        _make(loops, f"loop-{i}", T0 + timedelta(seconds=i))
    loops.pause("loop-1", T0 + timedelta(minutes=1))
    loops.stop("loop-2", T0 + timedelta(minutes=2))
    loops.resume("loop-2", T0 + timedelta(minutes=3))
    loops.remove("loop-3", T0 + timedelta(minutes=4))
    body = {"name": "wf", "version": 1, "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}
    first = wfs.create(body, T0)
    wfs.archive(first["id"], T0 + timedelta(minutes=5))
    wfs.create(body, T0 + timedelta(minutes=6))


def test_a_new_mirror_starts_from_a_rebuild_then_applies_each_later_change_once(
    client: redis.Redis, tmp_path: Path
) -> None:
    _make(LoopStore(client, KEYS), "first")
    conn = open_db(tmp_path / "m.db")
    assert catch_up(client, KEYS, conn) == 1  # the rebuild
    before = client.xlen(KEYS.changes)
    _busy_history(client)
    assert catch_up(client, KEYS, conn) == client.xlen(KEYS.changes) - before
    assert catch_up(client, KEYS, conn) == 0
    names = [loop["name"] for loop in queries.list_loops(conn)]
    assert sorted(names) == ["first", "loop-0", "loop-1", "loop-2", "loop-4"]
    assert queries.find_loop(conn, "loop-2")["status"] == "active"  # type: ignore[index]
    assert [w["status"] for w in queries.list_workflows(conn, status=None)] != []


def test_a_rebuild_from_redis_alone_gives_the_same_rows_as_following(client: redis.Redis, tmp_path: Path) -> None:
    _busy_history(client)
    followed = open_db(tmp_path / "followed.db")
    catch_up(client, KEYS, followed)
    rebuilt = open_db(tmp_path / "rebuilt.db")
    rebuild(client, KEYS, rebuilt)
    assert _rows(rebuilt) == _rows(followed)
    assert last_applied_id(rebuilt) == last_applied_id(followed)


def test_a_rebuild_of_a_populated_mirror_drops_rows_redis_no_longer_has(client: redis.Redis, tmp_path: Path) -> None:
    _busy_history(client)
    conn = open_db(tmp_path / "m.db")
    catch_up(client, KEYS, conn)
    conn.execute("INSERT INTO loops (id, name, status, schedule_json, target_json, catch_up, catch_up_limit, "
                 "overlap, max_attempts, retry_delay_ms, lease_ms, created_at, updated_at) VALUES "
                 "('stray', 'stray', 'active', '{}', '{}', 'none', 1, 'skip', 1, 1, 1, 'x', 'x')")
    rebuild(client, KEYS, conn)
    assert queries.get_loop(conn, "stray") is None
    assert len(queries.list_loops(conn)) == 4


def test_a_flushed_redis_makes_the_mirror_rebuild_instead_of_mixing_datasets(
    client: redis.Redis, tmp_path: Path
) -> None:
    _busy_history(client)
    conn = open_db(tmp_path / "m.db")
    catch_up(client, KEYS, conn)
    client.flushall()
    _make(LoopStore(client, KEYS), "fresh")
    catch_up(client, KEYS, conn)
    assert [loop["name"] for loop in queries.list_loops(conn)] == ["fresh"]


def test_a_stream_trimmed_past_the_mirror_triggers_a_rebuild(client: redis.Redis, tmp_path: Path) -> None:
    store = LoopStore(client, KEYS)
    _make(store, "a")
    conn = open_db(tmp_path / "m.db")
    catch_up(client, KEYS, conn)
    for name in ("b", "c", "d"):
        _make(store, name)
    client.xtrim(KEYS.changes, maxlen=1, approximate=False)
    catch_up(client, KEYS, conn)
    assert sorted(loop["name"] for loop in queries.list_loops(conn)) == ["a", "b", "c", "d"]


def test_two_mirrors_following_with_their_own_groups_each_receive_every_change(
    real_redis: redis.Redis, tmp_path: Path
) -> None:
    stop = threading.Event()
    paths = [tmp_path / "host1.db", tmp_path / "host2.db"]
    threads = []
    for path in paths:
        def run(p: Path = path) -> None:
            follow(redis.Redis(connection_pool=real_redis.connection_pool), KEYS, open_db(p), mirror_id(str(p)),
                   stop, block_ms=50)
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
    store = LoopStore(real_redis, KEYS)
    for i in range(30):
        _make(store, f"l{i}")
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline:
            counts = [queries.count_loops(open_db(p)) for p in paths]
            if counts == [30, 30]:
                break
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert counts == [30, 30]
    groups = {g["name"]: g for g in real_redis.xinfo_groups(KEYS.changes)}
    assert set(groups) == {mirror_id(str(p)) for p in paths}
    assert all(g["pending"] == 0 for g in groups.values())
