"""The versioned state (issue #28): what layout a Redis holds, the refusal lines, the stamp, and ``loopsq migrate``
from a hand-built layout-1 state (0.1.0's keys, as commit 9923ab3 wrote them), on fakeredis and a real server."""

from __future__ import annotations

import json
import sqlite3
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis

from loopsq.state import layout, migrations, run_codec
from loopsq.state.keys import Keys
from loopsq.state.layout import Layout, StateLayoutError

KEYS = Keys()


def _snapshot(client: redis.Redis) -> dict[str, Any]:
    """Every key with its type, content (strings undecoded) and TTL, to show that nothing changed."""
    out: dict[str, Any] = {}
    for key in sorted(client.keys("*")):
        kind = client.type(key)
        if kind == "string":
            value: Any = run_codec.read(client, key)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "set":
            value = sorted(client.smembers(key))
        else:
            value = client.zrange(key, 0, -1, withscores=True)
        out[key] = (kind, value, client.ttl(key))
    return out


# -- reading the layout --------------------------------------------------------------------------------------
def test_an_empty_redis_or_one_of_another_product_holds_no_loopsq_layout(client: redis.Redis) -> None:
    assert layout.read(client, KEYS) == Layout(layout.EMPTY, layout.EMPTY, False)
    client.set("celery:task:1", "x")
    client.set("loopsqx:loop:1", "x")  # another namespace, not ours
    assert layout.read(client, KEYS).version == layout.EMPTY


def test_unstamped_state_is_v1_with_a_slot_key_else_v2(client: redis.Redis) -> None:
    client.sadd(KEYS.loops, "l1")
    assert layout.read(client, KEYS) == Layout(2, 2, False)
    client.set("loopsq:slot:l1:2026-01-01T00:00:00.000Z", "r1")
    assert layout.read(client, KEYS) == Layout(1, 1, False)


def test_a_writer_does_not_stamp_unstamped_state_beside_a_live_process_of_a_release_before_versioning(
    client: redis.Redis,
) -> None:
    """A 0.1.0 deployment that has run no slot yet holds no slot key: its live processes (liveness records that
    name no layout) say it is not today's, so today's worker must not stamp v2 and run beside them."""
    client.sadd(KEYS.loops, "l1")
    client.set("loopsq:worker:vm:41:abc", '{"id": "worker:vm:41:abc", "role": "worker"}', px=60_000)
    client.set("loopsq:scheduler:vm:40:new", '{"id": "scheduler:vm:40:new", "layout": 2}', px=60_000)
    assert layout.read(client, KEYS) == Layout(2, 2, False)  # (a reader may read it: nothing is written)
    with pytest.raises(StateLayoutError) as refused:
        layout.check(client, KEYS, writer=True)
    assert (refused.value.message, refused.value.exit_code) == (
        "1 loopsq process(es) of a release from before versioned state are live on this Redis (worker:vm:41:abc); "
        "stop them, then start this release", 2)
    assert client.exists(KEYS.meta) == 0
    client.delete("loopsq:worker:vm:41:abc")
    assert layout.check(client, KEYS, writer=True).version == 2
    assert client.hgetall(KEYS.meta) == {"layout": "2", "readableFrom": "2"}


def test_a_stamped_state_says_its_layout_and_what_can_read_it(client: redis.Redis) -> None:
    client.hset(KEYS.meta, mapping={"layout": "4", "readableFrom": "3"})
    assert layout.read(client, KEYS) == Layout(4, 3, True)
    client.hset(KEYS.meta, "migratingTo", "5")
    assert layout.read(client, KEYS) == Layout(4, 3, True, 5)


@pytest.mark.parametrize(("found", "refusal"), [
    (Layout(0, 0, False), None),
    (Layout(2, 2, True), None),
    (Layout(3, 2, True), None),  # newer, but kept readable by this release
    (Layout(3, 3, True), "this Redis holds loopsq state v3; this loopsq reads v2: upgrade it"),
    (Layout(1, 1, False), "this Redis holds loopsq state v1; this loopsq reads v2: run `loopsq migrate` "
                          "(a scheduler does at its start)"),
    (Layout(1, 1, True, 2), "this Redis holds loopsq state v1 being migrated to v2; this loopsq reads v2: "
                            "wait for `loopsq migrate` to finish"),
])
def test_refusal_lines(found: Layout, refusal: str | None) -> None:
    assert found.refusal() == refusal


def test_reads_spells_a_range_when_a_release_reads_older_layouts() -> None:
    assert layout.reads(2) == "v2"
    assert layout.reads(4) == "v2-v4"


def test_a_writer_stamps_an_empty_or_unstamped_current_state_and_a_reader_does_not(client: redis.Redis) -> None:
    assert layout.check(client, KEYS).version == layout.EMPTY
    assert client.exists(KEYS.meta) == 0
    assert layout.check(client, KEYS, writer=True) == Layout(2, 2, True)
    assert client.hgetall(KEYS.meta) == {"layout": "2", "readableFrom": "2"}


def test_a_writer_never_overwrites_a_stamp_and_refuses_a_newer_state(client: redis.Redis) -> None:
    client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "3"})
    with pytest.raises(StateLayoutError) as refused:
        layout.check(client, KEYS, writer=True)
    assert refused.value.message == "this Redis holds loopsq state v3; this loopsq reads v2: upgrade it"
    assert client.hgetall(KEYS.meta) == {"layout": "3", "readableFrom": "3"}


# -- migrate v1 -> v2 ------------------------------------------------------------------------------------------
def _v1_run(run_id: str, loop_id: str, slot: str, status: str, attempt: int = 1) -> str:
    row = {"id": run_id, "loopId": loop_id, "loopName": "l", "scheduledFor": slot, "attempt": attempt,
           "status": status, "createdAt": slot, "updatedAt": slot, "stdout": "x" * 600, "stderr": "",
           "source": "scheduled"}
    return json.dumps(row, separators=(",", ":"))


def _v1_state(client: redis.Redis, slots: int = 5) -> list[str]:
    """A 0.1.0 state: an active loop with ``slots`` settled runs (one key per slot, JSON rows), a running run,
    a pending retry's failed attempt 1 and its claim. Returns the slots."""
    loop = {"id": "l1", "name": "l", "status": "active", "retryScheduledFor": "2026-01-01T00:00:00.000Z",
            "expiresAt": "2027-01-01T00:00:00.000Z", "maxAttempts": 3}
    client.set(KEYS.loop("l1"), json.dumps(loop))
    client.sadd(KEYS.loops, "l1")
    client.set(KEYS.loop("l2"), json.dumps({"id": "l2", "name": "p", "status": "paused"}))
    client.sadd(KEYS.loops, "l2")
    at = [f"2026-01-01T00:00:{i:02d}.000Z" for i in range(slots)]
    for i, slot in enumerate(at):
        status = "failed" if i == 0 else "succeeded"
        client.set(KEYS.run(f"r{i}"), _v1_run(f"r{i}", "l1", slot, status))
        client.set(f"loopsq:slot:l1:{slot}", f"r{i}")
        client.zadd(KEYS.loop_runs("l1"), {f"r{i}": i})
    client.set(KEYS.claim("l1", at[0], 1), "token", ex=1000)
    client.set(KEYS.run("rr"), _v1_run("rr", "l1", "2026-01-02T00:00:00.000Z", "running"))
    client.set("loopsq:slot:l1:2026-01-02T00:00:00.000Z", "rr")
    client.sadd(KEYS.loop_run_workflows("rr"), "w1")  # (a ``run:<id>:...`` key is no row)
    return at


def test_migrate_moves_slots_compresses_settled_rows_keeps_claims_and_stamps(client: redis.Redis) -> None:
    at = _v1_state(client)
    lines: list[str] = []
    report = migrations.migrate(client, KEYS, say=lines.append)
    assert (report.start, report.end) == (1, 2)
    assert lines == ["v1 -> v2: moved 6 slot keys into 1 loops' slot hashes, compressed 5 settled JSON rows, "
                     "indexed 1 active loops for maintenance, stamped layout v2"]
    assert client.keys("loopsq:slot:*") == []
    assert client.hgetall(KEYS.slots("l1")) == {**{s: f"r{i}" for i, s in enumerate(at)},
                                                "2026-01-02T00:00:00.000Z": "rr"}
    stored = run_codec.read(client, KEYS.run("r1"))
    assert isinstance(stored, bytes)
    assert zlib.decompressobj(zdict=run_codec.ZDICT_V1).decompress(stored).decode() == _v1_run(
        "r1", "l1", at[1], "succeeded")
    assert run_codec.decode(stored).status == "succeeded"
    assert run_codec.read(client, KEYS.run("rr")) == _v1_run("rr", "l1", "2026-01-02T00:00:00.000Z", "running")
    assert client.get(KEYS.claim("l1", at[0], 1)) == "token"
    assert 0 < client.ttl(KEYS.claim("l1", at[0], 1)) <= 1000
    assert client.zrange(KEYS.loop_watch, 0, -1) == ["l1"]  # (the paused one is not watched)
    assert client.zrange(KEYS.loop_expiry, 0, -1) == ["l1"]
    assert client.hgetall(KEYS.meta) == {"layout": "2", "readableFrom": "2"}
    assert layout.check(client, KEYS) == Layout(2, 2, True)
    again: list[str] = []
    migrations.migrate(client, KEYS, say=again.append)
    assert again == ["state is v2: nothing to migrate"]


def test_a_dry_run_says_what_would_change_and_changes_nothing(client: redis.Redis) -> None:
    _v1_state(client)
    before = _snapshot(client)
    lines: list[str] = []
    migrations.migrate(client, KEYS, dry_run=True, say=lines.append)
    assert lines == ["v1 -> v2: would move 6 slot keys into 1 loops' slot hashes, would compress 5 settled JSON "
                     "rows, would index 1 active loops for maintenance, would stamp layout v2"]
    assert _snapshot(client) == before
    assert run_codec.read(client, KEYS.run("r1")) == _v1_run("r1", "l1", "2026-01-01T00:00:01.000Z", "succeeded")


def test_a_migration_killed_half_way_is_resumed_by_running_it_again(client: redis.Redis,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    at = _v1_state(client, slots=7)
    monkeypatch.setattr(migrations, "BATCH", 2)
    kept = {"n": 0}

    def dies_after_one_batch(self: object) -> None:
        kept["n"] += 1
        if kept["n"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(migrations._Lock, "keep", dies_after_one_batch)
    with pytest.raises(KeyboardInterrupt):
        migrations.migrate(client, KEYS)
    assert 0 < len(client.keys("loopsq:slot:*")) < 8
    assert client.hget(KEYS.meta, "migratingTo") == "2"  # every versioned process refuses the half-way state
    assert layout.read(client, KEYS).refusal() is not None
    monkeypatch.undo()
    migrations.migrate(client, KEYS)
    assert client.keys("loopsq:slot:*") == []
    assert len(client.hgetall(KEYS.slots("l1"))) == 8
    assert [run_codec.load(client, KEYS.run(f"r{i}")).scheduled_for for i in range(7)] == at  # type: ignore[union-attr]
    assert client.hgetall(KEYS.meta) == {"layout": "2", "readableFrom": "2"}


def test_migrate_refuses_an_empty_redis_another_products_and_a_newer_layout(client: redis.Redis) -> None:
    with pytest.raises(StateLayoutError) as empty:
        migrations.migrate(client, KEYS)
    assert empty.value.message == "this Redis holds no loopsq state under 'loopsq:': nothing to migrate"
    client.set("celery:task:1", "x")
    with pytest.raises(StateLayoutError) as other:
        migrations.migrate(client, KEYS)
    assert other.value.message == ("this Redis holds no loopsq state under 'loopsq:' (it holds 1 other keys): "
                                   "nothing to migrate")
    client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "3"})
    with pytest.raises(StateLayoutError) as newer:
        migrations.migrate(client, KEYS)
    assert newer.value.message == "this Redis holds loopsq state v3; this loopsq reads v2: upgrade it"
    assert sorted(client.keys("*")) == ["celery:task:1", KEYS.meta]
    assert client.hgetall(KEYS.meta) == {"layout": "3", "readableFrom": "3"}


def test_migrate_refuses_while_a_process_is_live_or_another_migrate_holds_the_lock(client: redis.Redis) -> None:
    _v1_state(client)
    client.set(KEYS.worker("worker:h:1:abc"), "{}", px=5000)
    with pytest.raises(StateLayoutError) as live:
        migrations.migrate(client, KEYS)
    assert live.value.message == ("1 loopsq process(es) are live on this Redis (worker:worker:h:1:abc); stop every "
                                  "0.1.0 scheduler and worker before migrating from v1")
    client.delete(KEYS.worker("worker:h:1:abc"))
    client.set(KEYS.migrate_lock, "other", px=5000)
    with pytest.raises(StateLayoutError) as locked:
        migrations.migrate(client, KEYS)
    assert locked.value.message == ("another `loopsq migrate` is moving this state now (its lock loopsq:migrate-lock "
                                    "is held); wait for it")
    assert len(client.keys("loopsq:slot:*")) == 6
    assert client.exists(KEYS.meta) == 0


def test_an_unstamped_current_state_is_only_stamped(client: redis.Redis) -> None:
    client.sadd(KEYS.loops, "l1")
    lines: list[str] = []
    migrations.migrate(client, KEYS, dry_run=True, say=lines.append)
    assert client.exists(KEYS.meta) == 0
    migrations.migrate(client, KEYS, say=lines.append)
    assert lines == ["state is v2: nothing to migrate (would stamp v2)", "state is v2: nothing to migrate (stamped v2)"]
    assert client.hgetall(KEYS.meta) == {"layout": "2", "readableFrom": "2"}


# -- the mirror ----------------------------------------------------------------------------------------------
def test_the_mirror_is_stamped_and_a_newer_one_refused(tmp_path: Path) -> None:
    from loopsq.mirror.schema import open_db

    path = tmp_path / "loops.db"
    open_db(path).close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == layout.LAYOUT
        conn.execute("PRAGMA user_version = 3")
    with pytest.raises(StateLayoutError) as newer:
        open_db(path)
    assert newer.value.message == f"the mirror {path} holds loopsq state v3; this loopsq reads v2: upgrade it"
    assert newer.value.exit_code == 2
