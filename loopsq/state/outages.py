"""Riding out Redis outages: which failures are transient and which are configuration errors, a capped backoff,
one log line when an outage starts and one when it ends, and the marker that tells recovery an outage happened.

A long-running process (worker, scheduler, mirror, web) never exits because Redis is unreachable, restarting
(``LOADING``) or failing over (``READONLY``), nor because it refuses commands for a while (``OOM`` at
``maxmemory`` with ``noeviction``, ``BUSY`` running a long script, ``MISCONF``...): it waits with a capped backoff
and goes on. Only a configuration error (a wrong password, an ACL refusal, a database index the server does not
have, a malformed URL) ends it, with its one-line message. ``OutageLog`` is one per process and shared by its
threads, so an episode costs two log lines however many threads and tries notice it, the first naming its true
cause. Any other Redis error (``WRONGTYPE``, a script's error: a bug or corrupted data, nothing to wait for) is
``ErrorLog``'s: logged with its traceback once per kind and place (rate-limited), and the iteration is skipped.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from loopsq.domain.redis_url import mask_in, mask_url
from loopsq.state.connection import sibling, unavailable
from loopsq.state.keys import Keys

T = TypeVar("T")

log = logging.getLogger("loopsq.redis")

#: Replies that mean the server is there but not serving yet (restarting from AOF, a replica until failover
#: completes, a busy script): wait.
TRANSIENT_REPLIES = ("LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "BUSY", "MISCONF", "NOREPLICAS",
                     "UNBLOCKED")
#: A blocking read that Redis ended because its role changed (a master made a replica): tried again at once,
#: not an episode of its own (the next try meets what there is: ``READONLY``, or nothing).
UNLOGGED_REPLIES = ("UNBLOCKED",)
#: Of those (and ``OOM``), the ones where the server answers but refuses: logged as "Redis refuses writes" (or
#: commands), not as Redis being unreachable. ``LOADING`` and ``MASTERDOWN`` are a restart or a failover under way.
REFUSAL_REPLIES = {"OOM": "writes", "READONLY": "writes", "MISCONF": "writes", "NOREPLICAS": "writes",
                   "BUSY": "commands", "TRYAGAIN": "commands"}
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
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError | redis.ReadOnlyError
                  | redis.exceptions.OutOfMemoryError):
        return True
    return isinstance(exc, redis.ResponseError) and _code(exc) in (*TRANSIENT_REPLIES, "OOM")


def _code(exc: BaseException) -> str:
    """The reply's error code (``OOM``, ``MASTERDOWN``): redis-py keeps it in ``status_code`` and drops it from the
    message for the errors it has a class for; for the others it is the message's first word (after the failing
    command that redis-py puts in front of a pipeline's error)."""
    return str(getattr(exc, "status_code", None) or _server_text(exc).split(" ", 1)[0])


def _server_text(exc: BaseException) -> str:
    """The server's reply in ``exc``, without what redis-py wraps around it (the failing command of a pipeline,
    the sha and line of a script)."""
    return _SCRIPT_SUFFIX.sub("", _PIPELINE_PREFIX.sub("", str(exc))).strip()


def refusal(exc: BaseException) -> str | None:
    """What Redis refuses when ``exc`` is its answer that it will not take writes (or commands) for now
    (``"writes"``, ``"commands"``), None for anything else (unreachable included)."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError | redis.ReadOnlyError):
        return "writes"
    if isinstance(exc, redis.ResponseError):
        return REFUSAL_REPLIES.get(_code(exc))
    return None


#: A script that writes nothing but is declared as one that may (Redis 7's shebang without ``no-writes``): Redis
#: refuses to run it exactly when it refuses writes (``OOM``, ``READONLY``, ``MISCONF``, ``BUSY``), changing nothing.
WRITE_PROBE = "#!lua\nreturn 1"
#: While Redis refuses writes, how often a process checks whether it takes them again (``OutageLog.recovered``).
PROBE_EVERY_S = 0.5
#: How long after Redis came back a dropped connection is taken for a socket of the old server still held by
#: another thread (a call in flight at the switch, or a process stopped through the whole outage) and logged only if
#: Redis stays unreachable this long (``OutageLog.failed``).
SETTLE_S = 1.0


def accepts_writes(client: redis.Redis) -> bool:
    """Whether Redis would take a write now (``WRITE_PROBE``, sent once, never ridden); True when it cannot tell
    (Redis < 7 reads the shebang as Lua and fails to compile it)."""
    try:
        redis.Redis.execute_command(client, "EVAL", WRITE_PROBE, 0)  # type: ignore[no-untyped-call]
    except redis.RedisError as exc:
        return not (is_transient(exc) or refusal(exc) is not None)
    return True


def describe_refusal(exc: BaseException) -> str:
    """The server's own words for a refusal, with the reply's code in front (redis-py drops it from some:
    ``READONLY You can't write against a read only replica.``)."""
    code = "READONLY" if isinstance(exc, redis.ReadOnlyError) else (
        "OOM" if isinstance(exc, redis.exceptions.OutOfMemoryError) else _code(exc))
    if code in _SERVER_WORDS:
        return _SERVER_WORDS[code]
    text = _server_text(exc)
    return text if text.startswith(code) else f"{code} {text}"


#: The server's words for the refusals whose wording does not change, whatever command or script met them.
_SERVER_WORDS = {"OOM": "OOM command not allowed when used memory > 'maxmemory'.",
                 "READONLY": "READONLY You can't write against a read only replica."}
_PIPELINE_PREFIX = re.compile(r"^Command # \d+ \(.*\) of pipeline caused error: ", re.DOTALL)
_SCRIPT_SUFFIX = re.compile(r"\s*script: [0-9a-f]{40}, on @user_script:\d+\.?$")


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
    """One process's record of Redis being away or refusing: a line when an episode starts, a line when it ends.

    Every thread of the process reports here (``failed`` on a transient error, ``recovered`` on a success); only
    the first failure of an episode and the first success after it are logged. A connection dropped within
    ``SETTLE_S`` of a recovery is logged only once it lasts that long: several threads each meet a socket of the
    old server when Redis comes back, and that is one outage, not several. The first line names the cause:
    ``redis unavailable (...)`` when Redis cannot be reached, ``Redis refuses writes: OOM ...`` when it answers
    with a refusal; ``reason`` says it while the episode lasts (for ``/api/health``).
    """

    def __init__(self, url: str, logger: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.log = logger or log
        self.clock = clock
        self.outages = 0
        self._since: float | None = None
        self._refused: str | None = None
        self._next_probe = 0.0
        self._recovered_at: float | None = None
        self._quiet = False
        self._lock = threading.Lock()

    @property
    def down(self) -> bool:
        """Whether an outage is going on (as far as this process knows)."""
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        """A transient failure: logged when it starts an outage."""
        if _code(exc) in UNLOGGED_REPLIES:
            return
        refused = refusal(exc)
        with self._lock:
            now = self.clock()
            if self._since is not None:
                if not self._quiet or now - self._since < SETTLE_S:
                    return
                self._quiet = False  # a quiet episode that lasted: an outage after all
            else:
                self._since = now
                self._refused = refused
                if refused is None and self._recovered_at is not None and now - self._recovered_at < SETTLE_S:
                    self._quiet = True
                    return
            self.outages += 1
        if refused is None:
            self.log.warning("redis unavailable (%s); waiting for it (capped backoff)",
                             unavailable(self.url, exc).message)
        else:
            self.log.warning("Redis refuses %s: %s (%s); waiting (capped backoff)",
                             refused, mask_in(describe_refusal(exc), self.url), mask_url(self.url))

    @property
    def reason(self) -> str | None:
        """While an episode lasts, what it is (``writes refused: OOM ...`` is logged in full); else None."""
        return None if self._since is None else ("unreachable" if self._refused is None else
                                                 f"{self._refused} refused")

    def recovered(self, probe: Callable[[], bool] | None = None) -> None:
        """A success: logged when it ends an episode. While Redis refuses writes, a success that may have been a
        read (``probe`` given: the caller cannot tell) ends it only once ``probe`` says writes are taken again
        (asked at most every ``PROBE_EVERY_S``)."""
        if self._since is None:
            return
        if self._refused is not None and probe is not None:
            with self._lock:
                now = self.clock()
                if now < self._next_probe:
                    return
                self._next_probe = now + PROBE_EVERY_S
            if not probe():
                return
        with self._lock:
            if self._since is None:
                return
            now = self.clock()
            took = now - self._since
            self._since, refused, self._refused = None, self._refused, None
            self._recovered_at = now
            if self._quiet:
                self._quiet = False
                return
        if refused is None:
            self.log.info("redis reachable again after %.1fs", took)
        else:
            self.log.info("Redis accepts %s again after %.1fs", refused, took)


class ErrorLog:
    """One process's record of Redis errors that are neither an outage nor a refusal (``WRONGTYPE``, a script's
    error, an unknown command): a bug or corrupted data. Each is logged with its traceback once per place and
    kind every ``every_s`` (the next line counts the ones left out); the caller skips the iteration and goes on.
    """

    def __init__(self, logger: logging.Logger | None = None, every_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = logger or log
        self.every_s = every_s
        self.clock = clock
        self._last: dict[tuple[str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def report(self, where: str, exc: BaseException) -> bool:
        """Log ``exc`` (with its traceback) unless one of its kind was logged at ``where`` less than ``every_s``
        ago; whether it was logged."""
        kind = (where, f"{type(exc).__name__}:{_code(exc)}")
        now = self.clock()
        with self._lock:
            last, left_out = self._last.get(kind, (None, 0))
            if last is not None and now - last < self.every_s:
                self._last[kind] = (last, left_out + 1)
                return False
            self._last[kind] = (now, 0)
        more = f" ({left_out} more like it since the last report)" if left_out else ""
        self.log.error("redis error in %s, not an outage (a bug or corrupted data?); skipped, going on%s: %s",
                       where, more, exc, exc_info=(type(exc), exc, exc.__traceback__))
        return True


#: The process's ``ErrorLog`` (one per process, shared by threads and by the runtimes of a process).
errors = ErrorLog()


Stop = threading.Event | Callable[[], bool]


def _stopped(stop: Stop | None) -> bool:
    if stop is None:
        return False
    return stop.is_set() if isinstance(stop, threading.Event) else bool(stop())


def ride(fn: Callable[[], T], outage: OutageLog, *, stop: Stop | None = None,
         backoff: Backoff | None = None, deadline: float | None = None,
         also: Callable[[BaseException], bool] | None = None, probe: Callable[[], bool] | None = None) -> T:
    """Call ``fn`` until it returns without a transient Redis error, waiting with ``backoff`` between tries.

    Configuration errors and anything else are raised at once (``also``: more errors to retry); the transient
    error is raised too once ``stop`` (an event, or a predicate) is set or the monotonic ``deadline`` has passed.
    ``probe``: for an ``fn`` that may only read, whether Redis takes writes (``OutageLog.recovered``).
    """
    backoff = backoff or Backoff()
    while True:
        try:
            value = fn()
        except redis.RedisError as exc:
            if not is_transient(exc):
                if also is None or not also(exc):
                    raise
            else:  # (an ``also`` error is no outage: retried, not logged)
                outage.failed(exc)
            delay = backoff.next()
            if _stopped(stop) or (deadline is not None and time.monotonic() + delay > deadline):
                raise
            if isinstance(stop, threading.Event):
                stop.wait(delay)
            else:
                time.sleep(delay)
            continue
        outage.recovered(probe)
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

        return ride(attempt, self.ride_outage, stop=self.ride_stop, backoff=Backoff(max_s=RIDING_BACKOFF_MAX_S),
                    probe=self.accepts_writes)

    def accepts_writes(self) -> bool:
        """``accepts_writes`` on this client's pool, tried once."""
        return accepts_writes(self)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> redis.client.Pipeline:
        return _RidingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint, self)


class _RidingPipeline(redis.client.Pipeline):
    """A pipeline resent whole after a transient failure (``execute`` empties the stack, so it is kept).

    With ``raise_on_error=False`` a transient error in a reply (``OOM`` refusing one of the writes) is one too:
    the caller would otherwise raise it outside any ride. A ``NOSCRIPT`` (``SCRIPT FLUSH``, a new master) is
    retried when the pipeline loads its scripts itself (``register_script``'s ``Script`` objects do); one the
    caller handles (an ``evalsha`` it queued with ``raise_on_error=False``) is left to it.
    """

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
            replies = list(super(_RidingPipeline, self).execute(raise_on_error))
            refused = next((r for r in replies if isinstance(r, redis.RedisError) and is_transient(r)), None)
            if refused is not None:
                raise refused
            return replies

        return ride(attempt, self.owner.ride_outage, stop=self.owner.ride_stop,
                    backoff=Backoff(max_s=RIDING_BACKOFF_MAX_S), probe=self.owner.accepts_writes,
                    also=(lambda exc: isinstance(exc, redis.exceptions.NoScriptError)) if scripts else None)


def riding(client: redis.Redis, outage: OutageLog, stop: Stop | None = None,
           decode_responses: bool | None = None) -> RidingRedis:
    """A ``RidingRedis`` on ``client``'s pool, or, when ``decode_responses`` differs from it, on a pool like it
    (``sibling``: through the same sentinels for a Sentinel client)."""
    pool = client.connection_pool
    if decode_responses is None or decode_responses == pool.connection_kwargs.get("decode_responses", False):
        return RidingRedis(pool, outage, stop)
    return RidingRedis(sibling(client, decode_responses=decode_responses).connection_pool, outage, stop)


def wait_for_redis(client: redis.Redis, outage: OutageLog, stop: threading.Event | None = None) -> bool:
    """Ping until Redis answers (True), or until ``stop`` is set (False).

    Raises:
        RedisUnavailableError: on a configuration error (wrong password, ACL, database index), with the masked
            URL and the server's reason.
    """
    try:
        ride(client.ping, outage, stop=stop, probe=lambda: accepts_writes(client))
    except redis.RedisError as exc:
        if is_transient(exc) and stop is not None and stop.is_set():
            return False
        raise unavailable(outage.url, exc) from exc
    return True


# The beat of every loopsq process, on the Redis server's clock (hosts' clocks do not matter). KEYS[1] holds the
# time of the latest beat of any process. When the caller beat before (ARGV[3]: the time of its previous beat)
# and nothing at all was recorded for over ARGV[1] ms since, Redis was away (down, restarting, cut off) while
# the caller ran: liveness keys may have expired without their workers dying, so the recovery grace (KEYS[2],
# ARGV[2] ms) starts. A caller that never beat starts none: a silence before it ran may only mean that no
# process ran. Returns {now, grace left in ms (<= 0: none)}.
_SEEN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local mine = tonumber(ARGV[3]) or 0
redis.call('SET', KEYS[1], now)
if mine > 0 and prev > 0 and now - prev > tonumber(ARGV[1]) then
  redis.call('SET', KEYS[2], now, 'PX', ARGV[2])
  return {now, tonumber(ARGV[2])}
end
return {now, redis.call('PTTL', KEYS[2])}
"""


@dataclass(frozen=True)
class Seen:
    """A beat as the server recorded it: its time (server clock, epoch ms) and the recovery grace left (ms)."""

    at_ms: int
    grace_ms: int

    @property
    def in_grace(self) -> bool:
        """Whether recovery must not judge owners dead yet."""
        return self.grace_ms > 0


def note_seen(client: redis.Redis | redis.client.Pipeline, keys: Keys, gap_ms: int, grace_ms: int,
              mine_ms: int) -> object:
    """Record a beat of this process now; start the recovery grace after a silence of every process over
    ``gap_ms`` that this process lived through (``mine_ms``: the time of its previous beat, 0 if none).

    On a client returns the raw reply (``parse_seen``); on a pipeline queues the call.
    """
    return client.eval(_SEEN, 2, keys.seen, keys.recovery_grace, gap_ms, grace_ms, mine_ms)


def parse_seen(reply: object) -> Seen:
    """``note_seen``'s reply."""
    if isinstance(reply, Exception):
        raise reply
    assert isinstance(reply, list | tuple) and len(reply) == 2, reply
    return Seen(int(reply[0]), int(reply[1]))


def note_restart(client: redis.Redis, keys: Keys, known_run_id: object, info: object, grace_ms: int) -> bool:
    """After ``INFO server``: whether Redis restarted (another ``run_id`` than the one recovery saw last) less
    than ``grace_ms`` ago with data from before it; then the recovery grace starts for what is left of it.

    Liveness keys expire across a restart from AOF (their TTLs are absolute times) while a process that starts
    after it has no beat of its own from before, so the restart itself is the sign. A server that refuses INFO
    (a test double, a managed service that renamed it) is never taken as restarted.
    """
    if not isinstance(info, dict):
        return False
    run_id, uptime = info.get("run_id"), info.get("uptime_in_seconds")
    if not run_id or run_id == known_run_id:
        return False
    client.set(keys.redis_run_id, str(run_id))
    left = grace_ms - int(uptime) * 1000 if uptime is not None else 0
    if known_run_id is None or left <= 0:
        return False
    client.set(keys.recovery_grace, "restart", px=left)
    return True
