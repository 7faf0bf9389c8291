"""``loopsq worker``: an RQ worker on loopsq's queue, with loopsq's liveness beat, started after killing the
orphaned process groups that dead predecessors left on this host."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from functools import partial

import redis

from loopsq.engine import layout_guard, rq_worker, timers
from loopsq.engine.recovery import kill_orphans_of, reap_host, recovery_paused
from loopsq.engine.routing import QueueWatch, worker_labels
from loopsq.engine.runtime import Runtime, current_runtime, set_current_runtime
from loopsq.engine.slots import DEFAULT_CONCURRENCY, Slots
from loopsq.executor.capabilities import published
from loopsq.state.connection import unavailable
from loopsq.state.keys import Keys
from loopsq.state.outages import errors, is_configuration_error, is_transient, wait_for_redis
from loopsq.system.signals import stop_on_signals

log = logging.getLogger("loopsq.worker")

__all__ = ["current_runtime", "kill_orphans", "run_worker", "set_current_runtime"]


def kill_orphans(rt: Runtime) -> int:
    """Kill process groups (runs and workflow steps) whose worker died on this host: nobody can record their
    outcome, and their runs are about to be retried. Not right after a Redis outage (``recovery_paused``): a
    missing liveness key may then be a live worker's that has not beaten again yet; ``reap_host`` does it later."""
    runs = rt.runs.get_many(rt.runs.running_ids())
    pipe = rt.client.pipeline(transaction=False)
    for run in runs:
        pipe.exists(rt.keys.worker(run.worker_id or "-"))
    alive = pipe.execute() if runs else []
    dead = [run for run, live in zip(runs, alive, strict=True) if not live and run.worker_id != rt.owner.worker_id]
    if not dead or recovery_paused(rt):
        return 0
    return sum(kill_orphans_of(rt, run) for run in dead)


def run_worker(url: str, *, burst: bool = False, stop: threading.Event | None = None, grace_s: float = 30.0,
               announce: str | None = None, concurrency: int = DEFAULT_CONCURRENCY,
               labels: list[str] | None = None, keys: Keys | None = None) -> None:
    """Run the worker of ``keys``' namespace (default: ``LOOPSQ_NAMESPACE``'s) until SIGTERM/SIGINT: it stops taking jobs, lets the current runs finish within
    ``grace_s``, then cancels them so they are recorded and retried elsewhere (nothing is left running unowned).

    It holds up to ``concurrency`` runs at once (``engine.slots``) and takes them from the queues its labels
    (``labels``, declared, plus ``host:`` and ``provider:`` ones found here) qualify it for (``engine.routing``).

    Redis being unreachable or restarting never ends it: it waits (one log line when the outage starts, one
    when it ends) and goes on under the same worker id, so the runs it holds stay its own; a run that ends
    meanwhile is recorded when Redis is back. RQ's loop, if it quit meanwhile, is started again.

    Raises:
        RedisUnavailableError: on a configuration error (wrong password, bad URL), with its one-line message.
    """
    stop = stop or threading.Event()
    rt = Runtime(url, keys=keys, role="worker", reaper=reap_host, ride_until=stop)
    if not _between_incarnations(stop, lambda: wait_for_redis(rt.direct, rt.outage, stop)):
        return
    try:  # (a state it does not read: exit 2 with one line, before anything is written)
        layout_guard.check_at_start(rt)
    except redis.RedisError as exc:
        if stop.is_set() and is_transient(exc):
            return
        raise unavailable(url, exc) from exc
    set_current_runtime(rt)
    slots = Slots(concurrency)
    every = worker_labels(published(), rt.owner.host, labels or ())
    rt.labels = every
    watch = QueueWatch(rt.direct, rt.keys, every)
    rt.describe = lambda: {"labels": every, "slots": slots.capacity, "busy": slots.in_use,
                           "queues": watch.names()}
    try:
        try:
            rt.start()
            layout_guard.LayoutGuard.of(rt, stop).start()
            log.info("started id=%s", rt.owner.worker_id)
            if announce:  # once connected: a configuration error ends the worker with its one line alone
                log.info("%s", announce)
                announce = None
            try:
                kill_orphans(rt)
            except redis.RedisError as exc:  # a bug or corrupted data (WRONGTYPE): the worker starts anyway
                if is_configuration_error(exc) or is_transient(exc):
                    raise
                errors.report("the orphan kill at start", exc)
        except redis.RedisError as exc:
            if stop.is_set() and is_transient(exc):
                return
            raise
        on_stop = partial(rt.begin_shutdown, grace_s)
        while not stop.is_set():
            # RQ gets a plain client of its own: its loop handles a failing Redis itself (and quits on some).
            worker = rq_worker.make_worker(timers.raw_from(rt.direct), rt.owner.worker_id, on_stop=on_stop,
                                           outage=rt.outage, slots=slots, queue_names=watch.names)
            if rq_worker.work(worker, burst=burst) or rt.stopping:
                _drain(rt, slots, grace_s, cancel=False)  # (a stop request started the grace already)
                return
            # RQ's loop quit (Redis went away under it): the same worker again, once Redis answers.
            if not _between_incarnations(stop, partial(_restart, rt, worker, stop)):
                return
    finally:
        _drain(rt, slots, grace_s, cancel=True)
        set_current_runtime(None)
        with contextlib.suppress(Exception):
            rt.stop()
        log.info("stopped")


def _drain(rt: Runtime, slots: Slots, grace_s: float, *, cancel: bool) -> None:
    """Wait for the runs still on slots to be recorded. A stop request gave them the grace already
    (``Runtime.begin_shutdown``: then they are cancelled and retried elsewhere); a burst lets them finish;
    ``cancel`` (the worker ends on an error) starts the grace here."""
    if not slots.in_use:
        return
    log.info("waiting for %d running run(s) to end", slots.in_use)
    if cancel:
        rt.begin_shutdown(grace_s)
    slots.drain()


def _restart(rt: Runtime, worker: object, stop: threading.Event) -> bool:
    """Wait for Redis, then clear the quit worker's registration so one of the same name can start."""
    stop.wait(0.5)  # (RQ quitting at once again and again must not spin)
    if not wait_for_redis(rt.direct, rt.outage, stop):
        return False
    try:
        rt.ride(lambda: rq_worker.restart(worker))
    except redis.RedisError as exc:
        if is_configuration_error(exc):
            raise
        if stop.is_set():  # asked to stop while Redis is away or refuses writes: not an error to exit with
            return False
        errors.report("the restart of RQ's work loop", exc)  # not an outage (those are ridden): a bug, bad data
    return True


def _between_incarnations(stop: threading.Event, wait: Callable[[], bool]) -> bool:
    """Run ``wait`` with SIGTERM/SIGINT setting ``stop`` (RQ's own handlers are live only inside its loop)."""
    signals = stop_on_signals(stop, say=lambda: log.info("stop signal received"))
    try:
        return wait() and not stop.is_set()
    finally:
        signals.restore()
