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

import logging
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

import redis

from loopsq.engine import fire_queue, runner, timers
from loopsq.engine.rqcompat.jobs import Job, Queue
from loopsq.engine.rqcompat.worker import (
    DEQUEUE_BLOCK_S,
    HEARTBEAT_EVERY_S,
    SHOW_JOB_EVERY_S,
    CompatWorker,
    JobBeat,
    LeanJob,
    SimpleWorker,
    SlotMixin,
    WorkerStatus,
    install_filter,
    restart,
    work,
)
from loopsq.engine.runtime import current_runtime
from loopsq.engine.slots import Slots
from loopsq.engine.timers import queue
from loopsq.state.outages import OutageLog

__all__ = ["DEQUEUE_BLOCK_S", "HEARTBEAT_EVERY_S", "SHOW_JOB_EVERY_S", "LeanJob", "make_worker", "restart", "work"]

log = logging.getLogger("loopsq.timers")


class _Worker(CompatWorker):
    """loopsq's RQ worker: ``CompatWorker`` (RQ's ``SimpleWorker`` with slots, job heartbeats and outages ridden
    out) that runs a loop timer's fire job without RQ's per-job bookkeeping (``execute_here``) and hands the fire
    jobs waiting at a queue's head to free slots the cheap way (``_take_queued_fire``)."""

    def _starts_itself(self, job: Job) -> bool:
        return timers.is_fire_job(job) and current_runtime() is not None

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

    def execute_here(self, job: Job, queue: Queue) -> None:
        """A loop timer's fire job is run as the ones a fire takes from the queue (``fire_queue.fire_queued``), not
        through RQ's per-job bookkeeping (an execution, the started registry, the job's status read back and
        written again: 13 round trips a job): one script takes it, and it is settled as RQ settles a job in the
        round trip that looks for the next one. RQ's registries and the worker's counts and state show it as RQ
        would (``timers.start_dequeued``, ``timers.take_fire``). Any other job, and a fire job without loopsq's
        runtime in this process, goes RQ's way."""
        rt = current_runtime()
        if rt is None or not timers.is_fire_job(job):
            super().execute_here(job, queue)
            return
        started = time.monotonic()
        if self.main is None:
            self._state = WorkerStatus.BUSY  # (what set_state records here; the script records it in Redis)
        self._ride(lambda: timers.start_dequeued(self.connection, job, self.name))
        # (On a slot, the dequeuing worker's loop renews the worker's heartbeat.)
        beat = JobBeat(self, job, self.job_monitoring_interval,
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


class _SlotWorker(SlotMixin, _Worker):
    """The worker a slot runs its job with: loopsq's worker, as a slot's (``SlotMixin``)."""


_Worker.slot_worker_class = _SlotWorker


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
        install_filter(outage)
    return worker


