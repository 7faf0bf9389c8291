"""What the web process shares between requests: settings, the Redis clients, the mirror, and its follower.

Reads go through the SQLite mirror after a catch-up (read-your-writes: a request sees every write acknowledged
before it started), writes through the Redis stores. SQLite connections are opened per request in the thread
that serves it (``open_db`` connections belong to one thread); the Redis clients are shared (thread-safe pools).
The follower thread keeps the mirror current between requests, as ``loopsq mirror`` does, when this process is
the data dir's one follower (``loopsq.mirror.follower_lock``): beside a ``loopsq mirror`` (or another web app) that
follows the data dir already, it does not follow, and says so in one log line; its reads still catch up.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import redis

from loopsq.domain import timeutil
from loopsq.engine import timers
from loopsq.errors import LoopsqError, RedisUnavailableError
from loopsq.mirror.damage import malformed_cause, malformed_error
from loopsq.mirror.follow import catch_up, follow
from loopsq.mirror.follower_lock import WEB_ROLE, FollowerLock, following
from loopsq.mirror.identity import mirror_group
from loopsq.mirror.schema import open_db
from loopsq.state.clock import RedisClock
from loopsq.state.connection import connect, mask_url, unavailable
from loopsq.state.keys import Keys
from loopsq.state.outages import OutageLog, is_transient, wait_for_redis
from loopsq.state.sessions import SessionStore
from loopsq.system import config
from loopsq.web.sessions import DEFAULT_SESSION_TTL_S, Sessions

log = logging.getLogger(__name__)

#: The follower's wait after a failure that is not an outage (a file it cannot open, a refused password).
RETRY_MAX_S = 5.0


@dataclass(frozen=True)
class WebSettings:
    """How one web app is configured.

    Attributes:
        redis_url: The deployment's Redis (password included; only ever shown masked).
        data_dir: This process's data directory; its mirror is ``<data_dir>/loops.db``.
        token: The API token every request must carry (``Authorization: Bearer``) or prove (session cookie).
        keys: Key names (namespace).
        follow_mirror: Run the mirror follower thread when no other process follows the data dir (reads catch up
            anyway; this keeps the lag low, and makes this mirror an archive).
        rq_dashboard: Mount rq-dashboard under ``/rq``.
        refresh_s: Dashboard auto-refresh period.
        metrics_per_loop: ``/metrics`` labels run counts per loop (``LOOPSQ_METRICS_PER_LOOP=1``).
        session_ttl_s: How long a dashboard session lasts (``loopsq web --session-ttl``, default 12 h).
    """

    redis_url: str
    data_dir: Path
    token: str
    keys: Keys = field(default_factory=Keys)
    follow_mirror: bool = True
    rq_dashboard: bool = True
    refresh_s: int = 5
    metrics_per_loop: bool = False
    session_ttl_s: int = DEFAULT_SESSION_TTL_S


class WebContext:
    """Shared state of one web app: settings, Redis clients, per-request mirror connections, the follower."""

    def __init__(self, settings: WebSettings, client: redis.Redis | None = None) -> None:
        self.settings = settings
        self.keys = settings.keys
        # No ping here: the app starts while Redis is down and answers 503 until it is back.
        self._owns_client = client is None
        self.client = client if client is not None else connect(settings.redis_url, check=False)
        self.sessions = Sessions(SessionStore(self.client, self.keys), settings.token, settings.session_ttl_s)
        self._raw: redis.Redis | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._follower_lock = FollowerLock(settings.data_dir, WEB_ROLE)
        #: This process's measurement of Redis's clock (``now``).
        self.clock = RedisClock()

    @property
    def following(self) -> bool:
        """Whether this process follows the change stream into its mirror (holds the data dir's follower lock)."""
        return self._follower_lock.held

    @property
    def mirror_path(self) -> Path:
        """This process's mirror file."""
        return config.mirror_path(self.settings.data_dir)

    def raw(self) -> redis.Redis:
        """A bytes-responses client for RQ (queue depth, enqueueing)."""
        with self._lock:
            if self._raw is None:
                self._raw = timers.raw_from(self.client)
            return self._raw

    def now(self) -> datetime:
        """The clock (``loopsq.domain.timeutil.now``, which tests patch): Redis's, the offset to it measured on the
        first call and again every ``clock.MEASURE_EVERY_S`` (a Redis error leaves the last measurement)."""
        with contextlib.suppress(redis.RedisError):
            self.clock.measure_if_due(self.client)
        return timeutil.now()

    @contextlib.contextmanager
    def mirror(self, *, fresh: bool = True) -> Iterator[sqlite3.Connection]:
        """A mirror connection for this thread; with ``fresh``, caught up first (read-your-writes)."""
        conn = open_db(self.mirror_path)
        try:
            if fresh:
                catch_up(self.client, self.keys, conn)
            yield conn
        except (sqlite3.DatabaseError, LoopsqError) as exc:
            damage = malformed_cause(exc)
            if damage is not None:
                raise malformed_error(self.mirror_path, damage) from exc
            raise
        finally:
            conn.close()

    # -- the follower ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the follower thread when configured and no other process follows the data dir (idempotent)."""
        if not self.settings.follow_mirror or self._thread is not None:
            return
        data_dir = self.settings.data_dir
        try:
            holder = self._follower_lock.acquire()
        except OSError as exc:
            log.error("mirror follower: not following: cannot lock %s: %s", self._follower_lock.path,
                      exc.strerror or exc)
            return
        if holder is not None:
            log.info("mirror follower: not following the change stream: %s; reads here still catch up from Redis",
                     following(data_dir, holder))
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._follow, name="loopsq-web-mirror", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the follower (it notices within its block time, about a second) and close our clients."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            if not self._thread.is_alive():  # else it still follows: the lock goes with the process
                self._follower_lock.release()
            self._thread = None
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._owns_client:
            self.client.close()

    def _follow(self) -> None:
        """Follow the change stream into this mirror until stopped. Redis outages are waited out with a capped
        backoff (one log line when one starts, one when it ends); requests meanwhile get 503."""
        path = str(self.mirror_path)
        announced = False
        outage = OutageLog(self.settings.redis_url, log)
        while not self._stop.is_set():
            try:
                if not wait_for_redis(self.client, outage, self._stop):
                    return
            except RedisUnavailableError as exc:  # a configuration error: requests say so (503); keep trying
                log.error("mirror follower: %s", exc.message)
                self._stop.wait(RETRY_MAX_S)
                continue
            try:
                conn = open_db(path)
            except Exception:
                log.exception("mirror follower cannot open %s; retrying", path)
                self._stop.wait(RETRY_MAX_S)
                continue
            try:
                group = mirror_group(self.client, self.keys, conn, path)
                if not announced:
                    log.info("mirror follower: %s as %s into %s", mask_url(self.settings.redis_url), group, path)
                    announced = True
                follow(self.client, self.keys, conn, group, self._stop)
            except redis.RedisError as exc:
                if is_transient(exc):
                    outage.failed(exc)
                else:
                    log.error("mirror follower: %s", unavailable(self.settings.redis_url, exc).message)
                    self._stop.wait(RETRY_MAX_S)
            except Exception:  # one bad iteration must not end the follower
                log.exception("mirror follower iteration failed; continuing")
                self._stop.wait(1.0)
            finally:
                conn.close()
