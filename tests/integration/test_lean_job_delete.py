"""A job kept for no time (``result_ttl=0``, as every timer fire job is) is deleted by loopsq's worker in one
script inside RQ's end-of-job transaction (``rqcompat.worker.LeanJob``) instead of RQ's ``Job.delete``, which reads
the job's status three times and its executions twice first. What is left in Redis must be exactly what RQ's own
``SimpleWorker`` leaves, and the reads must be gone. Real redis-server, in this process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.connection import AbstractConnection
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.registry import FinishedJobRegistry, StartedJobRegistry

from loopsq.engine import rq_worker, timers

pytestmark = pytest.mark.integration

JOBS = 5


def noop(index: int) -> int:
    return index


@pytest.fixture
def raw(real_redis: redis.Redis) -> Iterator[redis.Redis]:
    yield timers.raw_from(real_redis)


def keys_left(raw: redis.Redis, worker: str) -> set[str]:
    """Every key but the worker's own (its name differs between the sides), RQ's worker sets and RQ 3's group
    maintenance lock (``rq:clean_groups``, taken by whichever worker's maintenance runs first: no job's state)."""
    names = {k.decode() for k in raw.keys("*")}
    return {k.replace(worker, "<worker>") for k in names
            if worker not in k and not k.startswith("rq:workers") and k != "rq:clean_groups"}


def run_side(raw: redis.Redis, worker_class: type[SimpleWorker], name: str) -> tuple[set[str], dict[str, int]]:
    raw.flushall()
    queue = Queue("side", connection=raw)
    for i in range(JOBS):
        queue.enqueue(f"{__name__}.noop", i, result_ttl=0, job_id=f"job-{i}")
    worker_class([queue], connection=raw, name=name).work(burst=True, logging_level="WARNING",
                                                          with_scheduler=False)
    counts = {"started registry": StartedJobRegistry("side", connection=raw).count,
              "finished registry": FinishedJobRegistry("side", connection=raw).count,
              "successful": int(raw.hget(f"rq:worker:{name}", "successful_job_count") or 0)}
    return keys_left(raw, name), counts


def test_a_job_kept_for_no_time_leaves_what_rq_leaves(raw: redis.Redis) -> None:
    stock_keys, stock_counts = run_side(raw, SimpleWorker, "stock")
    lean_keys, lean_counts = run_side(raw, rq_worker._Worker, "lean")
    assert lean_counts == stock_counts == {"started registry": 0, "finished registry": 0, "successful": JOBS}
    assert lean_keys == stock_keys
    assert not any("job-" in key for key in lean_keys)  # no job hash, execution or executions registry left


class _Counter:
    """Round trips sent from this thread while ``on`` (a pipeline or a script counts once)."""

    def __init__(self) -> None:
        self.sent = 0
        self.on = False
        self._orig = AbstractConnection.send_packed_command

    def __enter__(self) -> _Counter:
        counter = self

        def send(conn: AbstractConnection, command: Any, check_health: bool = True) -> None:
            if counter.on and threading.current_thread() is threading.main_thread():
                counter.sent += 1
            counter._orig(conn, command, check_health)  # type: ignore[no-untyped-call]

        AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
        return self

    def __exit__(self, *_exc: object) -> None:
        AbstractConnection.send_packed_command = self._orig  # type: ignore[method-assign]


def trips_per_job(raw: redis.Redis, worker_class: type[SimpleWorker], name: str) -> float:
    raw.flushall()
    queue = Queue("side", connection=raw)
    for i in range(JOBS):
        queue.enqueue(f"{__name__}.noop", i, result_ttl=0, job_id=f"job-{i}")
    with _Counter() as counter:
        counter.on = True
        worker_class([queue], connection=raw, name=name).work(burst=True, logging_level="WARNING",
                                                              with_scheduler=False)
    return counter.sent / JOBS


def test_the_delete_reads_nothing(raw: redis.Redis) -> None:
    stock = trips_per_job(raw, SimpleWorker, "stock")
    lean = trips_per_job(raw, rq_worker._Worker, "lean")
    # RQ's delete: 3 status reads, and get_executions twice (cleanup, ids, each execution's hash): 9 round trips.
    assert stock - lean >= 8, (stock, lean)


def test_a_job_with_a_result_ttl_is_rqs_to_keep(raw: redis.Redis) -> None:
    """Only a job deleted at once takes the lean path: one with a result_ttl is finished and kept as RQ keeps it."""
    queue = Queue("side", connection=raw)
    queue.enqueue(f"{__name__}.noop", 1, result_ttl=60, job_id="kept")
    rq_worker._Worker([queue], connection=raw, name="lean").work(burst=True, logging_level="WARNING",
                                                                 with_scheduler=False)
    job = Job.fetch("kept", connection=raw)
    assert job.get_status() == "finished"
    assert 0 < raw.ttl(job.key) <= 60
    assert FinishedJobRegistry("side", connection=raw).get_job_ids() == ["kept"]
