"""A fire job goes on to fire the timer jobs queued right behind it, without RQ's per-job bookkeeping, and settles
each as RQ settles a job it ran (``timers.take_fire``, ``finish_taken``, ``fail_taken``); loopsq's worker settles a
fire job RQ dequeued for it the same way (``rq_worker._Worker.execute_job``)."""

from __future__ import annotations

import logging
import time
import traceback

from loopsq.engine import runner, timers
from loopsq.engine.runtime import Runtime

log = logging.getLogger("loopsq.runs")

#: How long one fire job goes on taking the timer jobs queued behind it before it hands the worker back to RQ.
DRAIN_BUDGET_S = 5.0


def fire_queued(rt: Runtime, budget_s: float = DRAIN_BUDGET_S, *,
                done_job: tuple[str, float] | None = None, queue_name: str | None = None) -> runner.FireResult:
    """Fire the loops whose timer jobs wait at the head of loopsq's queue, one after another, as this worker
    would once RQ dequeued them, but without RQ's per-job bookkeeping (about half the cost of a short run).

    A fire job calls this when it is done with its own loop. It stops at the first queued job that is not a
    timer's (order is kept), when the queue is empty, after ``budget_s``, or once a shutdown is requested. Other
    workers keep dequeuing the same queue meanwhile, so nothing waits longer than it would have. Each taken job is
    marked started by this worker until done: a kill -9 leaves it orphaned, and maintenance re-arms its loop.
    Once done it is settled as RQ settles a job (``timers.take_fire``): the worker's counts, the finished
    registry by its result_ttl; one whose fire raised is failed in RQ under its own id and error
    (``timers.fail_taken``) and the next is taken, so the host job never carries another job's error.

    ``done_job``: (id, seconds) of a taken job this worker has finished already (the fire job loopsq's worker
    took from RQ itself: ``rq_worker._Worker``), settled in the first round trip. ``queue_name``: the queue it
    came from, the one drained (every job there is one this worker may run); default: the base queue of the
    runtime's namespace.
    """
    queue_name = queue_name or rt.keys.base_queue
    out = runner.FireResult()
    deadline = time.monotonic() + budget_s
    done: str | None = done_job[0] if done_job else None
    took = done_job[1] if done_job else 0.0
    worker = rt.owner.worker_id
    try:
        while not rt.stopping and time.monotonic() < deadline:
            taken = timers.take_fire(rt.raw, worker, done, took, queue_name)
            done = None
            if taken is None:
                break
            job_id, loop_id = taken.job_id, taken.loop_id
            out.taken += 1
            started = time.monotonic()
            try:
                out.absorb(runner.fire(rt, loop_id, taken=taken))
            except Exception:
                # Recorded as RQ records a failed job, under the taken job's own id and error (not the host job's).
                log.exception("fire of loop=%s (timer job %s, taken from the queue) failed", loop_id, job_id)
                fail_taken(rt, job_id, traceback.format_exc(), time.monotonic() - started)
                continue
            done, took = job_id, time.monotonic() - started
    finally:
        if done is not None:
            _finish_taken(rt, done, took)
    return out


#: How long dropping a taken job's hash waits for an unreachable Redis when the runtime does not ride outages
#: itself (a plain ``rq worker``; ``loopsq worker``'s clients wait anyway).
FINISH_WAIT_S = 30.0


def fail_taken(rt: Runtime, job_id: str, error: str, took_s: float) -> None:
    """Record a taken timer job as failed (``timers.fail_taken``), riding out a Redis outage."""
    rt.ride(lambda: timers.fail_taken(rt.raw, job_id, rt.owner.worker_id, error, took_s),
            deadline=time.monotonic() + FINISH_WAIT_S)


def _finish_taken(rt: Runtime, job_id: str, took_s: float = 0.0) -> None:
    """Drop a taken timer job, riding out a Redis outage.

    A job left marked started by this live worker would count as in flight until the worker dies, and its loop
    would get no new timer meanwhile. If Redis stays away longer (a runtime that does not ride outages), the
    error reaches RQ; the old id's liveness expires with its worker, so the job is orphaned and maintenance
    re-arms the loop.
    """
    rt.ride(lambda: timers.finish_taken(rt.raw, job_id, rt.owner.worker_id, took_s,
                                             rt.keys.base_queue),
            deadline=time.monotonic() + FINISH_WAIT_S)
