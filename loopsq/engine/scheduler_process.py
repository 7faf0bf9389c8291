"""``loopsq scheduler``: move due timers onto the queue (rq-scheduler) and run maintenance.

Any number may run on any hosts. One at a time leads, under an owner-checked lock (``SET NX PX`` to take it,
compare-and-extend to keep it, compare-and-delete to give it up), unlike rq-scheduler's own lock whose release
deletes whoever holds it. If the leader dies another takes over within ``LOCK_MS``. Even two leaders would
only duplicate fire jobs, which slot claims make harmless.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import redis

from loopsq.domain import timeutil
from loopsq.engine import timers
from loopsq.engine.maintenance import maintain
from loopsq.engine.runtime import Runtime
from loopsq.state.connection import sibling

log = logging.getLogger("loopsq.scheduler")

LOCK_MS = 3_000
POLL_S = 0.02
MAINTENANCE_S = 1.0

_EXTEND = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Leadership:
    """The owner-checked scheduler lock."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.key = rt.keys.scheduler_lock
        self.token = rt.owner.worker_id
        self._extend = rt.client.register_script(_EXTEND)
        self._release = rt.client.register_script(_RELEASE)
        self.leading = False

    def keep(self) -> bool:
        """Take or extend the lock; True while this process leads."""
        if self.leading and int(self._extend(keys=[self.key], args=[self.token, LOCK_MS])) == 1:
            return True
        was = self.leading
        self.leading = bool(self.rt.client.set(self.key, self.token, nx=True, px=LOCK_MS))
        if self.leading != was:
            log.info("%s", "leading" if self.leading else "lost the lead")
        return self.leading

    def release(self) -> None:
        """Give the lock up, only if it is still ours."""
        with contextlib.suppress(redis.RedisError):
            self._release(keys=[self.key], args=[self.token])
        self.leading = False


def run_scheduler(url: str, stop: threading.Event, *, poll_s: float = POLL_S, maintenance_s: float = MAINTENANCE_S) -> None:
    """The scheduler loop until ``stop`` is set; Redis outages back off (capped at 5 s) and reconnect."""
    delay = 0.1
    while not stop.is_set():
        rt: Runtime | None = None
        try:
            rt = Runtime(url, role="scheduler").start()
            log.info("started id=%s", rt.owner.worker_id)
            delay = 0.1
            _loop(rt, stop, poll_s, maintenance_s)
        except redis.RedisError as exc:
            log.warning("redis unavailable (%s); retrying in %.1fs", exc, delay)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
        except Exception:
            log.exception("scheduler iteration failed; continuing")
            stop.wait(1.0)
        finally:
            if rt is not None:
                with contextlib.suppress(Exception):
                    Leadership(rt).release()
                    rt.stop()
    log.info("stopped")


class _Maintainer(threading.Thread):
    """Maintenance on its own thread and connection, so a long pass (it reads every loop) never delays the
    moving of due timers; it runs only while this scheduler leads."""

    def __init__(self, rt: Runtime, leading: threading.Event, stop: threading.Event, every_s: float) -> None:
        super().__init__(name="loopsq-maintenance", daemon=True)
        # A second client for this thread; the same identity (no second liveness registration).
        self.rt = Runtime(client=sibling(rt.client, decode_responses=True), keys=rt.keys, role="scheduler",
                          worker_id=rt.owner.worker_id)
        self.leading, self.stop, self.every_s = leading, stop, every_s
        self.failed: BaseException | None = None

    def run(self) -> None:
        delay = self.every_s
        while not self.stop.wait(delay):
            if not self.leading.is_set():
                continue
            try:
                report = maintain(self.rt, timeutil.now())
                delay = self.every_s
            except redis.RedisError as exc:
                log.warning("maintenance: redis unavailable (%s)", exc)
                delay = min(max(delay * 2, self.every_s), 5.0)
                continue
            except Exception:
                log.exception("maintenance failed; continuing")
                continue
            if report.recovered or report.expired or report.repaired or report.retriggered:
                log.info("maintenance recovered=%d expired=%d repaired=%d armed=%d retriggered=%d",
                         len(report.recovered), report.expired, report.repaired, report.armed, report.retriggered)


def _loop(rt: Runtime, stop: threading.Event, poll_s: float, maintenance_s: float) -> None:
    lead = Leadership(rt)
    leading = threading.Event()
    done = threading.Event()
    maintainer = _Maintainer(rt, leading, done, maintenance_s)
    maintainer.start()
    try:
        while not stop.is_set():
            if lead.keep():
                leading.set()
                timers.move_due(rt.raw)
                due_in = timers.next_due_in(rt.raw)
                wait = poll_s if due_in is None else max(0.0, min(poll_s, due_in))
            else:
                leading.clear()
                wait = LOCK_MS / 3000.0
            stop.wait(wait)
    finally:
        leading.clear()
        done.set()
        maintainer.join(timeout=10)
        lead.release()
