"""The scripted timer mover on a real Redis: what rq-scheduler's moving does (job queued with its enqueue time,
id on the queue, entry gone), only due timers, in batches, and never one timer twice when schedulers race."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from rq.job import Job

from loopsq.engine import timers
from loopsq.state.keys import Keys

pytestmark = pytest.mark.integration
KEYS = Keys()


@pytest.fixture
def raw(real_redis: redis.Redis) -> redis.Redis:
    return timers.raw_from(real_redis)


def test_only_due_timers_move_and_each_is_queued_as_rq_would(raw: redis.Redis) -> None:
    now = datetime.now(UTC)
    due = [timers.arm(raw, KEYS, f"due{i}", now - timedelta(seconds=5)) for i in range(3)]
    later = timers.arm(raw, KEYS, "later", now + timedelta(hours=1))
    assert timers.move_due(raw) == 3
    assert [i.decode() for i in raw.lrange(timers.queue(raw).key, 0, -1)] == due  # oldest first, as armed
    for job_id in due:
        job = Job.fetch(job_id, connection=raw)
        assert (job.get_status(), job.origin, job.func_name) == ("queued", timers.QUEUE_NAME, timers.FIRE)
        assert job.enqueued_at is not None and job.timeout == -1
    assert timers.scheduled_count(raw) == 1 and timers.next_due_in(raw) is not None
    assert raw.zscore(timers.scheduler(raw).scheduled_jobs_key, later) is not None
    assert raw.sismember("rq:queues", timers.queue(raw).key)
    assert timers.move_due(raw) == 0


def test_a_backlog_larger_than_a_batch_moves_in_one_call(raw: redis.Redis) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    n = timers.MOVE_BATCH * 2 + 7
    for i in range(n):
        timers.arm(raw, KEYS, f"l{i}", past)
    assert timers.move_due(raw) == n
    assert raw.llen(timers.queue(raw).key) == n and timers.scheduled_count(raw) == 0


def test_an_entry_whose_job_is_gone_is_dropped_not_queued(raw: redis.Redis) -> None:
    job_id = timers.arm(raw, KEYS, "ghost", datetime.now(UTC) - timedelta(seconds=1))
    raw.delete(Job.key_for(job_id))
    assert timers.move_due(raw) == 0
    assert raw.llen(timers.queue(raw).key) == 0 and timers.scheduled_count(raw) == 0


def test_movers_racing_from_several_schedulers_move_each_timer_once(raw: redis.Redis) -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    for i in range(3000):
        timers.arm(raw, KEYS, f"r{i}", past)
    clients = [timers.raw_from(raw) for _ in range(4)]
    counts: list[int] = []
    start = threading.Barrier(len(clients))

    def move(client: redis.Redis) -> None:
        start.wait()
        total = 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and timers.scheduled_count(client):
            total += timers.move_due(client)
        counts.append(total)

    threads = [threading.Thread(target=move, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    queued = [i.decode() for i in raw.lrange(timers.queue(raw).key, 0, -1)]
    assert sum(counts) == 3000 and len(queued) == 3000 == len(set(queued))
