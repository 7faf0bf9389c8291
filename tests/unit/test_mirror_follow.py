"""Feeding mirrors from the change stream: catch-up, rebuild, following with consumer groups (a follower removes the
consumers an earlier follower of its data dir left, reads its pending entries after every idle wait, and makes its
group again when it was destroyed)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.mirror import queries
from loopsq.mirror.apply import last_applied_id
from loopsq.mirror.follow import catch_up, follow, rebuild
from loopsq.mirror.schema import open_db
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.procs import hostname

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


def test_changes_the_mirror_applied_and_redis_then_lost_make_it_rebuild_to_what_redis_holds(
    client: redis.Redis, tmp_path: Path
) -> None:
    # As across a Sentinel failover: the mirror read a change from the old master, whose writes were discarded.
    store = LoopStore(client, KEYS)
    _make(store, "a")
    conn = open_db(tmp_path / "m.db")
    catch_up(client, KEYS, conn)
    loop_id = str(client.hget(KEYS.loop_names, "a"))
    before = client.get(KEYS.loop(loop_id))
    store.pause("a", T0 + timedelta(minutes=1))
    catch_up(client, KEYS, conn)
    assert [loop["status"] for loop in queries.list_loops(conn)] == ["paused"]
    (lost_id, _), = client.xrevrange(KEYS.changes, "+", "-", count=1)
    client.xdel(KEYS.changes, lost_id)
    client.set(KEYS.loop(loop_id), str(before))
    _make(store, "b", T0 + timedelta(minutes=2))  # the new master goes on
    catch_up(client, KEYS, conn)
    assert sorted((loop["name"], loop["status"]) for loop in queries.list_loops(conn)) == [
        ("a", "active"), ("b", "active")]


def test_two_mirrors_following_with_their_own_groups_each_receive_every_change(
    real_redis: redis.Redis, tmp_path: Path
) -> None:
    stop = threading.Event()
    paths = [tmp_path / "host1.db", tmp_path / "host2.db"]
    threads = []
    for path in paths:
        def run(p: Path = path) -> None:
            follow(redis.Redis(connection_pool=real_redis.connection_pool), KEYS, open_db(p), f"mirror:{p.stem}",
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
    assert set(groups) == {f"mirror:{p.stem}" for p in paths}
    assert all(g["pending"] == 0 for g in groups.values())


T = TypeVar("T")


def _wait(predicate: Callable[[], T], what: str, timeout: float = 10.0) -> T:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


@pytest.fixture
def following(real_redis: redis.Redis, tmp_path: Path) -> Iterator[Callable[[str], sqlite3.Connection]]:
    """``start(group)`` runs ``follow`` in a thread (50 ms blocks) on a mirror of its own; stopped afterwards."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(group: str) -> sqlite3.Connection:
        path = tmp_path / f"{len(threads)}.db"
        conn = open_db(path)  # made here first: two threads switching a new file to WAL at once may not wait

        def run() -> None:
            follow(redis.Redis(connection_pool=real_redis.connection_pool), KEYS, open_db(path), group, stop,
                   block_ms=50)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        return conn

    yield start
    stop.set()
    for thread in threads:
        thread.join(5)
    assert not any(t.is_alive() for t in threads)


def _consumers(client: redis.Redis, group: str) -> dict[str, dict[str, int]]:
    try:
        consumers = client.xinfo_consumers(KEYS.changes, group)
    except redis.ResponseError:  # NOGROUP: not made yet
        return {}
    return {str(c["name"]): {"pending": int(c["pending"]), "idle": int(c["idle"])} for c in consumers}


@pytest.mark.integration
def test_a_follower_removes_the_consumers_an_earlier_follower_of_its_data_dir_left_and_their_pending_entries(
    real_redis: redis.Redis, following: Callable[[str], sqlite3.Connection]
) -> None:
    _make(LoopStore(real_redis, KEYS), "a", T0)
    real_redis.xgroup_create(KEYS.changes, "mirror:kept", id="0-0")
    # The follower before, on the same disk under another host name, read the entry and died before acking it.
    real_redis.xreadgroup("mirror:kept", "old-dyno", {KEYS.changes: ">"}, count=10)
    assert _consumers(real_redis, "mirror:kept")["old-dyno"]["pending"] == 1
    conn = following("mirror:kept")
    _wait(lambda: list(_consumers(real_redis, "mirror:kept")) == [hostname()], "the old consumer to go")
    assert real_redis.xpending(KEYS.changes, "mirror:kept")["pending"] == 0
    _make(LoopStore(real_redis, KEYS), "b", T0)
    _wait(lambda: queries.count_loops(conn) == 2, "both loops in the mirror")


@pytest.mark.integration
def test_a_follower_on_a_quiet_stream_still_reads_as_live(
    real_redis: redis.Redis, following: Callable[[str], sqlite3.Connection]
) -> None:
    # Redis 7.0 refreshes a consumer's idle time only when a read finds its pending entries or new ones; a
    # follower of a deployment where nothing happens must not look gone (doctor, LOOPSQ_MIRROR_IDLE).
    _make(LoopStore(real_redis, KEYS), "a", T0)
    conn = following("mirror:quiet")
    _wait(lambda: queries.count_loops(conn) == 1 and hostname() in _consumers(real_redis, "mirror:quiet"),
          "the follower to read")
    time.sleep(0.8)
    assert _consumers(real_redis, "mirror:quiet")[hostname()]["idle"] < 400


@pytest.mark.integration
def test_a_follower_whose_group_was_destroyed_makes_it_again_and_follows_on(
    real_redis: redis.Redis, following: Callable[[str], sqlite3.Connection]
) -> None:
    _make(LoopStore(real_redis, KEYS), "a", T0)
    conn = following("mirror:gone")
    _wait(lambda: queries.count_loops(conn) == 1, "the first loop")
    _wait(lambda: hostname() in _consumers(real_redis, "mirror:gone"), "the follower to read")
    real_redis.xgroup_destroy(KEYS.changes, "mirror:gone")  # as doctor suggests for a group that looks idle
    _make(LoopStore(real_redis, KEYS), "b", T0)
    _wait(lambda: queries.count_loops(conn) == 2, "the loop made after the group was destroyed")
    _wait(lambda: "mirror:gone" in {g["name"] for g in real_redis.xinfo_groups(KEYS.changes)}, "the group again")
