"""Fleet-wide pools on a real redis-server, with threads racing and real time passing: the limit holds under
concurrent acquire/release, waiting is FIFO, lapsed leases free slots, renewals keep them, and waiters that stop
asking (and their keys) go."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from loopsq.state.keys import Keys
from loopsq.state.pools import Acquired, PoolStore, Waiting

pytestmark = pytest.mark.integration

KEYS = Keys()

#: Counts the live holders of a pool in one atomic step (a lease key still holding the holder's token).
_LIVE = """
local live = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local lease, token = string.match(all[i + 1], '^(.*)|([^|]*)|%d+|%d+$')
  if lease and redis.call('GET', lease) == token then live = live + 1 end
end
return live
"""


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_never_more_live_holders_than_the_limit_with_many_threads_racing(real_redis: redis.Redis) -> None:
    PoolStore(real_redis, KEYS).set("acct", 2)
    threads, rounds = 6, 40
    stop = threading.Event()
    lock = threading.Lock()
    holding = [0]
    seen_in_python: list[int] = []
    seen_in_redis: list[int] = []
    errors: list[BaseException] = []
    count_live = real_redis.register_script(_LIVE)

    def sample() -> None:
        while not stop.is_set():
            seen_in_redis.append(int(count_live(keys=[KEYS.pool_holders("acct")])))

    def work(n: int) -> None:
        # Each thread its own store and connection pool, as separate workers would have.
        client = redis.Redis(connection_pool=redis.ConnectionPool(**real_redis.connection_pool.connection_kwargs))
        store = PoolStore(client, KEYS)
        try:
            for i in range(rounds):
                holder = f"t{n}|{i}"
                while not isinstance(got := store.acquire("acct", holder, 10_000), Acquired):
                    assert isinstance(got, Waiting) and got.limit == 2
                    time.sleep(0.001)
                with lock:
                    holding[0] += 1
                    seen_in_python.append(holding[0])
                time.sleep(0.002)
                with lock:
                    holding[0] -= 1
                store.release("acct", holder, got.token)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
        finally:
            client.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stop.set()
    sampler.join()
    assert errors == []
    assert len(seen_in_python) == threads * rounds
    assert max(seen_in_redis) <= 2, "Redis saw more live holders than the limit"
    assert max(seen_in_python) <= 2, "more threads than the limit held a slot at once"
    assert max(seen_in_python) == 2  # the pool was full at times: the race was real
    assert len(seen_in_redis) > 100
    assert real_redis.exists(KEYS.pool_holders("acct")) == 0


@pytest.mark.timeout(30)
def test_each_freed_slot_goes_to_the_earliest_waiter_whoever_asks_first(real_redis: redis.Redis) -> None:
    store = PoolStore(real_redis, KEYS)
    store.set("acct", 1)
    held = store.acquire("acct", "first", 10_000)
    assert isinstance(held, Acquired)
    holder = "first"
    order = [f"w{n}" for n in (5, 3, 9, 1, 7)]
    for waiter in order:
        assert isinstance(store.acquire("acct", waiter, 10_000), Waiting)
    admitted = []
    for _ in order:
        woken = store.release("acct", holder, held.token)
        assert woken == [order[len(admitted)]]
        for waiter in reversed([w for w in order if w not in admitted]):  # the latest asks first
            got = store.acquire("acct", waiter, 10_000)
            if isinstance(got, Acquired):
                admitted.append(waiter)
                holder, held = waiter, got
    assert admitted == order


@pytest.mark.timeout(30)
def test_a_lapsed_lease_frees_its_slot_and_a_renewed_one_keeps_it(real_redis: redis.Redis) -> None:
    store = PoolStore(real_redis, KEYS)
    store.set("acct", 2)
    kept = store.acquire("acct", "kept", 300)
    lapsed = store.acquire("acct", "lapsed", 300)
    assert isinstance(kept, Acquired) and isinstance(lapsed, Acquired)
    assert isinstance(store.acquire("acct", "next", 300), Waiting)
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:  # four lease lengths: only the renewals keep "kept"
        assert store.renew("acct", "kept", kept.token, 300) is True
        got = store.acquire("acct", "next", 300)
        if isinstance(got, Acquired):
            break
        time.sleep(0.05)
    assert isinstance(got, Acquired)
    assert store.renew("acct", "lapsed", lapsed.token, 300) is False
    assert store.renew("acct", "kept", kept.token, 300) is True
    assert isinstance(store.acquire("acct", "later", 300), Waiting)


@pytest.mark.timeout(30)
def test_a_waiter_that_stops_asking_leaves_and_the_queue_keys_expire(real_redis: redis.Redis) -> None:
    store = PoolStore(real_redis, KEYS, waiter_ttl_ms=300)
    store.set("acct", 1)
    held = store.acquire("acct", "holder", 10_000)
    assert isinstance(held, Acquired)
    assert store.acquire("acct", "quitter", 10_000) == Waiting(0, 1, 1)
    asker_started = time.monotonic()
    while time.monotonic() - asker_started < 0.6:  # "asker" keeps asking, "quitter" has stopped
        got = store.acquire("acct", "asker", 10_000)
        time.sleep(0.05)
    assert got == Waiting(0, 1, 1)
    assert store.release("acct", "holder", held.token) == ["asker"]
    eventually(lambda: real_redis.exists(KEYS.pool_waiters("acct"), KEYS.pool_seen("acct")) == 0, timeout=3)


@pytest.mark.timeout(30)
def test_a_lowered_limit_holds_under_racing_askers(real_redis: redis.Redis) -> None:
    store = PoolStore(real_redis, KEYS)
    store.set("acct", 4)
    held = {h: store.acquire("acct", h, 10_000) for h in ("a", "b", "c", "d")}
    store.set("acct", 2)
    results: list[object] = []

    def ask(n: int) -> None:
        results.append(PoolStore(real_redis, KEYS).acquire("acct", f"x{n}", 10_000))

    askers = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
    for thread in askers:
        thread.start()
    for thread in askers:
        thread.join()
    assert all(isinstance(r, Waiting) and r.holders == 4 for r in results)
    for name in ("a", "b"):
        token = held[name]
        assert isinstance(token, Acquired)
        store.release("acct", name, token.token)
    assert all(isinstance(store.acquire("acct", f"x{n}", 10_000), Waiting) for n in range(8))
    c = held["c"]
    assert isinstance(c, Acquired)
    woken = store.release("acct", "c", c.token)
    assert len(woken) == 1
    assert isinstance(store.acquire("acct", woken[0], 10_000), Acquired)
