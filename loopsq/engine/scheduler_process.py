"""``loopsq scheduler``: move due timers onto the queue (rq-scheduler) and run maintenance.

Any number may run on any hosts. Every one moves due timers (``timers.move_due`` is atomic per entry, so racing
movers never queue a timer twice, and killing one scheduler delays no slot). One at a time leads and runs
maintenance, under an owner-checked lock (``SET NX PX`` to take it, compare-and-extend to keep it,
compare-and-delete to give it up), unlike rq-scheduler's own lock whose release deletes whoever holds it. If the
leader dies another takes over within ``LOCK_MS``; two leaders would only repeat maintenance, which is idempotent.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import redis

from loopsq.domain import timeutil
from loopsq.engine import layout_guard, timers
from loopsq.engine.maintenance import maintain
from loopsq.engine.notify import NotifierThread
from loopsq.engine.runtime import Runtime
from loopsq.state import layout, owned_key
from loopsq.state.connection import sibling, unavailable
from loopsq.state.keys import Keys
from loopsq.state.outages import errors, is_configuration_error, is_transient, wait_for_redis
from loopsq.system import tracing

log = logging.getLogger("loopsq.scheduler")

LOCK_MS = 3_000
POLL_S = 0.02
#: An idle pass costs a few commands whatever the loop count (``maintenance``), so it can run often: it bounds
#: how long a dead worker's run waits after its liveness key expired.
MAINTENANCE_S = 0.5


class Leadership:
    """The owner-checked scheduler lock."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.key = rt.keys.scheduler_lock
        self.token = rt.owner.worker_id
        self._extend = rt.client.register_script(owned_key.EXTEND)
        self._release = rt.client.register_script(owned_key.RELEASE)
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


def run_scheduler(url: str, stop: threading.Event, *, poll_s: float = POLL_S, maintenance_s: float = MAINTENANCE_S,
                  migrate: bool = True, keys: Keys | None = None) -> None:
    """The scheduler loop until ``stop`` is set, for the namespace of ``keys`` (default: ``LOOPSQ_NAMESPACE``'s).

    Redis being unreachable or restarting never ends it: its calls wait for Redis (one log line when an outage
    starts, one when it ends) under the same identity, and go on. Only a configuration error ends it.

    ``migrate``: move an older state forward first (``layout_guard.check_at_start``); else refuse it.

    Raises:
        RedisUnavailableError: on a configuration error (wrong password, bad URL), with its one-line message.
        StateLayoutError: the state is in a layout this release does not read (exit 2).
    """
    rt = Runtime(url, keys=keys, role="scheduler", ride_until=stop)
    if not wait_for_redis(rt.direct, rt.outage, stop):
        return
    try:  # (a state it does not read: exit 2 with one line, before anything is written)
        layout_guard.check_at_start(rt, migrate=migrate)
    except redis.RedisError as exc:
        if stop.is_set() and is_transient(exc):
            return
        raise unavailable(url, exc) from exc
    try:
        rt.start()
        layout_guard.LayoutGuard.of(rt, stop).start()
        log.info("started id=%s", rt.owner.worker_id)
        while not stop.is_set():
            try:
                _loop(rt, stop, poll_s, maintenance_s)
            except redis.RedisError as exc:
                if stop.is_set() and is_transient(exc):
                    break
                if is_configuration_error(exc):
                    raise unavailable(url, exc) from exc
                if is_transient(exc):
                    rt.outage.failed(exc)
                else:  # WRONGTYPE, a script's error: a bug or corrupted data, not a reason to stop scheduling
                    errors.report("the scheduler loop", exc)
                stop.wait(1.0)
            except Exception:
                log.exception("scheduler iteration failed; continuing")
                stop.wait(1.0)
    except redis.RedisError as exc:
        if not (stop.is_set() and is_transient(exc)):
            raise unavailable(url, exc) from exc
    finally:
        with contextlib.suppress(Exception):
            Leadership(rt).release()
        with contextlib.suppress(Exception):
            rt.stop()
        log.info("stopped")


class _Maintainer(threading.Thread):
    """Maintenance on its own thread and connection, so a long pass (it reads every loop) never delays the
    moving of due timers; it runs only while this scheduler leads."""

    def __init__(self, rt: Runtime, leading: threading.Event, stop: threading.Event, every_s: float) -> None:
        super().__init__(name="loopsq-maintenance", daemon=True)
        # A second client for this thread (its own pool, through the same sentinels for a Sentinel URL), waiting
        # out outages as the first; the same identity (no second liveness registration) and the same outage log.
        client = sibling(rt.direct, decode_responses=True)
        self.rt = Runtime(client=client, keys=rt.keys, role="scheduler", worker_id=rt.owner.worker_id,
                          ride_until=stop, outage=rt.outage)
        self.leading, self.stop, self.every_s = leading, stop, every_s
        self.failed: BaseException | None = None
        self.paused = False

    def run(self) -> None:
        delay = self.every_s
        while not self.stop.wait(delay):
            if not self.leading.is_set():
                continue
            try:
                if not layout_still_ours(self.rt):
                    continue  # (the layout guard ends this process within its period; recover nothing meanwhile)
                report = maintain(self.rt, timeutil.now())
                delay = self.every_s
            except redis.RedisError as exc:
                if is_transient(exc):
                    self.rt.outage.failed(exc)
                elif is_configuration_error(exc):
                    log.warning("maintenance: %s", unavailable(self.rt.outage.url, exc).message)
                else:
                    errors.report("maintenance", exc)
                delay = min(max(delay * 2, self.every_s), 5.0)
                continue
            except Exception:
                log.exception("maintenance failed; continuing")
                continue
            if report.recovery_paused != self.paused:
                self.paused = report.recovery_paused
                log.info("%s", "recovery waits: Redis was away moments ago; live workers get time to beat again"
                         if self.paused else "recovery resumes")
            if report.recovered or report.expired or report.repaired or report.retriggered:
                log.info("maintenance recovered=%d expired=%d repaired=%d armed=%d retriggered=%d",
                         len(report.recovered), report.expired, report.repaired, report.armed, report.retriggered)


def layout_still_ours(rt: Runtime) -> bool:
    """Whether the state's stamp is still one this release may write (one HGETALL). Maintenance asks before each
    pass: between a newer release's stamp and the layout guard's next look (``GUARD_EVERY_S``), a pass would
    otherwise record a run abandoned (its worker, which exited on the new stamp, seeming dead) in a layout this
    release does not know."""
    found = layout.from_meta(rt.client.hgetall(rt.keys.meta))
    return found is None or found.refusal() is None


def _loop(rt: Runtime, stop: threading.Event, poll_s: float, maintenance_s: float) -> None:
    lead = Leadership(rt)
    leading = threading.Event()
    done = threading.Event()
    maintainer = _Maintainer(rt, leading, done, maintenance_s)
    maintainer.start()
    # Notifications (``engine.notify``) on a thread of their own: a slow receiver never delays maintenance.
    notifier = NotifierThread(maintainer.rt.client, rt.keys, leading, done)
    notifier.start()
    try:
        next_lead_check = 0.0
        while not stop.is_set():
            # Every scheduler moves due timers (the scripted mover never moves one twice), so a scheduler killed
            # -9 costs no slot its lateness; the lead only decides who runs maintenance.
            now = time.monotonic()
            if now >= next_lead_check:
                if lead.keep():
                    leading.set()
                else:
                    leading.clear()
                next_lead_check = now + LOCK_MS / 3000.0
            started_ns = time.time_ns()
            moved = timers.move_due(rt.raw, keys=rt.keys)
            if moved:  # (a span only for a move that moved something, not for every poll)
                tracing.record("loopsq.timers.move", started_ns, {"loopsq.moved": moved})
            due_in = timers.next_due_in(rt.raw, rt.keys)
            stop.wait(poll_s if due_in is None else max(0.0, min(poll_s, due_in)))
    finally:
        leading.clear()
        done.set()
        maintainer.join(timeout=10)
        notifier.join(timeout=2)  # (an event whose POST it cuts short is sent again: at least once)
        lead.release()
