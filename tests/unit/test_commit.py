"""The transition script: guards first, then writes and exactly one change; all or nothing."""

from __future__ import annotations

import json

import redis

from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys

KEYS = Keys()


def _changes(client: redis.Redis) -> list[tuple[str, dict[str, str]]]:
    return [(i, dict(f)) for i, f in client.xrange(KEYS.changes)]


def test_a_commit_applies_every_write_and_appends_exactly_one_change(client: redis.Redis) -> None:
    tx = (
        Tx("thing_created", "2026-01-01T00:00:00.000Z")
        .set("k1", "v1")
        .sadd("s", "a")
        .hset("h", "f", "x")
        .zadd("z", 1.5, "m")
        .put("loops", {"id": "abc"})
    )
    result = Committer(client, KEYS).commit(tx)
    assert result.ok and result.change_id
    assert client.get("k1") == "v1"
    assert client.smembers("s") == {"a"}
    assert client.hget("h", "f") == "x"
    assert client.zscore("z", "m") == 1.5
    changes = _changes(client)
    assert len(changes) == 1
    change_id, fields = changes[0]
    assert change_id == result.change_id
    assert fields["type"] == "thing_created"
    assert fields["at"] == "2026-01-01T00:00:00.000Z"
    assert json.loads(fields["data"]) == {"upsert": {"loops": [{"id": "abc"}]}}


def test_a_failed_guard_writes_nothing_and_appends_no_change(client: redis.Redis) -> None:
    client.set("k", "current")
    tx = Tx("x", "t").set("other", "1").expect("k", "stale").set("k", "new")
    result = Committer(client, KEYS).commit(tx)
    assert not result.ok
    assert result.failed_guard == 1
    assert client.get("k") == "current"
    assert client.get("other") is None
    assert client.exists(KEYS.changes) == 0


def test_expect_none_means_the_key_must_not_exist(client: redis.Redis) -> None:
    committer = Committer(client, KEYS)
    assert committer.commit(Tx("a", "t").expect("k", None).set("k", "1")).ok
    assert not committer.commit(Tx("a", "t").expect("k", None).set("k", "2")).ok
    assert client.get("k") == "1"


def test_hash_field_guards_compare_one_field(client: redis.Redis) -> None:
    committer = Committer(client, KEYS)
    assert committer.commit(Tx("a", "t").expect_field("names", "n", None).hset("names", "n", "id1")).ok
    assert not committer.commit(Tx("a", "t").expect_field("names", "n", None).hset("names", "n", "id2")).ok
    assert committer.commit(Tx("a", "t").expect_field("names", "n", "id1").hdel("names", "n")).ok
    assert client.hget("names", "n") is None


def test_expect_absent_and_a_ttl_write_make_a_set_nx_claim(client: redis.Redis) -> None:
    committer = Committer(client, KEYS)
    claim = "claim:loop:slot:1"
    assert committer.commit(Tx("claimed", "t").expect_absent(claim).set(claim, "tok", px=60_000)).ok
    assert not committer.commit(Tx("claimed", "t").expect_absent(claim).set(claim, "tok2", px=60_000)).ok
    assert client.get(claim) == "tok"
    assert 0 < client.pttl(claim) <= 60_000


def test_every_commit_stamps_a_stable_instance_id(client: redis.Redis) -> None:
    committer = Committer(client, KEYS)
    committer.commit(Tx("a", "t").set("x", "1"))
    first = client.get(KEYS.instance)
    committer.commit(Tx("b", "t").set("x", "2"))
    assert first and len(first) == 24
    assert client.get(KEYS.instance) == first


def test_deletes_and_removals_are_recorded_in_the_change(client: redis.Redis) -> None:
    client.set("gone", "1")
    client.sadd("s", "a")
    tx = Tx("removed", "t").delete_key("gone").srem("s", "a").drop("loops", "abc")
    assert Committer(client, KEYS).commit(tx).ok
    assert client.exists("gone") == 0 and client.smembers("s") == set()
    (_, fields), = _changes(client)
    assert json.loads(fields["data"]) == {"delete": {"loops": ["abc"]}}
