"""RQ's queues and jobs and rq-scheduler's timer store, as loopsq uses them: a queue, a job made without being
saved (its hash is written by a script), a failed job recorded as RQ records one, the job a worker runs now."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import redis
from rq import Queue, get_current_job
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq_scheduler import Scheduler

from loopsq.domain.timeutil import now, to_ms
from loopsq.engine.rqcompat import names

__all__ = ["Job", "JobStatus", "Queue"]


class MsScheduler(Scheduler):  # type: ignore[misc]
    """rq-scheduler with millisecond scores instead of whole seconds."""

    def enqueue_at(self, scheduled_time: datetime, func: Any, *args: Any, **kwargs: Any) -> Job:
        timeout = kwargs.pop("timeout", None)
        job_id = kwargs.pop("job_id", None)
        result_ttl = kwargs.pop("job_result_ttl", None)
        queue_name = kwargs.pop("queue_name", None)
        meta = kwargs.pop("meta", None)
        job = self._create_job(
            func, args=args, kwargs=kwargs, timeout=timeout, id=job_id, result_ttl=result_ttl,
            queue_name=queue_name, meta=meta,
        )
        self.connection.zadd(self.scheduled_jobs_key, {job.id: to_ms(scheduled_time) / 1000.0})
        created: Job = job
        return created

    def get_jobs_to_queue(self, with_times: bool = False) -> Any:
        # On Redis's clock (``timeutil.now``), as timers are scored: a host whose clock is fast must not move a
        # timer early.
        return self.get_jobs(to_ms(now()) / 1000.0, with_times=with_times)


def scheduler(raw: redis.Redis, queue_name: str, scheduled_key: str = names.SCHEDULED_KEY) -> MsScheduler:
    """The timer store (no loop of its own is run) in the sorted set ``scheduled_key`` (rq-scheduler's own by
    default; a namespace other than the default keeps its timers in one of its own)."""
    found = MsScheduler(queue_name=queue_name, connection=raw, interval=1)
    found.scheduled_jobs_key = scheduled_key
    return found


def queue(raw: redis.Redis, name: str) -> Queue:
    """An RQ queue whose jobs never time out in RQ: loopsq enforces target timeouts itself."""
    return Queue(name, connection=raw, default_timeout=-1)


def unsaved_job_fields(raw: redis.Redis, queue_name: str, func: str, args: tuple[Any, ...], job_id: str,
                       result_ttl: int) -> list[Any]:
    """The fields and values of the hash of a job made as ``MsScheduler.enqueue_at`` makes it (rq-scheduler's
    ``_create_job``: no timeout, the queue as its ``origin``), not saved: a script writes the hash."""
    job = scheduler(raw, queue_name)._create_job(func, args=args, timeout=-1, id=job_id, result_ttl=result_ttl,
                                                 queue_name=queue_name, commit=False)
    fields: list[Any] = []
    for name, value in job.to_dict(include_meta=True).items():
        fields += (name, value)
    return fields


def enqueue(raw: redis.Redis, queue_name: str, func: str, *args: Any, job_id: str | None, result_ttl: int,
            failure_ttl: int, **kwargs: Any) -> str:
    """Enqueue a job now (RQ's documented ``Queue.enqueue``, no RQ timeout); returns its id."""
    job = queue(raw, queue_name).enqueue(
        func, *args, job_id=job_id, job_timeout=-1, result_ttl=result_ttl, failure_ttl=failure_ttl, **kwargs
    )
    return str(job.id)


def fail_job(raw: redis.Redis, job_id: str, worker: str, error: str, failure_ttl: int, took_s: float) -> None:
    """Record job ``job_id``, which ``worker`` ran outside RQ's worker, as failed with ``error`` (a traceback), as
    RQ records a failed job: its status, its failed registry entry and result for ``failure_ttl``; the worker's
    failed count and working time go up. Nothing when the job is gone."""
    try:
        job = Job.fetch(job_id, connection=raw)
    except NoSuchJobError:
        return
    job.failure_ttl = failure_ttl
    job.ended_at = names.rq_now()
    wkey = names.worker_key(worker)
    with raw.pipeline() as pipe:
        job.set_status(JobStatus.FAILED, pipeline=pipe)
        job._handle_failure(error, pipe, worker_name=worker)
        pipe.hdel(job.key, "loopsq_taken")
        if names.WORKER_HAS_EXECUTIONS:  # (the execution that showed it running: ``scripts.SHOW``)
            pipe.delete(names.taken_execution_key(job_id))
            pipe.srem(names.worker_executions_key(worker), f"{job_id}:{names.TAKEN_EXECUTION_ID}")
        pipe.execute()
    if worker and raw.exists(wkey):
        pipe = raw.pipeline()
        pipe.hincrby(wkey, "failed_job_count", 1)
        pipe.hincrbyfloat(wkey, "total_working_time", took_s)
        pipe.execute()


def enqueued_at(job: Job) -> datetime | None:
    """When ``job`` was put on its queue (aware UTC), None when unknown."""
    enqueued: datetime | None = job.enqueued_at
    if enqueued is not None and enqueued.tzinfo is None:
        enqueued = enqueued.replace(tzinfo=UTC)
    return enqueued


def running_job() -> Job | None:
    """The job the RQ worker of this process runs now (RQ's ``get_current_job``), None outside a job."""
    job: Job | None = get_current_job()
    return job


def queue_count(raw: redis.Redis, name: str) -> int:
    """Jobs waiting in queue ``name``."""
    return int(queue(raw, name).count)


__all__ += ["MsScheduler"]
