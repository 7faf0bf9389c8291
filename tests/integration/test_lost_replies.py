"""A finalize whose reply is lost after Redis applied it (the connection drops between Redis running the transition
and the worker reading its answer): the client sends it again, its own guard refuses the resend, and the worker
must recognize the end it recorded (``RunStore.recorded_end``) rather than take the refusal for a lost lease.

The run is then recorded once, the log does not claim the lease was lost, and a fixed-delay loop (whose next time
the finalize wrote) keeps a future timer. ``fire`` in this process, on a worker runtime that rides outages as a
worker's does, against the session's redis-server through a connection that loses that one reply.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest
import redis

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import from_iso
from loopsq.engine import timers
from loopsq.engine.runner import fire
from loopsq.engine.runtime import Runtime
from loopsq.state.keys import Keys
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()


class LosesOneReply(redis.Connection):
    """A connection that, once, reads the answer to a command carrying ``trigger`` (Redis has applied it), then
    drops the connection and raises as a network failure would: the caller never learns it was applied."""

    trigger = b"run_succeeded"  # the finalize transition's type, among its script's arguments
    #: The replies lost so far, by every connection of the pool (one in all).
    lost: ClassVar[list[Any]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._losing = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        chunks = [command] if isinstance(command, bytes | str) else command
        data = b"".join(c.encode() if isinstance(c, str) else bytes(c) for c in chunks)
        if not LosesOneReply.lost and self.trigger in data:
            self._losing = True
        super().send_packed_command(command, check_health)

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        reply = super().read_response(*args, **kwargs)
        if self._losing:
            self._losing = False
            if isinstance(reply, list) and reply and int(reply[0]) == 1:  # the transition applied
                LosesOneReply.lost.append(reply)
                self.disconnect()
                raise redis.ConnectionError("connection lost before the reply was read (test)")
        return reply


@pytest.fixture
def lossy_rt(redis_server: RedisServer, real_redis: redis.Redis) -> Iterator[Runtime]:
    LosesOneReply.lost = []
    pool = redis.ConnectionPool(host="127.0.0.1", port=redis_server.port, decode_responses=True,
                                connection_class=LosesOneReply)
    client = redis.Redis(connection_pool=pool)
    runtime = Runtime(client=client, keys=KEYS, role="worker", ride_until=threading.Event())
    yield runtime
    runtime.stop()
    client.close()


def test_a_finalize_whose_reply_was_lost_is_recorded_once_without_a_lease_lost_line_and_the_loop_keeps_its_timer(
    lossy_rt: Runtime, real_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    rt = lossy_rt
    body = {"name": "delayed", "timezone": "UTC",
            "schedule": {"type": "interval", "everyMs": 60_000, "anchor": "fixed_delay"},
            "target": {"type": "command", "command": "echo done", "shell": True}}
    loop = rt.loops.create(new_loop(body, timeutil.now() - timedelta(seconds=61)))  # its first slot is due
    caplog.set_level(logging.INFO, "loopsq.runs")

    result = fire(rt, loop.id)

    assert len(LosesOneReply.lost) == 1, "the finalize's reply was never lost: the test proved nothing"
    assert [(r.status, r.attempt, r.stdout) for r in result.runs] == [("succeeded", 1, "done\n")]
    (run,) = result.runs
    ends = [f for _, f in real_redis.xrange(KEYS.changes) if f["type"].startswith("run_") and f["type"] not in (
        "run_claimed", "run_started", "run_lease_renewed")]
    assert [f["type"] for f in ends] == ["run_succeeded"], ends  # recorded once
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "lease lost" in m], messages
    assert f"run {run.id} succeeded loop=delayed slot={run.scheduled_for} attempt=1" in messages
    # Fixed delay: the finalize wrote the next time (a minute after the run ended); its timer is armed there.
    stored = rt.loops.get(loop.id)
    assert stored is not None and stored.next_run_at is not None
    armed_s, _ = timers.armed_state(rt.raw, KEYS, [loop.id])[loop.id]
    assert armed_s is not None and armed_s > time.time(), (armed_s, stored.next_run_at)
    assert armed_s == pytest.approx(from_iso(stored.next_run_at).timestamp(), abs=0.001)
