"""The pieces ``worker.CompatWorker`` is made of: no RQ job timeout on a slot's thread, RQ's heartbeats of a job
renewed from a thread (``JobBeat``), a job kept for no time deleted without reads (``LeanJob``), and RQ's per-try
log lines about an unreachable Redis turned into one outage report (``OutageFilter``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis
from rq import SimpleWorker
from rq.job import Job
from rq.timeouts import BaseDeathPenalty

from loopsq.engine.rqcompat import names, scripts
from loopsq.state.outages import OutageLog, errors, is_configuration_error, is_transient


class NoDeathPenalty(BaseDeathPenalty):
    """No RQ job timeout on a slot's thread (RQ's default uses SIGALRM, main thread only): loopsq's jobs never
    time out in RQ (``timers.queue``), their targets' timeouts are loopsq's own."""

    def setup_death_penalty(self) -> None:
        return None

    def cancel_death_penalty(self) -> None:
        return None


class JobBeat:
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


class LeanJob(Job):
    """RQ's job, deleted without reads when that happens inside a transaction (see ``scripts.LEAN_DELETE``)."""

    def delete(self, pipeline: Any = None, remove_from_queue: bool = True, delete_dependents: bool = False) -> None:
        if pipeline is None or remove_from_queue or delete_dependents or self.group_id:
            super().delete(pipeline=pipeline, remove_from_queue=remove_from_queue,
                           delete_dependents=delete_dependents)
            return
        keys = [self.key, self.dependents_key, self.dependencies_key, names.executions_registry_key(self.id),
                names.started_registry_key(self.origin), *names.job_registry_keys(self.origin)]
        prefix = f"{names.EXECUTION_PREFIX}{self.id}:"
        pipeline.eval(scripts.LEAN_DELETE, len(keys), *keys, prefix, self.id)


class OutageFilter(logging.Filter):
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


def install_filter(outage: OutageLog) -> None:
    rq_log = logging.getLogger("rq.worker")
    for old in [f for f in rq_log.filters if isinstance(f, OutageFilter)]:
        rq_log.removeFilter(old)
    rq_log.addFilter(OutageFilter(outage))
