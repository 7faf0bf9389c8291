"""The RQ worker loopsq's worker builds on (``CompatWorker``: RQ's ``SimpleWorker``, no fork per job), with every
override of RQ's worker methods loopsq needs: several jobs at once (slots), RQ's heartbeats of the jobs it runs,
warm shutdown, Redis outages ridden out, RQ's per-try log lines kept out of the log, and a job kept for no time
deleted without reads. What RQ's worker is and does is described in ``engine.rq_worker``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.exceptions import DequeueTimeout, StopRequested
from rq.job import Job
from rq.utils import now as rq_now
from rq.worker import WorkerStatus

from loopsq.engine.rqcompat import jobs, names
from loopsq.engine.rqcompat.worker_parts import JobBeat, LeanJob, NoDeathPenalty, OutageFilter, install_filter
from loopsq.engine.slots import Slots
from loopsq.state.outages import OutageLog, errors, is_configuration_error, is_transient, ride
from loopsq.system.signals import SignalPipe

__all__ = ["JobBeat", "LeanJob", "OutageFilter", "SimpleWorker", "WorkerStatus", "install_filter"]

#: The longest one blocking dequeue waits (whole seconds: RQ's BLPOP/BLMOVE timeout).
DEQUEUE_BLOCK_S = 1
#: How often the dequeue loop renews the worker's own RQ heartbeat while it waits.
HEARTBEAT_EVERY_S = 5.0
#: How often RQ's worker hash gets the newest job while the worker stays busy (busy/idle is written at once).
SHOW_JOB_EVERY_S = 1.0



class CompatWorker(SimpleWorker):
    """SimpleWorker that tells loopsq when a (warm) shutdown is requested, so the grace period starts, keeps
    RQ's heartbeats of the running job (``JobBeat``), rides out Redis outages around a job, and runs several jobs
    at once on its slots. loopsq's worker (``engine.rq_worker._Worker``) adds its own way of running a timer's fire
    job; every override of RQ's worker methods is here."""

    job_class = LeanJob
    on_stop: Callable[[], None] | None = None
    outage: OutageLog | None = None
    #: A stop was requested (RQ raises StopRequested inside its loop when idle, leaving no other trace).
    stop_requested = False
    _beat: JobBeat | None = None
    #: The worker's slots; None: one job at a time on the main thread, RQ's own dequeue (a plain worker).
    slots: Slots | None = None
    #: The queue names to listen on now (``routing.QueueWatch.names``); None: the ones it was made with.
    listen_on: Callable[[], list[str]] | None = None
    #: On a slot's worker: the worker that dequeued (it shows the state; the slot's worker runs the job).
    main: CompatWorker | None = None
    _slot_workers: dict[int, CompatWorker] | None = None
    #: The last dequeue handed a job out: more may be waiting, taken the cheap way first (``_take_queued_fire``).
    _handed_out = False
    _next_heartbeat = 0.0
    #: What ``_show_state`` last wrote (state, job), and when.
    _shown: tuple[str, str | None] | None = None
    _shown_at = 0.0
    _show_lock = threading.Lock()
    #: The class a slot runs its jobs with (a ``SlotMixin`` subclass of this worker's class).
    slot_worker_class: type[CompatWorker]

    _signals: SignalPipe | None = None

    def request_stop(self, signum: Any, frame: Any) -> None:
        self.stop_requested = True
        if self.on_stop is not None:
            self.on_stop()
        super().request_stop(signum, frame)  # type: ignore[no-untyped-call]

    def _install_signal_handlers(self) -> None:
        """RQ's handlers do their work inside the signal handler: the grace timer's thread start, RQ's log lines,
        a Redis write through the connection pool, each taking a lock the interrupted main thread may hold
        (``system.signals``). With slots the first SIGTERM/SIGINT is acted on by a thread of its own instead;
        a second one is RQ's cold stop, as before (it takes no lock: it raises ``SystemExit``)."""
        if self.slots is None:
            super()._install_signal_handlers()  # type: ignore[no-untyped-call]
            return
        if self._signals is not None:
            self._signals.restore()

        def repeat(signum: int, frame: FrameType | None) -> None:
            if self._shutdown_requested_date is None:  # (the first is not acted on yet: this is its double)
                self._shutdown_requested_date = rq_now()
            self.request_force_stop(signum, frame)  # type: ignore[no-untyped-call, unused-ignore]

        self._signals = SignalPipe(self._warm_stop, name="loopsq-worker-signals", repeat=repeat).install()

    def _warm_stop(self, signum: int) -> None:
        """What RQ's ``request_stop`` does, off the signal handler (its handler swap is ``SignalPipe``'s repeat)."""
        self._shutdown_requested_date = rq_now()
        self.stop_requested = True
        if self.on_stop is not None:
            self.on_stop()
        self.log.debug("Worker %s: got signal %s", self.name, signum)
        self.handle_warm_shutdown_request()  # type: ignore[no-untyped-call, unused-ignore]
        self._shutdown()

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

    def _starts_itself(self, job: Job) -> bool:
        """Whether ``execute_here`` records the start of ``job`` itself (and shows the worker busy with it), not
        RQ's way: loopsq's worker says so of a timer's fire job (``rq_worker._Worker``)."""
        return False

    def _take_queued_fire(self) -> bool:
        """Hand a job waiting in a queue to a free slot without RQ's dequeue (loopsq's worker takes a timer's fire
        job so: ``rq_worker._Worker``); False when none was."""
        return False

    def _listen(self) -> None:
        """Listen on the queues ``listen_on`` gives now (RQ's worker hash shows them)."""
        if self.listen_on is None:
            return
        names = self.listen_on()
        if names == [q.name for q in self.queues]:
            return
        self.queues = [jobs.queue(self.connection, name) for name in names]
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
        if names.WORKER_HAS_EXECUTIONS:
            shown = (shown[0], None)  # (RQ 3 shows the jobs by their executions, which RQ and the scripts write)
        now = time.monotonic()
        if shown == self._shown or (self._shown is not None and shown[0] == self._shown[0]
                                    and now < self._shown_at + SHOW_JOB_EVERY_S):
            return  # (the newest job is shown at most every SHOW_JOB_EVERY_S; busy/idle at once)
        self._shown_at = now

        def write() -> None:
            with self.connection.pipeline() as pipe:
                pipe.hset(self.key, "state", shown[0])
                if names.WORKER_HAS_EXECUTIONS:
                    pass
                elif shown[1] is not None:
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
            if self._starts_itself(job):
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

    def _slot_worker(self, number: int, listened: list[Queue]) -> CompatWorker:
        """The worker a slot runs its jobs with: RQ's per-job state (its execution, its job) is its own; its
        name, connection and queues are this worker's."""
        if self._slot_workers is None:
            self._slot_workers = {}
        worker = self._slot_workers.get(number)
        if worker is None:
            worker = self.slot_worker_class(self.queues, connection=self.connection, name=self.name,
                                 exception_handlers=self._exc_handlers or None)
            worker.main, worker.outage, worker.on_stop = self, self.outage, None
            worker.job_monitoring_interval = self.job_monitoring_interval
            self._slot_workers[number] = worker
        worker.queues = listened
        return worker

    def execute_here(self, job: Job, queue: Queue) -> None:
        """Run ``job`` on this thread as RQ's ``SimpleWorker`` does (loopsq's worker runs a timer's fire job its
        own way: ``rq_worker._Worker``)."""
        super().execute_job(job, queue)

    def _idle(self) -> None:
        with self.connection.pipeline() as pipe:
            self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            if not names.WORKER_HAS_EXECUTIONS:  # (RQ 3: the job's settling dropped its execution)
                self.set_current_job_id(None, pipeline=pipe)
            pipe.execute()

    def perform_job(self, job: Job, queue: Queue, *execution: Any) -> bool:
        """RQ's ``perform_job`` (RQ 3 passes the job's execution, which its heartbeats need; RQ 2 keeps it on the
        worker), with the job's heartbeats renewed meanwhile."""
        self._beat = JobBeat(self, job, self.job_monitoring_interval,
                             beat=lambda: self.maintain_heartbeats(job, *execution))
        try:
            return bool(super().perform_job(job, queue, *execution))
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
        if names.WORKER_HAS_EXECUTIONS:
            return ride(fn, self.outage)  # (RQ 3 passes the execution along: nothing on the worker to restore)
        execution = self.execution

        def attempt() -> Any:
            self.execution = execution
            return fn()

        return ride(attempt, self.outage)

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        self._ride(lambda: super(CompatWorker, self).handle_execution_ended(job, queue, heartbeat_ttl))

    def handle_job_success(self, *args: Any, **kwargs: Any) -> None:
        self._stop_beat()
        self._ride(lambda: super(CompatWorker, self).handle_job_success(*args, **kwargs))

    def handle_job_failure(self, *args: Any, **kwargs: Any) -> None:
        self._stop_beat()
        self._ride(lambda: super(CompatWorker, self).handle_job_failure(*args, **kwargs))

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
        self._best_effort(lambda: super(CompatWorker, self).heartbeat(timeout))

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is not None:
            super().set_state(state, pipeline)
            return
        self._best_effort(lambda: super(CompatWorker, self).set_state(state))

    def set_shutdown_requested_date(self) -> None:
        # Called from the SIGTERM handler: an exception here would surface in whatever the job is doing.
        self._best_effort(super().set_shutdown_requested_date)




class SlotMixin(CompatWorker):
    """The worker a slot runs its job with (``CompatWorker._slot_worker``): never registered nor dequeuing; the state
    RQ shows is the dequeuing worker's to write, and RQ's job timeout (SIGALRM) is off on a thread."""

    death_penalty_class = NoDeathPenalty

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if str(getattr(state, "value", state)) == "busy":
            super().set_state(state, pipeline)


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
