"""Fleet-wide pools (``state.pools``): at most ``limit`` live holders, a fair queue, leases, definitions with their
change; each test on fakeredis and on a real redis-server (the ``client`` fixture)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import redis

from loopsq.errors import NotFoundError, ValidationError
from loopsq.sdk import LoopsClient
from loopsq.state.keys import Keys
from loopsq.state.pools import Acquired, Pool, PoolStore, Waiting

KEYS = Keys()
LEASE = 60_000


@pytest.fixture
def pools(client: redis.Redis) -> PoolStore:
    store = PoolStore(client, KEYS)
    store.set("acct", 2)
    return store


def take(pools: PoolStore, holder: str, pool: str = "acct") -> Acquired:
    got = pools.acquire(pool, holder, LEASE)
    assert isinstance(got, Acquired), (holder, got)
    return got


def waits(pools: PoolStore, holder: str, pool: str = "acct") -> Waiting:
    got = pools.acquire(pool, holder, LEASE)
    assert isinstance(got, Waiting), (holder, got)
    return got


def kill(client: redis.Redis, holder: str, pool: str = "acct") -> None:
    """What a dead worker's holder comes to: its lease lapses."""
    client.delete(KEYS.pool_lease(pool, holder))


def stop_asking(client: redis.Redis, waiter: str, pool: str = "acct") -> None:
    """What a waiter that stopped asking comes to: its last ask is older than the waiter TTL."""
    client.hset(KEYS.pool_seen(pool), waiter, 1)


def changes(client: redis.Redis) -> list[tuple[str, dict[str, object]]]:
    return [(f["type"], json.loads(f["data"])) for _id, f in client.xrange(KEYS.changes)]


# -- definitions ---------------------------------------------------------------------------------------------------
def test_set_creates_then_changes_a_pool_each_with_one_change_and_an_unchanged_limit_writes_nothing(
        client: redis.Redis) -> None:
    store = PoolStore(client, KEYS)
    assert store.set("claude-acct", 3) == Pool("claude-acct", 3)
    assert store.set("claude-acct", 5) == Pool("claude-acct", 5)
    assert store.set("claude-acct", 5) == Pool("claude-acct", 5)
    assert store.get("claude-acct") == Pool("claude-acct", 5)
    assert changes(client) == [
        ("pool_set", {"detail": {"pool": "claude-acct", "limit": 3, "previousLimit": None}}),
        ("pool_set", {"detail": {"pool": "claude-acct", "limit": 5, "previousLimit": 3}}),
    ]


def test_list_gives_every_pool_by_name_and_get_of_an_unknown_one_is_none(pools: PoolStore) -> None:
    pools.set("b.gpu", 1)
    pools.set("a:repo/web", 7)
    assert pools.list() == [Pool("a:repo/web", 7), Pool("acct", 2), Pool("b.gpu", 1)]
    assert pools.get("nope") is None
    assert pools.state("nope") is None


@pytest.mark.parametrize(("name", "limit", "message"), [
    ("acct", 0, "limit must be a positive integer, got 0"),
    ("acct", -1, "limit must be a positive integer, got -1"),
    ("acct", "3", 'limit must be a positive integer, got "3"'),
    ("acct", True, "limit must be a positive integer, got true"),
    ("acct", 2.5, "limit must be a positive integer, got 2.5"),
    ("acct", 10_001, "limit must be at most 10000, got 10001"),
    ("Acct", 1, 'pool name must be a label ([a-z0-9][a-z0-9._:/-]{0,63}), got "Acct"'),
    ("a b", 1, 'pool name must be a label ([a-z0-9][a-z0-9._:/-]{0,63}), got "a b"'),
    ("a|b", 1, 'pool name must be a label ([a-z0-9][a-z0-9._:/-]{0,63}), got "a|b"'),
    ("", 1, 'pool name must be a label ([a-z0-9][a-z0-9._:/-]{0,63}), got ""'),
    ("a" * 65, 1, f'pool name must be a label ([a-z0-9][a-z0-9._:/-]{{0,63}}), got "{"a" * 64}… (1 more characters)"'),
])
def test_a_bad_name_or_limit_is_refused_naming_the_field_and_writes_nothing(
        client: redis.Redis, name: str, limit: object, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        PoolStore(client, KEYS).set(name, limit)  # type: ignore[arg-type]
    assert caught.value.message == message
    assert client.keys("*") == []


def test_a_whole_float_limit_is_that_integer(client: redis.Redis) -> None:
    assert PoolStore(client, KEYS).set("acct", 3.0) == Pool("acct", 3)  # type: ignore[arg-type]


def test_delete_removes_every_key_of_the_pool_with_one_change(pools: PoolStore, client: redis.Redis) -> None:
    take(pools, "a")
    take(pools, "b")
    waits(pools, "c")
    assert pools.delete("acct") is True
    assert pools.delete("acct") is False
    assert sorted(client.keys("*")) == [KEYS.changes, KEYS.instance]
    assert [kind for kind, _ in changes(client)] == ["pool_set", "pool_deleted"]
    assert changes(client)[-1][1] == {"detail": {"pool": "acct", "limit": 2}}


def test_holders_of_a_deleted_pool_finish_undisturbed_and_an_acquire_finds_no_pool(
        pools: PoolStore, client: redis.Redis) -> None:
    held = take(pools, "a")
    pools.delete("acct")
    assert pools.renew("acct", "a", held.token, LEASE) is False
    assert pools.release("acct", "a", held.token) == []
    assert pools.acquire("acct", "b", LEASE) is None
    assert sorted(client.keys("*")) == [KEYS.changes, KEYS.instance]


# -- slots -----------------------------------------------------------------------------------------------------------
def test_a_pool_admits_up_to_its_limit_then_queues_in_order(pools: PoolStore) -> None:
    first, second = take(pools, "a"), take(pools, "b")
    assert first.token != second.token
    assert second.fence == first.fence + 1
    assert waits(pools, "c") == Waiting(position=0, holders=2, limit=2)
    assert waits(pools, "d") == Waiting(position=1, holders=2, limit=2)
    assert waits(pools, "c") == Waiting(position=0, holders=2, limit=2)  # asking again keeps the place


def test_acquire_of_an_unknown_pool_is_none_and_writes_nothing(client: redis.Redis) -> None:
    assert PoolStore(client, KEYS).acquire("nope", "a", LEASE) is None
    assert client.keys("*") == []


def test_a_resent_acquire_of_a_live_holder_returns_its_slot_marked_not_fresh(pools: PoolStore) -> None:
    held = take(pools, "a")
    assert held.fresh
    assert pools.acquire("acct", "a", LEASE) == replace(held, fresh=False)
    take(pools, "b")
    assert pools.acquire("acct", "a", LEASE) == replace(held, fresh=False)  # even when the pool is full


def test_a_second_fire_of_a_loop_whose_pooled_run_goes_on_waits_and_never_gives_that_slot_back(
    client: redis.Redis,
) -> None:
    """Two fires of one pooled loop race past the running-run read: the first holds the pool slot (under the
    loop's id) for its run; the second re-enters that hold. Its claim being refused, it gave the slot back: the
    run went on without it and a third loop took it (seen: a pool of 2 held 3 runs). Now it waits."""
    from datetime import UTC, datetime

    from loopsq.engine import pool_slots
    from loopsq.engine.runtime import Runtime

    sdk = LoopsClient(client=client)
    sdk.pool_set("acct", 1)
    loop = sdk.create({"name": "agent", "schedule": {"type": "interval", "everyMs": 1000}, "pool": "acct",
                       "target": {"type": "command", "command": "true"}})
    rt = Runtime(client=client, keys=KEYS, role="worker", worker_id="worker:a")
    now = datetime.now(UTC)
    first = pool_slots.take_for_slot(rt, loop, now, now)
    assert isinstance(first, pool_slots.PoolHold)
    second = pool_slots.take_for_slot(rt, loop, now, now)  # (its read of the loop's runs saw none yet)
    assert isinstance(second, Waiting)
    assert [h.holder for h in PoolStore(client, KEYS).state("acct").holders] == [loop.id]  # still held
    assert PoolStore(client, KEYS).acquire("acct", "another-loop", LEASE) == Waiting(0, 1, 1)


def test_the_first_waiter_gets_the_freed_slot_not_a_later_asker(pools: PoolStore) -> None:
    held = take(pools, "a")
    take(pools, "b")
    waits(pools, "w1")
    waits(pools, "w0")  # sorts before w1: the order is by first ask, not by id
    assert pools.release("acct", "a", held.token) == ["w1"]
    assert waits(pools, "w0") == Waiting(position=1, holders=1, limit=2)
    assert waits(pools, "late") == Waiting(position=2, holders=1, limit=2)
    assert isinstance(pools.acquire("acct", "w1", LEASE), Acquired)
    assert waits(pools, "w0") == Waiting(position=0, holders=2, limit=2)


def test_release_returns_the_head_waiters_up_to_the_free_slots(pools: PoolStore) -> None:
    a, b = take(pools, "a"), take(pools, "b")
    for waiter in ("w1", "w2", "w3"):
        waits(pools, waiter)
    assert pools.release("acct", "a", a.token) == ["w1"]
    assert pools.release("acct", "b", b.token) == ["w1", "w2"]
    pools.set("acct", 5)
    assert pools.release("acct", "b", b.token) == ["w1", "w2", "w3"]


def test_release_is_compare_and_delete(pools: PoolStore, client: redis.Redis) -> None:
    held = take(pools, "a")
    take(pools, "b")
    waits(pools, "c")
    assert pools.release("acct", "a", "not-the-token") == []
    assert pools.renew("acct", "a", held.token, LEASE) is True
    assert pools.release("acct", "a", held.token) == ["c"]
    assert client.exists(KEYS.pool_lease("acct", "a")) == 0
    assert pools.renew("acct", "a", held.token, LEASE) is False


def test_a_dead_holder_frees_its_slot(pools: PoolStore) -> None:
    take(pools, "a")
    held = take(pools, "b")
    waits(pools, "c")
    kill(pools.client, "a")
    assert isinstance(pools.acquire("acct", "c", LEASE), Acquired)
    assert pools.renew("acct", "b", held.token, LEASE) is True
    assert waits(pools, "d") == Waiting(position=0, holders=2, limit=2)
    assert [h.holder for h in pools.state("acct").holders] == ["b", "c"]  # type: ignore[union-attr]


def test_a_dead_holder_that_asks_again_queues_like_anyone(pools: PoolStore) -> None:
    take(pools, "a")
    take(pools, "b")
    waits(pools, "c")
    kill(pools.client, "a")
    assert waits(pools, "a") == Waiting(position=1, holders=1, limit=2)


def test_renew_extends_only_our_own_live_lease(pools: PoolStore, client: redis.Redis) -> None:
    held = take(pools, "a")
    lease = KEYS.pool_lease("acct", "a")
    client.pexpire(lease, 1_000)
    assert pools.renew("acct", "a", held.token, LEASE) is True
    assert client.pttl(lease) > 50_000
    assert client.pttl(KEYS.pool_holders("acct")) > 50_000
    assert pools.renew("acct", "a", "other", LEASE) is False
    assert pools.renew("acct", "nobody", held.token, LEASE) is False
    kill(client, "a")
    assert pools.renew("acct", "a", held.token, LEASE) is False
    assert client.exists(lease) == 0  # a lapsed lease is not re-made


def test_a_waiter_that_stops_asking_leaves_the_queue(pools: PoolStore, client: redis.Redis) -> None:
    a = take(pools, "a")
    take(pools, "b")
    waits(pools, "gone")
    waits(pools, "c")
    stop_asking(client, "gone")
    assert waits(pools, "c") == Waiting(position=0, holders=2, limit=2)
    assert client.zscore(KEYS.pool_waiters("acct"), "gone") is None
    assert pools.release("acct", "a", a.token) == ["c"]


def test_a_waiter_that_stopped_asking_and_asks_again_goes_to_the_back(pools: PoolStore, client: redis.Redis) -> None:
    take(pools, "a")
    take(pools, "b")
    waits(pools, "slow")
    waits(pools, "c")
    stop_asking(client, "slow")
    assert waits(pools, "slow") == Waiting(position=1, holders=2, limit=2)


def test_release_skips_waiters_that_stopped_asking(pools: PoolStore, client: redis.Redis) -> None:
    a = take(pools, "a")
    take(pools, "b")
    waits(pools, "gone")
    waits(pools, "c")
    stop_asking(client, "gone")
    assert pools.release("acct", "a", a.token) == ["c"]
    assert client.hget(KEYS.pool_seen("acct"), "gone") is None


def test_leave_stops_waiting(pools: PoolStore) -> None:
    take(pools, "a")
    take(pools, "b")
    waits(pools, "c")
    waits(pools, "d")
    pools.leave("acct", "c")
    assert waits(pools, "d") == Waiting(position=0, holders=2, limit=2)


def test_a_lowered_limit_lets_holders_finish_and_admits_nobody_until_under_it(pools: PoolStore) -> None:
    pools.set("acct", 3)
    held = [take(pools, name) for name in ("a", "b", "c")]
    pools.set("acct", 1)
    assert all(pools.renew("acct", name, h.token, LEASE) for name, h in zip("abc", held, strict=True))
    assert waits(pools, "w") == Waiting(position=0, holders=3, limit=1)
    assert pools.release("acct", "a", held[0].token) == []
    assert pools.release("acct", "b", held[1].token) == []
    assert waits(pools, "w") == Waiting(position=0, holders=1, limit=1)
    assert pools.release("acct", "c", held[2].token) == ["w"]
    assert isinstance(pools.acquire("acct", "w", LEASE), Acquired)


def test_a_raised_limit_admits_the_head_waiters_at_their_next_ask(pools: PoolStore) -> None:
    take(pools, "a")
    take(pools, "b")
    waits(pools, "c")
    waits(pools, "d")
    pools.set("acct", 3)
    assert waits(pools, "d") == Waiting(position=1, holders=2, limit=3)
    assert isinstance(pools.acquire("acct", "c", LEASE), Acquired)


def test_fences_only_grow_even_across_a_deleted_and_set_again_pool(pools: PoolStore) -> None:
    first = take(pools, "a")
    pools.delete("acct")
    pools.set("acct", 2)
    assert take(pools, "a").fence > first.fence


def test_holder_ids_are_opaque_strings(pools: PoolStore) -> None:
    odd = ["0f3a|2026-01-01T00:00:00.000Z", "step:run1:build", "x|1|2|3"]
    held = [take(pools, holder) for holder in odd[:2]]
    waits(pools, odd[2])
    assert pools.release("acct", odd[0], held[0].token) == [odd[2]]
    assert pools.renew("acct", odd[1], held[1].token, LEASE) is True
    assert isinstance(pools.acquire("acct", odd[2], LEASE), Acquired)


def test_bad_holder_or_lease_is_refused(pools: PoolStore) -> None:
    with pytest.raises(ValidationError, match='pool holder must be a non-empty string, got ""'):
        pools.acquire("acct", "", LEASE)
    with pytest.raises(ValidationError, match="lease_ms must be a positive integer, got 0"):
        pools.acquire("acct", "a", 0)


def test_an_asker_far_back_moves_up_as_the_waiters_ahead_that_stopped_asking_are_dropped(
        pools: PoolStore, client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("loopsq.state.pools.MAX_WALK", 2)  # one acquire looks at 2 waiters ahead at most
    pools.set("acct", 1)
    a = take(pools, "a")
    for waiter in ("w1", "w2", "w3", "w4"):
        waits(pools, waiter)
    assert waits(pools, "w5") == Waiting(position=4, holders=1, limit=1)
    for waiter in ("w1", "w2", "w3"):
        stop_asking(client, waiter)
    assert waits(pools, "w5") == Waiting(position=2, holders=1, limit=1)  # w1, w2 dropped; w3 not looked at yet
    assert waits(pools, "w5") == Waiting(position=1, holders=1, limit=1)  # w3 dropped; w4 still asks
    stop_asking(client, "w4")
    assert pools.release("acct", "a", a.token) == ["w5"]
    assert isinstance(pools.acquire("acct", "w5", LEASE), Acquired)
    assert client.exists(KEYS.pool_waiters("acct")) == 0


def test_release_names_every_waiter_a_large_raise_frees_in_queue_order(pools: PoolStore, client: redis.Redis) -> None:
    a = take(pools, "a")
    take(pools, "b")
    # 9,000 waiters (more values than Lua's unpack takes at once), written as acquire writes them.
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    waiters = [f"w{n:04}" for n in range(9_000, 0, -1)]
    client.zadd(KEYS.pool_waiters("acct"), {w: now_ms - 9_000 + i for i, w in enumerate(waiters)})
    client.hset(KEYS.pool_seen("acct"), mapping={w: now_ms for w in waiters})
    for waiter in waiters[:5] + waiters[250:260]:
        stop_asking(client, waiter)
    pools.set("acct", 10_000)
    assert pools.release("acct", "a", a.token) == waiters[5:250] + waiters[260:]


# -- memory --------------------------------------------------------------------------------------------------------
def test_every_pool_key_but_the_definition_and_fence_has_a_ttl_or_goes_when_empty(
        pools: PoolStore, client: redis.Redis) -> None:
    a = take(pools, "a")
    take(pools, "b")
    waits(pools, "c")
    for key in (KEYS.pool_holders("acct"), KEYS.pool_waiters("acct"), KEYS.pool_seen("acct"),
                KEYS.pool_lease("acct", "a")):
        assert client.pttl(key) > 0, key
    assert client.pttl(KEYS.pool_waiters("acct")) <= 30_000
    pools.release("acct", "a", a.token)
    pools.acquire("acct", "c", LEASE)
    pools.leave("acct", "c")
    left = {key for key in client.keys("*") if client.pttl(key) < 0}
    assert left == {KEYS.pools, KEYS.pool_fence("acct"), KEYS.changes, KEYS.instance}


# -- state ---------------------------------------------------------------------------------------------------------
def test_state_lists_live_holders_by_fence_and_waiters_still_asking_by_position(
        pools: PoolStore, client: redis.Redis) -> None:
    a = take(pools, "a")
    b = take(pools, "b")
    for waiter in ("w1", "gone", "w2"):
        waits(pools, waiter)
    stop_asking(client, "gone")
    state = pools.state("acct")
    assert state is not None
    assert state.pool == Pool("acct", 2)
    assert [(h.holder, h.fence) for h in state.holders] == [("a", a.fence), ("b", b.fence)]
    assert all(0 < h.expires_in_ms <= LEASE for h in state.holders)
    assert [(w.holder, w.position) for w in state.waiters] == [("w1", 0), ("w2", 1)]
    assert state.summary() == {"name": "acct", "limit": 2, "inUse": 2, "waiting": 2}
    body = state.to_dict()
    assert set(body["holders"][0]) == {"holder", "fence", "since", "expiresInMs"}
    assert set(body["waiters"][0]) == {"holder", "position", "since", "lastAskedAt"}
    kill(client, "a")
    assert [h.holder for h in pools.state("acct").holders] == ["b"]  # type: ignore[union-attr]


# -- the SDK -------------------------------------------------------------------------------------------------------
def test_the_sdk_sets_lists_shows_and_deletes_pools(client: redis.Redis) -> None:
    sdk = LoopsClient(client=client)
    assert sdk.pool_set("claude-acct", 3) == Pool("claude-acct", 3)
    assert sdk.pools() == [Pool("claude-acct", 3)]
    assert sdk.pool("claude-acct").summary() == {"name": "claude-acct", "limit": 3, "inUse": 0, "waiting": 0}
    with pytest.raises(ValidationError, match="limit must be a positive integer, got 0"):
        sdk.pool_set("claude-acct", 0)
    sdk.pool_delete("claude-acct")
    for call in (sdk.pool, sdk.pool_delete):
        with pytest.raises(NotFoundError, match="pool not found: claude-acct"):
            call("claude-acct")
