"""The long-running processes' layout checks (issue #28): at start (a scheduler migrates, a worker refuses) and
the guard while they run, which reads ``keys.meta`` each time and the whole layout after a Redis outage."""

from __future__ import annotations

import threading

import pytest
import redis

from loopsq.engine import layout_guard
from loopsq.engine.runtime import Runtime
from loopsq.state.keys import Keys
from loopsq.state.layout import StateLayoutError

KEYS = Keys()
NEWER = "this Redis holds loopsq state v3; this loopsq reads v2: upgrade it"


def runtime(client: redis.Redis) -> Runtime:
    return Runtime(client=client, keys=KEYS, role="worker", worker_id="worker:test")


def test_a_worker_stamps_an_empty_redis_at_start_and_refuses_a_newer_or_older_state(client: redis.Redis) -> None:
    rt = runtime(client)
    assert layout_guard.check_at_start(rt).version == 2
    assert client.hgetall(KEYS.meta) == {"layout": "2", "readableFrom": "2"}
    client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "3"})
    with pytest.raises(StateLayoutError) as newer:
        layout_guard.check_at_start(rt, migrate=True)
    assert (newer.value.message, newer.value.exit_code) == (NEWER, 2)
    client.delete(KEYS.meta)
    client.set("loopsq:slot:l1:2026-01-01T00:00:00.000Z", "r1")
    with pytest.raises(StateLayoutError) as older:
        layout_guard.check_at_start(rt)
    assert older.value.message.startswith("this Redis holds loopsq state v1; this loopsq reads v2: run `loopsq migrate`")
    assert client.exists(KEYS.meta) == 0


def test_a_scheduler_migrates_an_older_state_at_start(client: redis.Redis) -> None:
    client.set(KEYS.loop("l1"), '{"id": "l1", "status": "paused"}')
    client.sadd(KEYS.loops, "l1")
    client.set("loopsq:slot:l1:2026-01-01T00:00:00.000Z", "r1")
    assert layout_guard.check_at_start(runtime(client), migrate=True).version == 2
    assert client.keys("loopsq:slot:*") == []
    assert client.hgetall(KEYS.slots("l1")) == {"2026-01-01T00:00:00.000Z": "r1"}
    assert client.hgetall(KEYS.meta) == {"layout": "2", "readableFrom": "2"}


def test_the_guard_reads_the_stamp_and_after_an_outage_the_whole_layout(client: redis.Redis) -> None:
    rt = runtime(client)
    layout_guard.check_at_start(rt)
    guard = layout_guard.LayoutGuard.of(rt, threading.Event())
    assert guard.check() is None
    client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "2"})  # newer, still readable by v2
    assert guard.check() is None
    client.hset(KEYS.meta, "readableFrom", "3")
    assert guard.check() == NEWER
    # Redis came back another one (restored, or a failover to a server holding a v1 state): no stamp there, so
    # only the full read after the outage sees it.
    client.delete(KEYS.meta)
    client.set("loopsq:slot:l1:2026-01-01T00:00:00.000Z", "r1")
    assert guard.check() is None
    rt.outage.failed(redis.ConnectionError("gone"))
    assert guard.check() is None  # (while Redis is away, nothing is judged)
    rt.outage.recovered()
    line = guard.check()
    assert line is not None and line.startswith("this Redis holds loopsq state v1;")


def test_the_guard_thread_calls_its_refusal_once_and_ends(client: redis.Redis) -> None:
    rt = runtime(client)
    layout_guard.check_at_start(rt)
    stop, seen = threading.Event(), []
    guard = layout_guard.LayoutGuard(rt.direct, KEYS, stop, on_refusal=seen.append, every_s=0.01)
    guard.start()
    client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "3"})
    guard.join(timeout=10)
    stop.set()
    assert seen == [NEWER]


class _Flaky:
    """A client whose reads fail while ``down`` (a Redis that went away), else those of ``client``."""

    def __init__(self, client: redis.Redis) -> None:
        self.client, self.down = client, False

    def __getattr__(self, name: str) -> object:
        if self.down:
            raise redis.ConnectionError("gone")
        return getattr(self.client, name)


def test_a_guard_without_an_outage_log_reads_the_whole_layout_after_its_own_read_failed(client: redis.Redis) -> None:
    flaky = _Flaky(client)
    guard = layout_guard.LayoutGuard(flaky, KEYS, threading.Event())  # type: ignore[arg-type]
    client.hset(KEYS.meta, mapping={"layout": "2", "readableFrom": "2"})
    assert guard.check() is None
    flaky.down = True
    assert guard.check() is None  # (Redis away: nothing judged)
    client.delete(KEYS.meta)
    client.set("loopsq:slot:l1:2026-01-01T00:00:00.000Z", "r1")  # back as another Redis, holding v1 state
    flaky.down = False
    line = guard.check()
    assert line is not None and line.startswith("this Redis holds loopsq state v1;")


def test_maintenance_passes_only_while_the_stamp_is_one_this_release_writes(client: redis.Redis) -> None:
    from loopsq.engine.scheduler_process import layout_still_ours

    rt = runtime(client)
    assert layout_still_ours(rt)  # unstamped: nothing says otherwise
    layout_guard.check_at_start(rt)
    assert layout_still_ours(rt)
    client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "3"})
    assert not layout_still_ours(rt)
    client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "2"})  # a newer release that kept v2 valid
    assert layout_still_ours(rt)
