"""Riding out Redis outages: which failures are transient and which are configuration errors, a capped backoff,
one log line when an outage starts and one when it ends, and the marker that tells recovery an outage happened.

A long-running process (worker, scheduler, mirror, web) never exits because Redis is unreachable, restarting
(``LOADING``) or failing over (``READONLY``): it waits with a capped backoff and goes on. Only a configuration
error (a wrong password, an ACL refusal, a database index the server does not have, a malformed URL) ends it,
with its one-line message. ``OutageLog`` is one per process and shared by its threads, so an outage costs two
log lines however many threads and tries notice it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from loopsq.state.connection import sibling, unavailable
from loopsq.state.keys import Keys

T = TypeVar("T")

log = logging.getLogger("loopsq.redis")

#: Replies that mean the server is there but not serving yet (restarting from AOF, a replica until failover
#: completes, a busy script): wait.
TRANSIENT_REPLIES = ("LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "BUSY", "MISCONF", "NOREPLICAS")
#: Replies that no amount of waiting mends: the URL or the server's configuration must change.
CONFIGURATION_REPLIES = ("WRONGPASS", "NOAUTH", "NOPERM", "invalid password", "invalid username-password",
                         "DB index is out of range", "invalid DB index", "Invalid Database",
                         "AUTH <password> called without any password configured",
                         "Client sent AUTH, but no password is set")
FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
#: A riding client's longest wait between tries; each try already includes redis-py's own retries (about 3 s
#: of reconnecting), so a Redis that is back is used within about a second.
RIDING_BACKOFF_MAX_S = 1.0


def is_configuration_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a Redis failure that waiting cannot mend (credentials, ACL, database index)."""
    if isinstance(exc, redis.AuthenticationError | redis.exceptions.AuthorizationError
                  | redis.exceptions.NoPermissionError | redis.exceptions.AuthenticationWrongNumberOfArgsError):
        return True
    return isinstance(exc, redis.RedisError) and any(marker in str(exc) for marker in CONFIGURATION_REPLIES)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a Redis failure to wait out: unreachable, timed out, loading, read-only, failing over."""
    if not isinstance(exc, redis.RedisError) or is_configuration_error(exc):
        return False
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError):
        return True
    return isinstance(exc, redis.ResponseError) and str(exc).split(" ", 1)[0] in TRANSIENT_REPLIES


@dataclass
class Backoff:
    """Capped exponential backoff: ``first_s``, doubling, at most ``max_s``; ``reset`` after a success."""

    first_s: float = FIRST_BACKOFF_S
    max_s: float = MAX_BACKOFF_S
    _next_s: float = 0.0

    def next(self) -> float:
        """The wait before the next try."""
        delay = self._next_s or self.first_s
        self._next_s = min(delay * 2, self.max_s)
        return delay

    def reset(self) -> None:
        """Start over from ``first_s``."""
        self._next_s = 0.0


class OutageLog:
    """One process's record of Redis being away: a line when an outage starts, a line when it ends.

    Every thread of the process reports here (``failed`` on a transient error, ``recovered`` on a success); only
    the first failure of an outage and the first success after it are logged.
    """

    def __init__(self, url: str, logger: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.log = logger or log
        self.clock = clock
        self.outages = 0
        self._since: float | None = None
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        """Whether an outage is going on (as far as this process knows)."""
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        """A transient failure: logged when it starts an outage."""
        with self._lock:
            if self._since is not None:
                return
            self._since = self.clock()
            self.outages += 1
        self.log.warning("redis unavailable (%s); waiting for it (capped backoff)", unavailable(self.url, exc).message)

    def recovered(self) -> None:
        """A success: logged when it ends an outage."""
        with self._lock:
            if self._since is None:
                return
            took = self.clock() - self._since
            self._since = None
        self.log.info("redis reachable again after %.1fs", took)


Stop = threading.Event | Callable[[], bool]


def _stopped(stop: Stop | None) -> bool:
    if stop is None:
        return False
    return stop.is_set() if isinstance(stop, threading.Event) else bool(stop())


def ride(fn: Callable[[], T], outage: OutageLog, *, stop: Stop | None = None,
         backoff: Backoff | None = None, deadline: float | None = None) -> T:
    """Call ``fn`` until it returns without a transient Redis error, waiting with ``backoff`` between tries.

    Configuration errors and anything else are raised at once; the transient error is raised too once ``stop``
    (an event, or a predicate) is set or the monotonic ``deadline`` has passed.
    """
    backoff = backoff or Backoff()
    while True:
        try:
            value = fn()
        except redis.RedisError as exc:
            if not is_transient(exc):
                raise
            outage.failed(exc)
            delay = backoff.next()
            if _stopped(stop) or (deadline is not None and time.monotonic() + delay > deadline):
                raise
            if isinstance(stop, threading.Event):
                stop.wait(delay)
            else:
                time.sleep(delay)
            continue
        outage.recovered()
        return value


class RidingRedis(redis.Redis):
    """A client whose every command and pipeline waits out Redis outages (``ride``, backoff capped at
    ``RIDING_BACKOFF_MAX_S`` on top of redis-py's own retries), until ``stop``.

    For the long-running processes' state transitions: a claim, a finalize or a workflow step's end is held and
    sent when Redis is back. A transition resent after Redis applied it but its reply was lost meets its own
    guards (compare-and-set on the state it read), so it is never applied twice; callers that must know whether
    theirs landed check (``RunStore.recorded_end``, ``RunStore.won_claim``).
    """

    def __init__(self, connection_pool: redis.ConnectionPool, outage: OutageLog, stop: Stop | None = None) -> None:
        super().__init__(connection_pool=connection_pool)
        self.ride_outage = outage
        self.ride_stop = stop

    def execute_command(self, *args: Any, **options: Any) -> Any:
        def attempt() -> Any:
            return super(RidingRedis, self).execute_command(*args, **options)  # type: ignore[no-untyped-call]

        return ride(attempt, self.ride_outage, stop=self.ride_stop, backoff=Backoff(max_s=RIDING_BACKOFF_MAX_S))

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> redis.client.Pipeline:
        return _RidingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint, self)


class _RidingPipeline(redis.client.Pipeline):
    """A pipeline resent whole after a transient failure (``execute`` empties the stack, so it is kept)."""

    def __init__(self, pool: redis.ConnectionPool, callbacks: Any, transaction: bool, shard_hint: Any,
                 owner: RidingRedis) -> None:
        super().__init__(pool, callbacks, transaction, shard_hint)
        self.owner = owner

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack, scripts = list(self.command_stack), set(self.scripts)
        if not stack and not self.watching:
            return []  # nothing is sent: not a sign that Redis is back

        def attempt() -> list[Any]:
            self.command_stack, self.scripts = list(stack), set(scripts)
            return list(super(_RidingPipeline, self).execute(raise_on_error))

        return ride(attempt, self.owner.ride_outage, stop=self.owner.ride_stop,
                    backoff=Backoff(max_s=RIDING_BACKOFF_MAX_S))


def riding(client: redis.Redis, outage: OutageLog, stop: Stop | None = None,
           decode_responses: bool | None = None) -> RidingRedis:
    """A ``RidingRedis`` on ``client``'s server (a pool of its own; ``decode_responses`` as given, else as
    ``client``'s)."""
    decode = client.connection_pool.connection_kwargs.get("decode_responses", False)
    own = sibling(client, decode_responses=bool(decode) if decode_responses is None else decode_responses)
    return RidingRedis(own.connection_pool, outage, stop)


def wait_for_redis(client: redis.Redis, outage: OutageLog, stop: threading.Event | None = None) -> bool:
    """Ping until Redis answers (True), or until ``stop`` is set (False).

    Raises:
        RedisUnavailableError: on a configuration error (wrong password, ACL, database index), with the masked
            URL and the server's reason.
    """
    try:
        ride(client.ping, outage, stop=stop)
    except redis.RedisError as exc:
        if is_transient(exc) and stop is not None and stop.is_set():
            return False
        raise unavailable(outage.url, exc) from exc
    return True


# Runs on every liveness beat of every process (and before each recovery pass): the Redis server's own clock,
# so hosts' clocks do not matter. A silence longer than ARGV[1] ms since the previous beat of any process means
# Redis was away (down, restarting, cut off) or nothing ran: liveness keys may have expired without their
# workers dying, so recovery waits ARGV[2] ms for them to beat again. Returns the grace left (ms, <= 0: none).
_SEEN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
redis.call('SET', KEYS[1], now)
if prev > 0 and now - prev > tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], now, 'PX', ARGV[2])
  return tonumber(ARGV[2])
end
return redis.call('PTTL', KEYS[2])
"""


def note_seen(client: redis.Redis | redis.client.Pipeline, keys: Keys, gap_ms: int, grace_ms: int) -> object:
    """Record that a loopsq process reached Redis now; start the recovery grace after a silence over ``gap_ms``.

    On a client, returns the grace left in ms (``> 0``: recovery must not judge owners dead yet); on a pipeline,
    queues the call (its reply is that number).
    """
    return client.eval(_SEEN, 2, keys.seen, keys.recovery_grace, gap_ms, grace_ms)


def in_grace(reply: object) -> bool:
    """Whether ``note_seen``'s reply means the recovery grace is on."""
    return int(reply) > 0 if isinstance(reply, int | str | bytes) else False
