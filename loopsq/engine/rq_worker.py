"""loopsq's RQ worker: RQ's ``SimpleWorker`` (no fork per job) on loopsq's queues, which runs several jobs at once
(its slots), renews RQ's heartbeats of the jobs it runs, tells loopsq when a warm shutdown starts, and rides out
Redis outages.

- **Slots** (``engine.slots``): the main thread dequeues from RQ only while a slot is free, and hands each job to a
  slot's thread, where a worker of its own (``_SlotWorker``: the same RQ name, its own execution) runs it as
  RQ's ``SimpleWorker`` would. RQ's worker hash shows the worker busy while any slot is, with the newest job.
- **Queues**: it listens on the queues its labels qualify it for (``routing.QueueWatch``), refreshed between
  dequeues, so a requirement set created while it runs is served without a restart. Each blocking dequeue waits
  ``DEQUEUE_BLOCK_S`` at most: a stop request, a new queue or a freed slot is seen within it.
- **Stops**: a SIGTERM never interrupts the main thread (RQ raises ``StopRequested`` into it when idle, which can
  drop a job between its dequeue and its start): it is noticed by the dequeue loop instead.

- ``_JobBeat`` renews RQ's heartbeats of the running job, which RQ's ``SimpleWorker`` does not do by itself.
- RQ's bookkeeping around a job (its end, its failure) is retried until Redis is back, so a job that ran is
  recorded as RQ would record it; writes RQ only displays (worker state, heartbeat) are skipped meanwhile.
- A job kept for no time (``result_ttl=0``: timer fire jobs) is deleted in one script queued in RQ's own
  end-of-job transaction (``_LeanJob``), where RQ's ``Job.delete`` first reads its status three times and its
  executions twice: nine round trips a job, a third of a lone fire's.
- RQ's own per-try "could not connect" lines go to the process's ``OutageLog`` instead (one line per outage).
  When RQ's loop quits on a Redis failure anyway, ``work`` says so, and the caller waits for Redis, ``restart``s
  and works again under the same name (the same worker id, so its runs stay its own).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.exceptions import DequeueTimeout, StopRequested
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from rq.timeouts import BaseDeathPenalty
from rq.worker import WorkerStatus

from loopsq.engine import fire_queue, runner, timers
from loopsq.engine.runtime import current_runtime
from loopsq.engine.slots import Slots
from loopsq.engine.timers import queue
from loopsq.state.outages import OutageLog, errors, is_configuration_error, is_transient, ride

log = logging.getLogger("loopsq.timers")

#: The longest one blocking dequeue waits (whole seconds: RQ's BLPOP/BLMOVE timeout).
DEQUEUE_BLOCK_S = 1
#: How often the dequeue loop renews the worker's own RQ heartbeat while it waits.
HEARTBEAT_EVERY_S = 5.0
#: How often RQ's worker hash gets the newest job while the worker stays busy (busy/idle is written at once).
SHOW_JOB_EVERY_S = 1.0


class _NoDeathPenalty(BaseDeathPenalty):
    """No RQ job timeout on a slot's thread (RQ's default uses SIGALRM, main thread only): loopsq's jobs never
    time out in RQ (``timers.queue``), their targets' timeouts are loopsq's own."""

    def setup_death_penalty(self) -> None:
        return None

    def cancel_death_penalty(self) -> None:
        return None


class _JobBeat:
    """Renews RQ's heartbeats of the job a ``SimpleWorker`` executes (its own, its execution's, the worker's),
    as RQ's forking worker does from its parent process. Without it RQ keeps them for 420 s only: a longer run
    (an agent, a workflow) has its job marked failed with ``AbandonedJobError`` by another worker's registry
    cleanup while it still runs, and the worker drops out of RQ's worker list."""

    def __init__(self, worker: SimpleWorker, job: Job, every_s: float,
                 beat: Callable[[], object] | None = None) -> None:
        self._worker, self._job, self._every_s = worker, job, every_s
        #: What each beat renews (default: RQ's heartbeats of the job, its execution and the worker).
        self._beat_fn = beat or (lambda: worker.maintain_heartbeats(job))
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="loopsq-rq-job-beat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    self._beat_fn()
                except redis.RedisError as exc:
                    outage = getattr(self._worker, "outage", None)
                    if outage is not None and is_transient(exc):
                        outage.failed(exc)  # logged once per outage
                    else:
                        errors.report("the renewal of RQ's heartbeat of a job", exc)

    def stop(self) -> None:
        """No heartbeat after this returns (RQ is about to record the job's end)."""
        self._stop.set()
        with self._lock:
            pass


# What RQ's ``Job.delete(remove_from_queue=False)`` does, without reading first: every execution of the job (its
# hash, its member in the started registry), the executions registry, the job's member in each other registry of
# its queue (RQ removes it from the one its status names; ZREM of an absent member changes nothing), and the job's
# hash, dependents and dependencies keys. KEYS: job, dependents, dependencies, executions, started, the others.
# ARGV: the execution hash prefix of the job, the job id.
_LEAN_DELETE = """
for _, eid in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  redis.call('DEL', ARGV[1] .. eid)
  redis.call('ZREM', KEYS[5], ARGV[2] .. ':' .. eid)
end
redis.call('DEL', KEYS[4])
for i = 6, #KEYS do redis.call('ZREM', KEYS[i], ARGV[2]) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return 1
"""

_OTHER_REGISTRIES = (FinishedJobRegistry, DeferredJobRegistry, ScheduledJobRegistry, FailedJobRegistry,
                     CanceledJobRegistry)


class _LeanJob(Job):
    """RQ's job, deleted without reads when that happens inside a transaction (see ``_LEAN_DELETE``)."""

    def delete(self, pipeline: Any = None, remove_from_queue: bool = True, delete_dependents: bool = False) -> None:
        if pipeline is None or remove_from_queue or delete_dependents or self.group_id:
            super().delete(pipeline=pipeline, remove_from_queue=remove_from_queue,
                           delete_dependents=delete_dependents)
            return
        keys = [self.key, self.dependents_key, self.dependencies_key, ExecutionRegistry.key_template.format(self.id),
                StartedJobRegistry.key_template.format(self.origin),
                *(registry.key_template.format(self.origin) for registry in _OTHER_REGISTRIES)]
        prefix = Execution(id="", job_id=self.id, connection=self.connection).key
        pipeline.eval(_LEAN_DELETE, len(keys), *keys, prefix, self.id)


class _Worker(SimpleWorker):
    """SimpleWorker that tells loopsq when a (warm) shutdown is requested, so the grace period starts, keeps
    RQ's heartbeats of the running job (``_JobBeat``), and rides out Redis outages around a job."""

    job_class = _LeanJob
    on_stop: Callable[[], None] | None = None
    outage: OutageLog | None = None
    #: A stop was requested (RQ raises StopRequested inside its loop when idle, leaving no other trace).
    stop_requested = False
    _beat: _JobBeat | None = None
    #: The worker's slots; None: one job at a time on the main thread, RQ's own dequeue (a plain worker).
    slots: Slots | None = None
    #: The queue names to listen on now (``routing.QueueWatch.names``); None: the ones it was made with.
    listen_on: Callable[[], list[str]] | None = None
    #: On a slot's worker: the worker that dequeued (it shows the state; the slot's worker runs the job).
    main: _Worker | None = None
    _slot_workers: dict[int, _Worker] | None = None
    #: The last dequeue handed a job out: more may be waiting, taken the cheap way first (``_take_queued_fire``).
    _handed_out = False
    _next_heartbeat = 0.0
    #: What ``_show_state`` last wrote (state, job), and when.
    _shown: tuple[str, str | None] | None = None
    _shown_at = 0.0
    _show_lock = threading.Lock()

    def request_stop(self, signum: Any, frame: Any) -> None:
        self.stop_requested = True
        if self.on_stop is not None:
            self.on_stop()
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def _shutdown(self) -> None:
        if self.slots is None:
            super()._shutdown()  # type: ignore[no-untyped-call]
            return
        # Never StopRequested into the main thread (it could drop a job between its dequeue and its start): the
        # dequeue loop sees the request within DEQUEUE_BLOCK_S and ends RQ's loop; the slots then drain.
        self._stop_requested = True
        self._best_effort(self.set_shutdown_requested_date)

    # -- slots and queues ----------------------------------------------------------------------------------------
    def dequeue_job_and_maintain_ttl(self, timeout: int | None,
                                     max_idle_time: int | None = None) -> tuple[Job, Queue] | None:
        """RQ's dequeue, taking a job only while a slot is free, from the queues this worker listens on now."""
        if self.slots is None:
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        burst = timeout is None
        idle_since = time.monotonic()
        wait_s = 1.0
        while True:
            self.heartbeat()  # (at most every HEARTBEAT_EVERY_S)
            if self._stop_requested:
                return None
            if not self.slots.wait_free(DEQUEUE_BLOCK_S):
                continue
            self._listen()
            with self._show_lock:
                self._show_state()
            try:
                if self._handed_out and self._take_queued_fire():
                    continue  # (a slot took it; while jobs keep coming, take the next one the same way)
                self._handed_out = False
                result = self.queue_class.dequeue_any(
                    self._ordered_queues, None if burst else DEQUEUE_BLOCK_S, connection=self.connection,
                    job_class=self.job_class, serializer=self.serializer,
                    death_penalty_class=self.death_penalty_class)
            except DequeueTimeout:
                if max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                    return None
                continue
            except redis.exceptions.ConnectionError as exc:
                self.log.error("Worker %s: could not connect to Redis instance: %s retrying in %d seconds...",
                               self.name, exc, wait_s)
                time.sleep(wait_s)
                wait_s = min(wait_s * 2, self.max_connection_wait_time)
                continue
            if result is not None:
                self.reorder_queues(reference_queue=result[1])
                self._handed_out = True
            return result

    def _take_queued_fire(self) -> bool:
        """Hand the timer job at the head of a queue this worker listens on to a free slot, taken in one script
        (``timers.take_fire``: no RQ fetch, no unpickling, as a fire job takes the ones behind it): what keeps a
        burst of due loops from waiting behind this one thread's dequeues. False when no queue's head is one."""
        rt = current_runtime()
        if rt is None or self.slots is None:
            return False
        for q in self._ordered_queues:
            taken = timers.take_fire(self.connection, self.name, queue_name=q.name)
            if taken is not None:
                self.slots.start(taken.job_id, partial(self._fire_on_slot, taken, q.name))
                return True
        return False

    def _fire_on_slot(self, taken: timers.Taken, queue_name: str, _slot: int) -> None:
        self._fire_taken(taken, queue_name)

    def _fire_taken(self, taken: timers.Taken, queue_name: str) -> None:
        """Run a taken timer job on this slot, and settle it as RQ would (``fire_queue``)."""
        rt = current_runtime()
        assert rt is not None
        started = time.monotonic()
        try:
            runner.fire(rt, taken.loop_id, taken=taken)
        except Exception:
            log.exception("fire of loop=%s (timer job %s, taken from the queue) failed", taken.loop_id, taken.job_id)
            fire_queue.fail_taken(rt, taken.job_id, traceback.format_exc(), time.monotonic() - started)
        else:
            fire_queue.fire_queued(rt, done_job=(taken.job_id, time.monotonic() - started), queue_name=queue_name)
        finally:
            with self._show_lock:
                self._show_state(without=taken.job_id)

    def _listen(self) -> None:
        """Listen on the queues ``listen_on`` gives now (RQ's worker hash shows them)."""
        if self.listen_on is None:
            return
        names = self.listen_on()
        if names == [q.name for q in self.queues]:
            return
        self.queues = [queue(self.connection, name) for name in names]
        self._ordered_queues = self.queues[:]
        self._best_effort(lambda: self.connection.hset(self.key, "queues", ",".join(names)))

    def _show_state(self, without: str | None = None) -> None:
        """RQ's worker hash: busy with the newest job while any slot runs one (but ``without``, a job that is
        ending), else idle; written when it changes."""
        if self.slots is None:
            return
        jobs = [job for job in self.slots.jobs() if job != without]
        self._state = WorkerStatus.BUSY if jobs else WorkerStatus.IDLE
        shown = ("busy", jobs[-1]) if jobs else ("idle", None)
        now = time.monotonic()
        if shown == self._shown or (self._shown is not None and shown[0] == self._shown[0]
                                    and now < self._shown_at + SHOW_JOB_EVERY_S):
            return  # (the newest job is shown at most every SHOW_JOB_EVERY_S; busy/idle at once)
        self._shown_at = now

        def write() -> None:
            with self.connection.pipeline() as pipe:
                pipe.hset(self.key, "state", shown[0])
                if shown[1] is not None:
                    pipe.hset(self.key, "current_job", shown[1])
                else:
                    pipe.hdel(self.key, "current_job")
                pipe.execute()
            self._shown = shown

        self._best_effort(write)

    def execute_job(self, job: Job, queue: Queue) -> None:
        """On a worker with slots, the job runs on a free slot's thread (the main thread goes back to dequeuing);
        otherwise here (``execute_here``)."""
        if self.slots is None or self.main is not None:
            self.execute_here(job, queue)
            return
        listened = self.queues  # (as dequeued: RQ judges by their number whether the job sits in an intermediate list)
        self.slots.start(job.id, lambda number: self._run_on_slot(number, job, queue, listened))
        with self._show_lock:
            if timers.is_fire_job(job) and current_runtime() is not None:
                # Its start (``timers.start_dequeued``, on the slot) shows the worker busy with it: no write here.
                self._state, self._shown, self._shown_at = WorkerStatus.BUSY, ("busy", job.id), time.monotonic()
            else:
                self._show_state()

    def _run_on_slot(self, number: int, job: Job, queue: Queue, listened: list[Queue]) -> None:
        try:
            self._slot_worker(number, listened).execute_here(job, queue)
        finally:
            with self._show_lock:
                self._show_state(without=job.id)

    def _slot_worker(self, number: int, listened: list[Queue]) -> _Worker:
        """The worker a slot runs its jobs with: RQ's per-job state (its execution, its job) is its own; its
        name, connection and queues are this worker's."""
        if self._slot_workers is None:
            self._slot_workers = {}
        worker = self._slot_workers.get(number)
        if worker is None:
            worker = _SlotWorker(self.queues, connection=self.connection, name=self.name,
                                 exception_handlers=self._exc_handlers or None)
            worker.main, worker.outage, worker.on_stop = self, self.outage, None
            worker.job_monitoring_interval = self.job_monitoring_interval
            self._slot_workers[number] = worker
        worker.queues = listened
        return worker

    def execute_here(self, job: Job, queue: Queue) -> None:
        """A loop timer's fire job is run as the ones a fire takes from the queue (``fire_queue.fire_queued``), not
        through RQ's per-job bookkeeping (an execution, the started registry, the job's status read back and
        written again: 13 round trips a job): one script takes it, and it is settled as RQ settles a job in the
        round trip that looks for the next one. RQ's registries and the worker's counts and state show it as RQ
        would (``timers.start_dequeued``, ``timers.take_fire``). Any other job, and a fire job without loopsq's
        runtime in this process, goes RQ's way."""
        rt = current_runtime()
        if rt is None or not timers.is_fire_job(job):
            super().execute_job(job, queue)
            return
        started = time.monotonic()
        if self.main is None:
            self._state = WorkerStatus.BUSY  # (what set_state records here; the script records it in Redis)
        self._ride(lambda: timers.start_dequeued(self.connection, job, self.name))
        # (On a slot, the dequeuing worker's loop renews the worker's heartbeat.)
        beat = _JobBeat(self, job, self.job_monitoring_interval,
                        beat=lambda: self.heartbeat(self.job_monitoring_interval + 60)) if self.main is None else None
        error: str | None = None
        try:
            runner.fire(rt, timers.fire_loop_id(job.id), taken=timers.taken_of(job))
        except Exception:
            log.exception("fire job %s failed", job.id)
            error = traceback.format_exc()
        finally:
            if beat is not None:
                beat.stop()
        if error is None:
            fire_queue.fire_queued(rt, done_job=(job.id, time.monotonic() - started), queue_name=queue.name)
        else:
            fire_queue.fail_taken(rt, job.id, error, time.monotonic() - started)
        if self.main is not None:
            return  # (the dequeuing worker shows the state)
        self._state = WorkerStatus.IDLE
        self._best_effort(self._idle)

    def _idle(self) -> None:
        with self.connection.pipeline() as pipe:
            self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            self.set_current_job_id(None, pipeline=pipe)
            pipe.execute()

    def perform_job(self, job: Job, queue: Queue) -> bool:
        self._beat = _JobBeat(self, job, self.job_monitoring_interval)
        try:
            return bool(super().perform_job(job, queue))
        finally:
            self._stop_beat()

    def _stop_beat(self) -> None:
        if self._beat is not None:
            self._beat.stop()
            self._beat = None

    def _ride(self, fn: Callable[[], Any]) -> Any:
        """RQ's bookkeeping of a job, retried until Redis takes it (each try starts from the same execution)."""
        if self.outage is None:
            return fn()
        execution = self.execution

        def attempt() -> Any:
            self.execution = execution
            return fn()

        return ride(attempt, self.outage)

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        self._ride(lambda: super(_Worker, self).handle_execution_ended(job, queue, heartbeat_ttl))

    def handle_job_success(self, *args: Any, **kwargs: Any) -> None:
        self._stop_beat()
        self._ride(lambda: super(_Worker, self).handle_job_success(*args, **kwargs))

    def handle_job_failure(self, *args: Any, **kwargs: Any) -> None:
        self._stop_beat()
        self._ride(lambda: super(_Worker, self).handle_job_failure(*args, **kwargs))

    def _best_effort(self, fn: Callable[[], Any]) -> None:
        """A write RQ only displays (worker state, heartbeat, shutdown date): skipped while Redis is away."""
        try:
            fn()
        except redis.RedisError as exc:
            if is_configuration_error(exc):
                raise
            if not is_transient(exc):
                errors.report("RQ's worker bookkeeping", exc)
            elif self.outage is not None:
                self.outage.failed(exc)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
            return
        if self.slots is not None and timeout is None:
            # RQ's loop beats after every job it hands to a slot: once every HEARTBEAT_EVERY_S is plenty (RQ keeps a
            # worker for 420 s), and a round trip less per job on the dequeuing thread.
            now = time.monotonic()
            if now < self._next_heartbeat:
                return
            self._next_heartbeat = now + HEARTBEAT_EVERY_S
        self._best_effort(lambda: super(_Worker, self).heartbeat(timeout))

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().set_state(state, pipeline)
            return
        self._best_effort(lambda: super(_Worker, self).set_state(state))

    def set_shutdown_requested_date(self) -> None:
        # Called from the SIGTERM handler: an exception here would surface in whatever the job is doing.
        self._best_effort(super().set_shutdown_requested_date)


class _SlotWorker(_Worker):
    """The worker a slot runs its job with (``_Worker._slot_worker``): never registered nor dequeuing; the state
    RQ shows is the dequeuing worker's to write, and RQ's job timeout (SIGALRM) is off on a thread."""

    death_penalty_class = _NoDeathPenalty

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if str(getattr(state, "value", state)) == "busy":
            super().set_state(state, pipeline)


class _OutageFilter(logging.Filter):
    """Drops RQ's per-try lines about an unreachable Redis, and reports the failure to the ``OutageLog``."""

    PER_TRY = ("Worker %s: could not connect to Redis instance", "Worker %s: Redis connection timeout")
    QUIT = "Worker %s: found an unhandled exception, quitting"

    def __init__(self, outage: OutageLog) -> None:
        super().__init__("rq.worker")
        self.outage = outage

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        if msg.startswith(self.PER_TRY):
            exc = next((a for a in record.args or () if isinstance(a, BaseException)), None)
            self.outage.failed(exc or redis.ConnectionError(msg % record.args if record.args else msg))
            return False
        exc = record.exc_info[1] if msg.startswith(self.QUIT) and record.exc_info else None
        if exc is not None and is_transient(exc):
            self.outage.failed(exc)
            return False
        if isinstance(exc, redis.RedisError) and not is_configuration_error(exc):
            # (loopsq starts RQ's loop again: a WRONGTYPE there is logged once per kind, not once per restart)
            errors.report("RQ's work loop", exc)
            return False
        return True


def _install_filter(outage: OutageLog) -> None:
    rq_log = logging.getLogger("rq.worker")
    for old in [f for f in rq_log.filters if isinstance(f, _OutageFilter)]:
        rq_log.removeFilter(old)
    rq_log.addFilter(_OutageFilter(outage))


def make_worker(raw: redis.Redis, name: str, exception_handler: Callable[..., Any] | None = None,
                on_stop: Callable[[], None] | None = None, outage: OutageLog | None = None,
                slots: Slots | None = None, queue_names: Callable[[], list[str]] | None = None) -> SimpleWorker:
    """An RQ worker on loopsq's queue that runs jobs in its own process (no fork per job).

    With ``slots`` it runs up to that many jobs at once, each on a slot's thread, and listens on the queues
    ``queue_names`` gives (refreshed between dequeues; default: the base queue).

    loopsq's jobs start their targets as separate process groups already, and its leases, heartbeats and cancel
    polling live in this process, so RQ's fork-per-job isolation would only add ~12 ms per job. On SIGTERM RQ
    stops taking jobs and lets the current one finish (warm shutdown); ``on_stop`` is called first. With
    ``outage``, RQ's bookkeeping around a job rides out Redis outages, reported there.
    """
    handlers = [exception_handler] if exception_handler else None
    names = queue_names() if queue_names is not None else [timers.QUEUE_NAME]
    worker = _Worker([queue(raw, n) for n in names], connection=raw, name=name, exception_handlers=handlers)
    worker.on_stop = on_stop
    worker.outage = outage
    worker.slots, worker.listen_on = slots, queue_names
    worker._show_lock = threading.Lock()
    # RQ waits up to 60 s between reconnection tries by default; a restarted Redis should be used at once.
    worker.max_connection_wait_time = 2.0
    if outage is not None:
        _install_filter(outage)
    return worker


def work(worker: SimpleWorker, *, burst: bool = False) -> bool:
    """Run RQ's work loop: True when it ended as asked (a stop request, or ``burst`` and the queue empty), False
    when it quit on a failure (Redis going away or refusing writes, or any Redis error but a configuration
    error); then wait for Redis and call ``restart`` and ``work`` again."""
    try:
        worker.work(burst=burst, logging_level="WARNING", with_scheduler=False)
    except StopRequested:
        return True
    except redis.RedisError as exc:  # raised by RQ's start or teardown, or after its loop quit
        if is_configuration_error(exc):
            raise
        outage = getattr(worker, "outage", None)
        if not is_transient(exc):
            errors.report("RQ's work loop", exc)  # a bug or corrupted data: the same worker starts again
        elif outage is not None:
            outage.failed(exc)
        return bool(getattr(worker, "stop_requested", False))
    return burst or bool(getattr(worker, "stop_requested", False))


def restart(worker: Any) -> None:
    """Clean up after a ``work`` that quit, so a new worker of the same name can register (Redis must answer)."""
    with contextlib.suppress(Exception):
        worker.unsubscribe()
    worker.register_death()
