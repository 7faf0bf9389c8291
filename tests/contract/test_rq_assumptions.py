"""One test per assumption ``loopsq.engine.rqcompat`` makes about RQ's and rq-scheduler's internals, run against
the installed versions and a real redis-server: a release that changes one fails the test naming it.

Run on both RQ lines by .ci/run (rq 2.12 in the main venv, rq 3.x in the second one)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
import rq.registry
import rq.worker.base
from rq import Queue, SimpleWorker
from rq.executions import Execution
from rq.job import Job
from rq_scheduler import Scheduler

from loopsq.engine import timers
from loopsq.engine.rqcompat import jobs, names
from loopsq.engine.rqcompat.worker import CompatWorker, OutageFilter
from loopsq.state import loop_watch

pytestmark = pytest.mark.integration

SEEN: list[dict[str, str]] = []


def noop() -> int:
    return 1


def record_own_hash() -> None:
    """A job that records its own hash as RQ's worker leaves it while the job runs."""
    job = jobs.running_job()
    assert job is not None
    status, worker = job.connection.hmget(names.job_key(job.id), ["status", "worker_name"])
    SEEN.append({"status": status.decode(), "worker_name": worker.decode()})


@pytest.fixture
def raw(real_redis: redis.Redis) -> Iterator[redis.Redis]:
    yield timers.raw_from(real_redis)


def broken(assumption: str) -> str:
    return f"RQ assumption broken: {assumption} (see loopsq/engine/rqcompat)"


def test_queue_key_lists_waiting_jobs_head_first(raw: redis.Redis) -> None:
    q = Queue("c", connection=raw)
    q.enqueue(f"{__name__}.noop", job_id="a")
    q.enqueue(f"{__name__}.noop", job_id="b")
    assert raw.lrange(names.queue_key("c"), 0, -1) == [b"a", b"b"], broken("names.queue_key")
    assert raw.sismember(names.QUEUES_KEY, names.queue_key("c")), broken("names.QUEUES_KEY")


def test_job_key_holds_the_job_hash_with_enqueued_at_status_and_origin(raw: redis.Redis) -> None:
    Queue("c", connection=raw).enqueue(f"{__name__}.noop", job_id="a")
    status, origin, enqueued = raw.hmget(names.job_key("a"), ["status", "origin", names.ENQUEUED_AT])
    assert (status, origin) == (b"queued", b"c"), broken("names.job_key fields")
    assert isinstance(names.parse_rq_time(enqueued.decode()), datetime), broken("names.ENQUEUED_AT")
    assert timers._rq_time(names.rq_now_text()) is not None, broken("RQ's time format (names.rq_now_text)")


def test_a_dequeued_job_sits_in_the_intermediate_list(raw: redis.Redis) -> None:
    q = Queue("c", connection=raw)
    q.enqueue(f"{__name__}.noop", job_id="a")
    assert Queue.dequeue_any([q], 1, connection=raw) is not None
    assert raw.lrange(names.intermediate_queue_key("c"), 0, -1) == [b"a"], broken("names.intermediate_queue_key")


def test_worker_key_holds_the_worker_hash(raw: redis.Redis) -> None:
    w = SimpleWorker([Queue("c", connection=raw)], connection=raw, name="w1")
    w.register_birth()
    assert raw.hget(names.worker_key("w1"), "queues") == b"c", broken("names.worker_key")
    assert w.key == names.worker_key("w1"), broken("names.WORKER_PREFIX")


def test_the_current_job_rqs_api_reads_is_what_loopsq_shows(raw: redis.Redis) -> None:
    """RQ 2 reads the worker hash's current_job, RQ 3 the worker's executions (``scripts.SHOW``)."""
    q = Queue("loopsq", connection=raw)
    SimpleWorker([q], connection=raw, name="w1").register_birth()
    job = q.enqueue(f"{__name__}.noop", job_id=f"{timers.FIRE_PREFIX}x-1-ab")
    timers.start_dequeued(raw, job, "w1")
    found = SimpleWorker.find_by_key(names.worker_key("w1"), connection=raw)
    assert found is not None and found.get_current_job_id() == job.id, broken("scripts.SHOW (current job)")
    assert found.get_state() == "busy", broken("worker hash field 'state'")
    timers.finish_taken(raw, job.id, "w1")
    found = SimpleWorker.find_by_key(names.worker_key("w1"), connection=raw)
    if names.WORKER_HAS_EXECUTIONS:  # (RQ 2: the worker clears current_job as it goes idle, CompatWorker._idle)
        assert found is not None and found.get_current_job_id() is None, broken("scripts.SHOW (hidden once settled)")
    has_field = hasattr(SimpleWorker, "set_current_job_id")  # (RQ 2's writer of the current_job field)
    assert has_field is not names.WORKER_HAS_EXECUTIONS, broken("names.WORKER_HAS_EXECUTIONS")


def test_registry_keys_are_rqs(raw: redis.Redis) -> None:
    assert rq.registry.StartedJobRegistry("c", connection=raw).key == names.started_registry_key("c"), \
        broken("names.started_registry_key")
    assert rq.registry.FinishedJobRegistry("c", connection=raw).key == names.finished_registry_key("c"), \
        broken("names.finished_registry_key")
    assert rq.registry.FailedJobRegistry("c", connection=raw).key == names.failed_registry_key("c"), \
        broken("names.failed_registry_key")
    theirs = {cls("c", connection=raw).key for cls in vars(rq.registry).values()
              if inspect.isclass(cls) and issubclass(cls, rq.registry.BaseRegistry)
              and cls not in (rq.registry.BaseRegistry, rq.registry.StartedJobRegistry)
              and "{0}" in getattr(cls, "key_template", "")}
    assert theirs == set(names.job_registry_keys("c")), broken("names.job_registry_keys (every registry of a queue)")


def test_execution_keys_are_rqs(raw: redis.Redis) -> None:
    assert Execution(id="e", job_id="j", connection=raw).key == f"{names.EXECUTION_PREFIX}j:e", \
        broken("names.EXECUTION_PREFIX")
    assert rq.registry.__name__ and Job(id="j", connection=raw).execution_registry.key == \
        names.executions_registry_key("j"), broken("names.executions_registry_key")


def test_rq_scheduler_keeps_its_timers_in_the_scheduled_set(raw: redis.Redis) -> None:
    assert Scheduler.scheduled_jobs_key == names.SCHEDULED_KEY == loop_watch.SCHEDULED_KEY, \
        broken("names.SCHEDULED_KEY")


def test_moving_a_due_timer_does_what_rq_scheduler_does(raw: redis.Redis) -> None:
    """``scripts.MOVE_DUE`` mirrors rq-scheduler's ``enqueue_job``: queued, enqueued_at, pushed, entry gone."""
    sched = Scheduler(queue_name="loopsq", connection=raw)
    job = sched.enqueue_at(datetime(2000, 1, 1), f"{__name__}.noop")
    sched.enqueue_job(job)
    assert raw.hget(names.job_key(job.id), "status") == b"queued", broken("MOVE_DUE: status queued")
    assert raw.hget(names.job_key(job.id), names.ENQUEUED_AT), broken("MOVE_DUE: enqueued_at")
    assert raw.lrange(names.queue_key("loopsq"), 0, -1) == [job.id.encode()], broken("MOVE_DUE: pushed")
    assert raw.sismember(names.QUEUES_KEY, names.queue_key("loopsq")), broken("MOVE_DUE: queue listed")
    assert raw.zscore(names.SCHEDULED_KEY, job.id) is None, broken("MOVE_DUE: entry removed")


def test_a_job_hash_written_from_its_fields_is_one_rq_reads(raw: redis.Redis) -> None:
    fields = jobs.unsaved_job_fields(raw, "loopsq", timers.FIRE, ("l1",), "j1", 0)
    raw.hset(names.job_key("j1"), mapping=dict(zip(fields[::2], fields[1::2], strict=True)))
    raw.hset(names.job_key("j1"), "loopsq_taken", "1")
    job = Job.fetch("j1", connection=raw)
    assert (job.func_name, job.args, job.origin, job.result_ttl) == (timers.FIRE, ("l1",), "loopsq", 0), \
        broken("jobs.unsaved_job_fields (rq-scheduler's _create_job)")


def test_a_running_job_is_started_by_its_worker(raw: redis.Redis) -> None:
    """What maintenance reads of a running timer job (``timers.armed_state``) and ``scripts.TAKE_FIRE`` writes."""
    SEEN.clear()
    q = Queue("c", connection=raw)
    q.enqueue(f"{__name__}.record_own_hash")
    SimpleWorker([q], connection=raw, name="w1").work(burst=True, with_scheduler=False)
    assert SEEN and SEEN[0].get("status") == "started" and SEEN[0].get("worker_name") == "w1", \
        broken("a running job's hash: status 'started', worker_name")


def test_a_finished_job_is_settled_as_scripts_settle_it(raw: redis.Redis) -> None:
    """``scripts.SETTLE``: the worker's counts, status finished, the finished registry by result_ttl."""
    q = Queue("c", connection=raw)
    job = q.enqueue(f"{__name__}.noop", result_ttl=60)
    SimpleWorker([q], connection=raw, name="w1").work(burst=True, with_scheduler=False)
    assert raw.hget(names.job_key(job.id), "status") == b"finished", broken("SETTLE: status finished")
    assert raw.zscore(names.finished_registry_key("c"), job.id) is not None, broken("SETTLE: finished registry")
    worker = {k.decode() for k in raw.hkeys(names.worker_key("w1"))}
    assert {"successful_job_count", "total_working_time"} <= worker, broken("SETTLE: worker counts")


def test_a_job_kept_for_no_time_leaves_nothing(raw: redis.Redis) -> None:
    """``scripts.LEAN_DELETE`` deletes what RQ's ``Job.delete`` deletes (tests/integration/test_lean_job_delete
    compares both sides whole)."""
    q = Queue("c", connection=raw)
    job = q.enqueue(f"{__name__}.noop", result_ttl=0)
    CompatWorker([q], connection=raw, name="w1").work(burst=True, with_scheduler=False)
    left = [k.decode() for k in raw.keys(f"*{job.id}*")]
    assert left == [], broken(f"LEAN_DELETE: {left} left")


def test_fail_job_records_a_failure_as_rq_does(raw: redis.Redis) -> None:
    q = Queue("loopsq", connection=raw)
    job = q.enqueue(f"{__name__}.noop")
    jobs.fail_job(raw, job.id, "w1", "Traceback: boom", 60, 0.1)
    fetched = Job.fetch(job.id, connection=raw)
    assert fetched.get_status() == "failed", broken("jobs.fail_job: status")
    assert raw.zscore(names.failed_registry_key("loopsq"), job.id) is not None, broken("jobs.fail_job: registry")
    result = fetched.latest_result()
    assert result is not None and "boom" in (result.exc_string or ""), broken("jobs.fail_job: the error kept")


@pytest.mark.parametrize("text", [*OutageFilter.PER_TRY, OutageFilter.QUIT])
def test_rqs_worker_logs_the_lines_loopsq_filters(text: str) -> None:
    assert text in inspect.getsource(rq.worker.base), broken(f"RQ's log text {text!r} (worker.OutageFilter)")


@pytest.mark.parametrize("name", [
    "dequeue_job_and_maintain_ttl", "execute_job", "perform_job", "handle_job_success", "handle_job_failure",
    "handle_execution_ended", "heartbeat", "set_state", "set_shutdown_requested_date", "request_stop",
    "_shutdown", "maintain_heartbeats", "reorder_queues", "register_death", "unsubscribe",
    "_install_signal_handlers", "request_force_stop", "handle_warm_shutdown_request",
])
def test_the_worker_methods_compat_worker_overrides_exist(name: str) -> None:
    assert callable(getattr(SimpleWorker, name, None)), broken(f"SimpleWorker.{name} (worker.CompatWorker)")


def test_the_worker_attributes_compat_worker_uses_exist(raw: redis.Redis) -> None:
    w: Any = SimpleWorker([Queue("c", connection=raw)], connection=raw, name="w1")
    for attr in ("_ordered_queues", "_stop_requested", "max_connection_wait_time", "queue_class", "job_class",
                 "death_penalty_class", "job_monitoring_interval", "_exc_handlers",
                 "_shutdown_requested_date"):
        assert hasattr(w, attr), broken(f"SimpleWorker attribute {attr} (worker.CompatWorker)")
