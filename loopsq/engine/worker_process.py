"""``loopsq worker``: an RQ worker on loopsq's queue, with loopsq's liveness beat, started after killing the
orphaned process groups that dead predecessors left on this host."""

from __future__ import annotations

import contextlib
import logging
import threading
from functools import partial

import redis

from loopsq.engine import timers
from loopsq.engine.recovery import kill_orphans_of, reap_host
from loopsq.engine.runtime import Runtime

log = logging.getLogger("loopsq.worker")

_current: Runtime | None = None


def current_runtime() -> Runtime | None:
    """The Runtime of this worker process (set by ``run_worker``)."""
    return _current


def set_current_runtime(rt: Runtime | None) -> None:
    """Install the Runtime jobs use (also for tests and embedding)."""
    global _current
    _current = rt


def kill_orphans(rt: Runtime) -> int:
    """Kill process groups (runs and workflow steps) whose worker died on this host: nobody can record their
    outcome, and their runs are about to be retried."""
    killed = 0
    for run in rt.runs.get_many(rt.runs.running_ids()):
        if run.worker_id == rt.owner.worker_id or rt.client.exists(rt.keys.worker(run.worker_id or "-")):
            continue
        killed += kill_orphans_of(rt, run)
    return killed


def run_worker(url: str, *, burst: bool = False, stop: threading.Event | None = None, grace_s: float = 30.0) -> None:
    """Run the worker until SIGTERM/SIGINT: it stops taking jobs, lets the current run finish within
    ``grace_s``, then cancels it so it is recorded and retried elsewhere (nothing is left running unowned)."""
    delay = 0.1
    while True:
        rt: Runtime | None = None
        try:
            rt = Runtime(url, role="worker", reaper=reap_host).start()
            set_current_runtime(rt)
            kill_orphans(rt)
            worker = timers.make_worker(rt.raw, rt.owner.worker_id, on_stop=partial(rt.begin_shutdown, grace_s))
            log.info("started id=%s", rt.owner.worker_id)
            worker.work(burst=burst, logging_level="WARNING", with_scheduler=False)
            return
        except redis.RedisError as exc:
            if stop is not None and stop.is_set():
                return
            log.warning("redis unavailable (%s); retrying in %.1fs", exc, delay)
            threading.Event().wait(delay)
            delay = min(delay * 2, 5.0)
        finally:
            set_current_runtime(None)
            if rt is not None:
                with contextlib.suppress(Exception):
                    rt.stop()
            log.info("stopped")
