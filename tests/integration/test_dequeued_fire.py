"""A fire job RQ dequeues for loopsq's worker is run without RQ's per-job bookkeeping (``_Worker.execute_job``:
``timers.start_dequeued``, then settled as a taken job is), and RQ's own view of it stays what RQ would show: the
worker busy with it while it runs and idle after, its successful or failed count, the job gone (result_ttl 0)
or failed under its own id and error, nothing left in RQ's intermediate list. Against the session's
redis-server, in this process."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.worker import Worker

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import from_iso
from loopsq.engine import rq_worker, steering, timers
from loopsq.engine.runtime import Runtime, set_current_runtime

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    runtime = Runtime(client=real_redis, role="worker").start()
    set_current_runtime(runtime)
    yield runtime
    set_current_runtime(None)
    runtime.stop()


def queued_fire(rt: Runtime, name: str) -> tuple[str, str]:
    body = {"name": name, "schedule": {"type": "interval", "everyMs": 3_600_000},
            "target": {"type": "command", "command": "true"}, "timezone": "UTC"}
    loop = rt.loops.create(new_loop(body, timeutil.now() - timedelta(hours=1, seconds=1)))
    job_id = timers.arm(rt.raw, rt.keys, loop.id, from_iso(str(loop.next_run_at)))
    assert job_id is not None and timers.move_due(rt.raw) == 1
    return loop.id, job_id


def worker_hash(rt: Runtime, name: str) -> dict[str, str]:
    """RQ's worker hash, and as ``current_job`` the job RQ's own API says the worker runs (RQ 2 reads it from the
    hash, RQ 3 from the worker's executions)."""
    found = {k.decode(): v.decode() for k, v in rt.raw.hgetall(f"rq:worker:{name}").items()}
    found.pop("current_job", None)
    current = Worker.find_by_key(f"rq:worker:{name}", connection=rt.raw).get_current_job_id()
    if current is not None:
        found["current_job"] = str(current)
    return found


def test_a_lone_fire_job_shows_in_rq_as_rqs_own_job_would(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    loop_id, job_id = queued_fire(rt, "lone")
    during: list[dict[str, str]] = []
    original = steering.execute_target

    def spy(*args: Any, **kwargs: Any) -> Any:
        during.append(worker_hash(rt, rt.owner.worker_id))
        during.append({"status": rt.raw.hget(Job.key_for(job_id), "status").decode()})
        return original(*args, **kwargs)

    monkeypatch.setattr(steering, "execute_target", spy)
    worker = rq_worker.make_worker(rt.raw, rt.owner.worker_id)
    assert rq_worker.work(worker, burst=True)
    assert (during[0]["state"], during[0]["current_job"]) == ("busy", job_id)
    assert during[1] == {"status": "started"}
    after = worker_hash(rt, rt.owner.worker_id)
    assert int(after["successful_job_count"]) == 1 and "current_job" not in after
    assert not rt.raw.exists(Job.key_for(job_id))  # result_ttl 0: gone, as RQ deletes it
    assert rt.raw.llen(Queue(timers.QUEUE_NAME, connection=rt.raw).intermediate_queue_key) == 0
    assert StartedJobRegistry(timers.QUEUE_NAME, connection=rt.raw).count == 0
    assert [r.status for r in rt.runs.get_many(rt.runs.active_ids(loop_id))] == []
    assert rt.loops.get(loop_id) is not None


def test_a_failing_dequeued_fire_job_is_failed_in_rq_under_its_own_id(rt: Runtime) -> None:
    loop_id, job_id = queued_fire(rt, "broken")
    rt.client.set(rt.keys.loop(loop_id), "{not json")
    worker = rq_worker.make_worker(rt.raw, rt.owner.worker_id)
    assert rq_worker.work(worker, burst=True)
    assert FailedJobRegistry(timers.QUEUE_NAME, connection=rt.raw).get_job_ids() == [job_id]
    job = Job.fetch(job_id, connection=rt.raw)
    assert job.get_status() == "failed"
    result = job.latest_result()
    assert result is not None and result.exc_string is not None and "JSONDecodeError" in result.exc_string
    counts = worker_hash(rt, rt.owner.worker_id)
    assert int(counts.get("failed_job_count", 0)) == 1 and int(counts.get("successful_job_count", 0)) == 0
    assert counts["state"] == "idle"


def test_without_loopsqs_runtime_a_fire_job_goes_rqs_way(real_redis: redis.Redis,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """No runtime in the process: RQ's own path (it performs ``worker.jobs.fire``, which makes one)."""
    set_current_runtime(None)
    rt = Runtime(client=real_redis, role="scheduler")
    _, job_id = queued_fire(rt, "plain")
    taken: list[str] = []
    monkeypatch.setattr(timers, "start_dequeued", lambda *a, **k: taken.append("loopsq's way"))
    worker = rq_worker.make_worker(rt.raw, rt.owner.worker_id)
    try:
        assert rq_worker.work(worker, burst=True)
    finally:
        from loopsq.engine.runtime import current_runtime

        made = current_runtime()
        if made is not None:
            made.stop()
        set_current_runtime(None)
    assert taken == []
    assert int(worker_hash(rt, rt.owner.worker_id)["successful_job_count"]) == 1
    assert not real_redis.exists(Job.key_for(job_id))
