"""RQ's own view stays true under batching: the timer jobs a fire job takes from the queue behind it
(``fire_queue.fire_queued``) are settled as RQ settles the jobs it runs itself — the worker's successful and failed
counts, the finished registry by the job's own ``result_ttl``, the failed registry under the taken job's own id
and error. Compared with a bare RQ ``SimpleWorker`` working the same number of plain jobs, in this process
against the session's private redis-server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import from_iso
from loopsq.engine import rq_worker, timers
from loopsq.engine.runtime import Runtime
from loopsq.engine.worker_process import current_runtime, set_current_runtime

pytestmark = pytest.mark.integration

FIRES = 20
BROKEN = 7  # the loop whose fire fails (not the first: that one is RQ's own job)


@pytest.fixture
def raw(real_redis: redis.Redis) -> Iterator[redis.Redis]:
    yield timers.raw_from(real_redis)
    rt = current_runtime()
    if rt is not None:
        rt.stop()
    set_current_runtime(None)


def plain_job(index: int) -> int:
    """The bare side's job; index ``BROKEN`` fails as a broken fire does."""
    if index == BROKEN:
        raise ValueError(f"job {index} failed")
    return index


def counts(raw: redis.Redis, worker: str, queue: str) -> dict[str, object]:
    stats = raw.hmget(f"rq:worker:{worker}", ["successful_job_count", "failed_job_count"])
    return {"successful": int(stats[0] or 0), "failed": int(stats[1] or 0),
            "finished registry": FinishedJobRegistry(queue, connection=raw).count,
            "failed registry": FailedJobRegistry(queue, connection=raw).count}


def bare_run(raw: redis.Redis, result_ttl: int, *, broken: bool) -> tuple[dict[str, object], list[str]]:
    queue = Queue("bare", connection=raw)
    for i in range(FIRES):
        queue.enqueue(f"{__name__}.plain_job", i if broken else -1, result_ttl=result_ttl, job_id=f"bare-{i}")
    SimpleWorker([queue], connection=raw, name="bare-worker").work(burst=True, logging_level="WARNING",
                                                                   with_scheduler=False)
    return counts(raw, "bare-worker", "bare"), FailedJobRegistry("bare", connection=raw).get_job_ids()


def loopsq_run(raw: redis.Redis, real_redis: redis.Redis, result_ttl: int, *,
               broken: bool) -> tuple[dict[str, object], list[str], dict[int, str]]:
    """FIRES due loops whose timer jobs are all queued; one loopsq RQ worker takes the first as RQ's job and the
    rest behind it (batched)."""
    rt = Runtime(client=real_redis, role="scheduler")
    jobs: dict[int, str] = {}
    for i in range(FIRES):
        body = {"name": f"reg-{i:02d}", "schedule": {"type": "interval", "everyMs": 3_600_000},
                "target": {"type": "command", "command": "true"}, "timezone": "UTC"}
        loop = rt.loops.create(new_loop(body, timeutil.now() - timedelta(hours=1, seconds=1, milliseconds=-i)))
        jobs[i] = timers.arm(raw, rt.keys, loop.id, from_iso(str(loop.next_run_at)))
        raw.hset(Job.key_for(jobs[i]), "result_ttl", result_ttl)
        if broken and i == BROKEN:
            real_redis.set(rt.keys.loop(loop.id), "{not json")
    assert timers.move_due(raw) == FIRES
    worker = rq_worker.make_worker(raw, "loopsq-worker")
    rq_worker.work(worker, burst=True)
    return counts(raw, "loopsq-worker", timers.QUEUE_NAME), FailedJobRegistry(
        timers.QUEUE_NAME, connection=raw).get_job_ids(), jobs


@pytest.mark.parametrize("result_ttl", [0, 30])
def test_twenty_batched_fires_count_in_rq_as_twenty_bare_jobs(raw: redis.Redis, real_redis: redis.Redis,
                                                              result_ttl: int) -> None:
    bare, _ = bare_run(raw, result_ttl, broken=False)
    mine, failed, _ = loopsq_run(raw, real_redis, result_ttl, broken=False)
    assert mine == bare == {"successful": FIRES, "failed": 0, "finished registry": FIRES if result_ttl else 0,
                            "failed registry": 0}
    assert failed == []
    if result_ttl:  # kept as finished for their result_ttl, then gone: nothing accumulates
        registry = FinishedJobRegistry(timers.QUEUE_NAME, connection=raw)
        for job_id in registry.get_job_ids():
            assert 0 < raw.ttl(Job.key_for(job_id)) <= result_ttl
            assert raw.hget(Job.key_for(job_id), "status") == b"finished"
    else:
        # Only the next slots' timers are left: every fired job went, as RQ drops a job with result_ttl 0.
        left = {k.decode()[len("rq:job:"):] for k in raw.scan_iter(match=f"rq:job:{timers.FIRE_PREFIX}*")}
        assert left == {i.decode() for i in raw.zrange(timers.scheduler(raw).scheduled_jobs_key, 0, -1)}
        assert len(left) == FIRES


def test_a_failing_taken_fire_is_failed_in_rq_under_its_own_id_and_error(raw: redis.Redis,
                                                                          real_redis: redis.Redis) -> None:
    bare, bare_failed = bare_run(raw, 0, broken=True)
    mine, failed, jobs = loopsq_run(raw, real_redis, 0, broken=True)
    assert mine == bare == {"successful": FIRES - 1, "failed": 1, "finished registry": 0, "failed registry": 1}
    assert bare_failed == ["bare-7"]
    assert failed == [jobs[BROKEN]]
    job = Job.fetch(jobs[BROKEN], connection=raw)
    assert job.get_status() == "failed"
    result = job.latest_result()
    assert result is not None and result.exc_string is not None and "JSONDecodeError" in result.exc_string
    assert 0 < raw.ttl(job.key) <= timers.TAKEN_FAILURE_TTL
    # The host job (the first fire, RQ's own) succeeded: the error is not put on it.
    assert not raw.exists(Job.key_for(jobs[0]))
