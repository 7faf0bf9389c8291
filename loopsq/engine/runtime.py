"""A process that executes runs: its connections, its identity, and the background beat that keeps its
liveness key fresh, renews the leases of the runs it holds, and notices cancel requests.

One ``Runtime`` per process (worker, ``run-now --local``, ``tick``). The beat thread runs every 200 ms:
liveness on every beat (TTL ``LIVENESS_TTL_MS``), each held lease at a third of its length, cancel requests on
every beat (one MGET), so a cancel reaches the executing process from any host well within a second.

A held run's process start (pid, start time, host: ``Held.started``) is recorded by the next beat
(``RunStore.mark_started``), or by the run's finalize if that comes first, so a short run spends no round trip
on it. Nothing is lost meanwhile: the worker's watchdog kills the run's process group should the worker die
(``executor.watchdog``), and the run is in its host's set from the claim on, for that host's worker to reap.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import redis

from loopsq.domain import run_rules as rules
from loopsq.domain import timeutil
from loopsq.domain.durations import describe_ms
from loopsq.domain.timeutil import gen_id
from loopsq.engine.timers import raw_from
from loopsq.executor import SpawnInfo
from loopsq.executor.capabilities import published
from loopsq.state.clock import OFFSET_FIELD, RedisClock, published_offset_ms
from loopsq.state.commit import Committer
from loopsq.state.connection import connect
from loopsq.state.keys import Keys
from loopsq.state.layout import LAYOUT, LIVENESS_LAYOUT_FIELD
from loopsq.state.loops import LoopStore
from loopsq.state.outages import OutageLog, errors, is_transient, note_seen, parse_seen, ride, riding
from loopsq.state.runs import Owner, RunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.config import configured_namespace
from loopsq.system.procs import hostname

log = logging.getLogger(__name__)
T = TypeVar("T")

#: A killed worker's liveness key is gone at most this long after the kill; with maintenance every 0.5 s
#: (``scheduler_process.MAINTENANCE_S``) its run is retried within ~2.5 s (``bench/recovery.py``). The price: a
#: worker whose beat thread cannot run for longer than the TTL less a beat (a stopped or starved process) looks
#: dead. The beat's cost per worker stays flat (four commands per liveness beat, whatever it runs).
LIVENESS_TTL_MS = 1_500
#: Every beat (``BEAT_S``) is a liveness beat.
LIVENESS_EVERY_S = 0.2
#: A silence this long in every process's beats (``outages.note_seen``), lived through by a running process,
#: means Redis was away: beats come every 200 ms, and a liveness key outlives a silence of up to its TTL minus
#: two beats.
OUTAGE_GAP_MS = LIVENESS_TTL_MS - 2 * int(LIVENESS_EVERY_S * 1000)
#: After such a silence recovery judges no owner dead for this long: time for every live worker to reconnect and
#: beat again (its liveness key may have expired meanwhile, or across a restart from AOF), and to record the runs
#: that ended meanwhile. Not tied to the TTL: a reconnect takes as long as it takes.
OUTAGE_GRACE_MS = 15_000
#: The beat's longest wait between tries while Redis is away (well under the liveness TTL).
BEAT_BACKOFF_MAX_S = 0.5
#: How often a beat also registers the process again and stamps its host's last beat (``keys.hosts``).
REGISTER_EVERY_S = 1.0
#: A host counts as having a live worker while one stamped it this recently: a few registrations, so that a
#: host whose worker is alive is never taken for gone (its dead workers' runs are left to that worker, the only
#: one that can check and kill their processes).
HOST_LIVE_MS = 5_000
#: How often a worker reaps its host: recovers runs whose process it started there and whose worker died.
REAP_EVERY_S = 0.5
BEAT_S = 0.2
LEASE_LOST = "run lease lost"
SHUTTING_DOWN = "worker shutting down"


@dataclass
class Held:
    """A run this process executes: its lease token and length, and the event that cancels it."""

    token: str | None
    lease_ms: int
    cancel: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None
    renew_at: float = 0.0
    #: The run's process, once started (set by the executing thread); recorded by the beat (``record_starts``).
    started: SpawnInfo | None = None
    #: The ``started`` the beat recorded (or found the run ended for).
    recorded: SpawnInfo | None = None
    #: Other ids whose cancel request stops this one too (a workflow step run for another worker: its workflow
    #: run's, ``engine.remote_steps``).
    also: tuple[str, ...] = ()


@dataclass
class _Kept:
    """A lease the beat renews besides the runs' (``Runtime.keep``)."""

    renew: Callable[[], bool]
    every_s: float
    next_at: float


class Runtime:
    """Connections, identity and the beat of a process that executes runs."""

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        keys: Keys | None = None,
        role: str = "worker",
        worker_id: str | None = None,
        reaper: Callable[[Runtime, datetime], object] | None = None,
        ride_until: threading.Event | None = None,
        outage: OutageLog | None = None,
    ) -> None:
        """``reaper``: called on the beat every ``REAP_EVERY_S`` (a worker passes ``recovery.reap_host``, its
        share of recovery on its own host); None for processes that reap nothing.

        ``ride_until``: the long-running processes' mode. Every Redis call of this runtime (``client``, ``raw``)
        then waits out Redis outages until that event is set or the runtime stops, so a run's claim and its
        finalize are held and sent when Redis is back. ``direct`` never waits (best-effort writes: live output,
        pid records). ``outage``: the process's ``OutageLog`` when it has one already.
        """
        if client is None:
            if url is None:
                raise ValueError("Runtime needs a url or a client")
            client = connect(url, check=False)  # the processes wait for Redis themselves (``wait_for_redis``)
        self._stop = threading.Event()
        self.url = url
        #: This process's record of Redis outages (one line when one starts, one when it ends), shared by threads.
        self.outage = outage or OutageLog(url or _describe(client))
        #: Fails at once while Redis is away (for writes that may be skipped).
        self.direct = client
        self._riding: Callable[[], bool] | None = None
        if ride_until is not None:
            until = ride_until
            self._riding = lambda: until.is_set() or self._stop.is_set()
            client = riding(client, self.outage, self._riding)
        self.client = client
        # No keys given: the namespace of this process (``LOOPSQ_NAMESPACE``, which ``--namespace`` sets), as an
        # RQ job run by a plain ``rq worker`` has nothing else to go by.
        self.keys = keys or Keys(configured_namespace())
        self.role = role
        host = hostname()
        self.owner = Owner(worker_id or f"{role}:{host}:{os.getpid()}:{gen_id()[:6]}", host, os.getpid())
        self.committer = Committer(client, self.keys)
        self.loops = LoopStore(client, self.keys, self.committer)
        self.runs = RunStore(client, self.keys, self.committer)
        self.workflows = WorkflowStore(client, self.keys, self.committer)
        self._raw: redis.Redis | None = None
        self._held: dict[str, Held] = {}
        #: Other leases this process keeps alive (a run's pool slot), by name.
        self._kept: dict[str, _Kept] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next_liveness = 0.0
        self._next_register = 0.0
        self._next_reap = time.monotonic() + REAP_EVERY_S
        self._shutdown_timer: threading.Timer | None = None
        self._reaper = reaper
        #: The server's time of this runtime's latest beat (``outages.note_seen``); 0 before the first.
        self.seen_ms = 0
        #: More of this process's liveness record (a worker's labels, slots and queues), read on every beat.
        self.describe: Callable[[], dict[str, object]] | None = None
        #: This process's labels (``engine.routing.worker_labels``); None: not a fleet worker (``run-now --local``,
        #: ``tick``, a plain ``rq worker``), which runs whatever it is handed.
        self.labels: list[str] | None = None
        #: This process's measurement of Redis's clock (``state.clock``): at ``start`` and again on the beat.
        self.clock = RedisClock()
        self.started_at = timeutil.to_iso(timeutil.now())

    @property
    def raw(self) -> redis.Redis:
        """A bytes-responses client on the same server (timers and RQ's queue); it rides outages as ``client``
        does. RQ's worker loop gets a plain one of its own (``timers.raw_from(rt.direct)``)."""
        if self._raw is None:
            self._raw = raw_from(self.client) if self._riding is None else riding(
                self.direct, self.outage, self._riding, decode_responses=False)
        return self._raw

    # -- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> Runtime:
        """Measure the offset to Redis's clock, register this process as live and start the beat thread."""
        self.clock.measure(self.client)
        self.started_at = timeutil.to_iso(timeutil.now())
        self.client.sadd(self._registry(), self.owner.worker_id)
        self._refresh_liveness()
        self._thread = threading.Thread(target=self._run, name=f"loopsq-beat-{self.role}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the beat and withdraw the liveness key (a clean exit is not a death)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.client.delete(self._liveness_key())
            self.client.srem(self._registry(), self.owner.worker_id)
        except redis.RedisError:
            log.warning("could not withdraw liveness of %s", self.owner.worker_id)

    def __enter__(self) -> Runtime:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def ride(self, fn: Callable[[], T], *, deadline: float | None = None) -> T:
        """``fn()``, retried through Redis outages (capped backoff, logged once) until it succeeds, this runtime
        stops, or the monotonic ``deadline`` passes; configuration errors are raised at once."""
        return ride(fn, self.outage, stop=self._riding or self._stop, deadline=deadline)

    # -- held runs --------------------------------------------------------------------------------------------
    def hold(self, run_id: str, token: str, lease_ms: int) -> Held:
        """Start renewing ``run_id``'s lease and watching for its cancel request."""
        held = Held(token, lease_ms, renew_at=time.monotonic() + self._renew_every(lease_ms))
        with self._lock:
            self._held[run_id] = held
        return held

    def watch(self, run_id: str, *, also: Iterable[str] = ()) -> Held:
        """Watch ``run_id``'s cancel key without a lease (a workflow run inside a held loop run, or on its own);
        a cancel request under any id of ``also`` cancels it too."""
        held = Held(None, 0, also=tuple(also))
        with self._lock:
            self._held[run_id] = held
        return held

    def release(self, run_id: str) -> None:
        """Stop renewing ``run_id``'s lease."""
        with self._lock:
            self._held.pop(run_id, None)

    def keep(self, name: str, renew: Callable[[], bool], every_s: float) -> None:
        """Renew another lease on the beat (``renew()``: False when it was lost, logged once) until ``drop``."""
        with self._lock:
            self._kept[name] = _Kept(renew, every_s, time.monotonic() + every_s)

    def drop(self, name: str) -> None:
        """Stop renewing a lease ``keep`` renews."""
        with self._lock:
            self._kept.pop(name, None)

    def begin_shutdown(self, grace_s: float) -> None:
        """A graceful stop was requested: the runs held now may finish for ``grace_s``; then they are cancelled
        (reason ``SHUTTING_DOWN``) so they are recorded and retried elsewhere instead of dying with us."""
        if self._shutdown_timer is not None:
            return
        shown = describe_ms(round(grace_s * 1000))
        log.info("shutdown requested; current runs get %s to finish", shown)

        def expire() -> None:
            with self._lock:
                held = list(self._held.items())
            for run_id, h in held:
                if not h.cancel.is_set():
                    log.warning("run %s still going after the %s grace; cancelling it", run_id, shown)
                    h.reason = SHUTTING_DOWN
                    h.cancel.set()

        self._shutdown_timer = threading.Timer(grace_s, expire)
        self._shutdown_timer.daemon = True
        self._shutdown_timer.start()

    @property
    def stopping(self) -> bool:
        """A graceful shutdown was requested, or the runtime stopped: take no new work."""
        return self._shutdown_timer is not None or self._stop.is_set()

    def held_ids(self) -> list[str]:
        """Runs this process executes now."""
        with self._lock:
            return list(self._held)

    @staticmethod
    def _renew_every(lease_ms: int) -> float:
        return rules.lease_renew_every_ms(lease_ms) / 1000.0

    def _registry(self) -> str:
        return self.keys.workers if self.role != "scheduler" else self.keys.schedulers

    # -- the beat -----------------------------------------------------------------------------------------
    def _liveness_key(self) -> str:
        return self.keys.scheduler(self.owner.worker_id) if self.role == "scheduler" else self.keys.worker(
            self.owner.worker_id
        )

    def _refresh_liveness(self) -> None:
        record = {
            "id": self.owner.worker_id, "role": self.role, "host": self.owner.host, "pid": self.owner.pid,
            "startedAt": self.started_at, "runs": self.held_ids(), "beatAt": timeutil.to_iso(timeutil.now()),
            OFFSET_FIELD: published_offset_ms(), LIVENESS_LAYOUT_FIELD: LAYOUT,
        }
        if self.role == "worker":
            record["can"] = published()  # what its targets can find: PATH, provider CLIs, accounts CLI
        if self.describe is not None:
            record.update(self.describe())
        pipe = self.client.pipeline(transaction=False)
        note_seen(pipe, self.keys, OUTAGE_GAP_MS, OUTAGE_GRACE_MS, self.seen_ms)
        pipe.set(self._liveness_key(), json.dumps(record), px=LIVENESS_TTL_MS)
        now_mono = time.monotonic()
        if now_mono >= self._next_register:
            # Registered again about every second: ``prune_dead`` may have dropped it while Redis was away. (Not
            # on every beat: that would cost half the beat's commands again; hosts are judged live over
            # ``HOST_LIVE_MS``.)
            pipe.sadd(self._registry(), self.owner.worker_id)
            if self.role == "worker":
                pipe.hset(self.keys.hosts, self.owner.host, str(timeutil.to_ms(timeutil.now())))
            self._next_register = now_mono + REGISTER_EVERY_S
        self.seen_ms = parse_seen(pipe.execute()[0]).at_ms
        self.outage.recovered()  # (a riding client has said so already)
        self._next_liveness = time.monotonic() + LIVENESS_EVERY_S

    def beat(self) -> None:
        """One beat: liveness when due, lease renewals when due, cancel requests always; the reaper (a worker's
        share of recovery on its host) when due."""
        now_mono = time.monotonic()
        self.clock.measure_if_due(self.client)
        if now_mono >= self._next_liveness:
            self._refresh_liveness()
        if self._reaper is not None and now_mono >= self._next_reap:
            self._next_reap = now_mono + REAP_EVERY_S
            self._reaper(self, timeutil.now())
        self._renew_kept(now_mono)
        with self._lock:
            held = dict(self._held)
        if not held:
            return
        # (run id, id of a cancel key that stops it): each run's own, then those it also heeds.
        watched = [(run_id, key_id) for run_id, h in held.items() for key_id in (run_id, *h.also)]
        reasons = self.client.mget([self.keys.cancel(key_id) for _, key_id in watched])
        for (run_id, _), reason in zip(watched, reasons, strict=True):
            if reason and not held[run_id].cancel.is_set():
                held[run_id].reason = reason.decode() if isinstance(reason, bytes) else str(reason)
                held[run_id].cancel.set()
        self._record_starts(held)
        for run_id, h in held.items():
            if h.token is None or h.cancel.is_set() or now_mono < h.renew_at:
                continue
            if self.runs.renew_lease(run_id, h.token, h.lease_ms, timeutil.now()):
                h.renew_at = now_mono + self._renew_every(h.lease_ms)
            else:
                log.warning("run %s lease lost; stopping it", run_id)
                h.reason = LEASE_LOST
                h.cancel.set()

    def _renew_kept(self, now_mono: float) -> None:
        with self._lock:
            due = [(name, kept) for name, kept in self._kept.items() if now_mono >= kept.next_at]
        for name, kept in due:
            kept.next_at = now_mono + kept.every_s
            if not kept.renew():
                log.warning("%s lost; it is no longer renewed", name)
                self.drop(name)

    def _record_starts(self, held: dict[str, Held]) -> None:
        """Record the process start of each held run that has one not yet recorded (``Held.started``)."""
        for run_id, h in held.items():
            info = h.started
            if info is None or info is h.recorded or h.token is None:
                continue
            self.runs.mark_started(run_id, h.token, timeutil.now(), pid=info.pid, pid_start_time=info.start_time,
                                   host=info.host)
            h.recorded = info  # (None back: the run ended or its lease went; nothing to record then)

    def _run(self) -> None:
        delay = BEAT_S
        while not self._stop.wait(delay):
            try:
                self.beat()
                delay = BEAT_S
            except redis.RedisError as exc:
                if not is_transient(exc):
                    errors.report("the beat", exc)
                    delay = BEAT_BACKOFF_MAX_S
                    continue
                self.outage.failed(exc)
                delay = min(delay * 2, BEAT_BACKOFF_MAX_S)
            except Exception:
                log.exception("beat failed; continuing")
                delay = BEAT_S


_current: Runtime | None = None


def current_runtime() -> Runtime | None:
    """The Runtime of this worker process (set by ``worker_process.run_worker``)."""
    return _current


def set_current_runtime(rt: Runtime | None) -> None:
    """Install the Runtime jobs use (also for tests and embedding)."""
    global _current
    _current = rt


def _describe(client: redis.Redis) -> str:
    """A URL naming ``client``'s server for messages (no password: it is not in the pool's description)."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}"
    return f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
