"""loopsq's worker renews RQ's heartbeats of the job it runs, so a run longer than RQ's 420 s is not marked
abandoned by another worker's registry cleanup (RQ's SimpleWorker alone never renews them)."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from rq import get_current_job
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry

from loopsq.engine import rq_worker, timers

pytestmark = pytest.mark.integration


def beats_seen() -> list[str]:
    """A job: the job's ``last_heartbeat`` as RQ stores it, read every 0.1 s for a second."""
    job = get_current_job()
    assert job is not None
    seen = []
    for _ in range(10):
        seen.append(job.connection.hget(job.key, "last_heartbeat").decode())
        time.sleep(0.1)
    return sorted(set(seen))


def test_the_running_job_heartbeat_is_renewed_and_stops_with_the_job(real_redis: redis.Redis) -> None:
    raw = timers.raw_from(real_redis)
    job_id = timers.enqueue(raw, f"{__name__}.beats_seen")
    worker = rq_worker.make_worker(raw, "beat-test")
    worker.job_monitoring_interval = 0.25
    worker.work(burst=True, logging_level="WARNING", with_scheduler=False)

    job = Job.fetch(job_id, connection=raw)
    assert job.get_status() == "finished", job.exc_info
    assert len(job.return_value()) >= 3  # the start, then one per 0.25 s
    assert StartedJobRegistry(timers.QUEUE_NAME, connection=raw).get_job_ids() == []
    assert FailedJobRegistry(timers.QUEUE_NAME, connection=raw).get_job_ids() == []
    assert not [t for t in threading.enumerate() if t.name == "loopsq-rq-job-beat" and t.is_alive()]
