"""Claims that survive a failover: ``WAIT`` for a replica before a claimed run executes.

Redis replicates asynchronously. When Sentinel promotes the replica, the old master goes on accepting writes until
Sentinel turns it into a replica of the new one (about 11 s on loopback, ``bench/failover_loss.py``), and every
write it acknowledged meanwhile is then discarded. A claim written there is lost: the slot is free again on the
new master and would run twice. So the claim transition is followed, on the same connection and in the same round
trip, by ``WAIT <n> WAIT_MS``, where ``n`` is what is wanted capped by the replicas the master reports attached and
online (``ReplicaWatch``: ``INFO replication``, re-read at most every ``REFRESH_S`` per process and connection
pool, and after a ``WAIT`` that came back short). ``WAIT n t`` blocks the full ``t`` when fewer than ``n``
replicas are attached, so none is waited for that the master does not have; with none attached, no ``WAIT``.

A claim fewer replicas acknowledged than wanted is settled (``settle``) before its run starts:

- the sentinels name another master than the one the claim went to: a failover is under way and the claim will
  be lost, the run does not start;
- the master reports fewer replicas than wanted since less than ``CONFIRM_S`` (an episode begins; it is logged
  once): the replica may just have been promoted, before the sentinels name it. The run waits, asking the
  sentinels, until ``CONFIRM_S`` after the episode began (once per episode, not per claim);
- otherwise (the episode is older, or a replica is attached but did not acknowledge within ``WAIT_MS``): the run
  starts (availability over durability). Its claim is as durable as the master alone.

A finalize is settled the same way: when the sentinels name a new master, it is recorded again there (the run is
still running under our lease on the new master), so a run that finished during a failover keeps its result
instead of being recovered and run again.

Replicas waited for: ``LOOPSQ_CLAIM_REPLICAS`` (0 turns it off), else 1 on a Sentinel connection and 0 otherwise.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline
from redis.sentinel import MasterNotFoundError, SentinelConnectionPool

from loopsq.errors import ValidationError

log = logging.getLogger(__name__)

REPLICAS_ENV = "LOOPSQ_CLAIM_REPLICAS"
#: How long one ``WAIT`` waits for an attached replica's acknowledgement. It comes within ~1 ms on loopback and a
#: few ms over a LAN, so 200 ms is ample for a healthy replica, yet bounds what a slow one costs each claim.
WAIT_MS = 200
#: How long after the master first reports fewer replicas than wanted claims wait for the sentinels to name another
#: master (a promotion drops the replica at once; the sentinels name it a second or two later).
CONFIRM_S = 5.0
#: How often, at most, a process re-reads ``INFO replication`` (and a ``WAIT`` that came back short).
REFRESH_S = 1.0
#: How often a claim held in an episode's first ``CONFIRM_S`` asks the sentinels again.
POLL_S = 0.1


def claim_replicas(client: redis.Redis) -> int:
    """How many replicas must acknowledge a claim before its run starts.

    Raises:
        ValidationError: when ``LOOPSQ_CLAIM_REPLICAS`` is not a whole number >= 0.
    """
    value = os.environ.get(REPLICAS_ENV, "").strip()
    if value:
        if not value.isdigit():
            raise ValidationError(f"{REPLICAS_ENV} must be a whole number >= 0, got '{value}'")
        return int(value)
    return 1 if isinstance(client.connection_pool, SentinelConnectionPool) else 0


Server = tuple[Any, Any]


def pipelined(client: redis.Redis, build: Callable[[Pipeline], object],
              raise_on_error: bool = True) -> tuple[Server, list[Any]]:
    """Run the commands ``build`` queues as one pipeline on one connection; returns the address of the server
    that answered (host, port: where a Sentinel connection went) and the replies (with ``raise_on_error`` False,
    a failed command's exception in its place).

    The address is that of the connection, not the pool's latest discovery: after a failover a pool holds
    connections to the old master while it already names the new one.
    """
    conn = client.connection_pool.get_connection()
    pipe = client.pipeline(transaction=False)
    pipe.connection = conn  # executed on this connection (redis-py's retry may reconnect it), then released
    try:
        build(pipe)
        replies = pipe.execute(raise_on_error=raise_on_error)
    finally:
        pipe.reset()
    return (getattr(conn, "host", None), getattr(conn, "port", None)), replies


def failed_over(client: redis.Redis, server: Server) -> bool:
    """Whether the sentinels now name another master than ``server`` (always False for a client without
    sentinels). When they do, the pool learns the new master's address (``get_master_address``): its idle
    connections are closed, so that the next command goes to the new master instead of writing on to one whose
    writes will be discarded, and each connection in use now is closed as it is given back (the pool no longer
    owns a connection to another address).

    Never the connections in use: closing them (``pool.disconnect()``) cut other threads' commands off in the
    middle of reading their replies (``I/O operation on closed file``, no ``RedisError``); a claim the master had
    applied lost its reply, its run was left ``running`` under its live worker, and its loop skipped every slot
    until the lease expired (issue 27: a loop stranded by a failover)."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return False
    try:
        current = pool.get_master_address()  # type: ignore[no-untyped-call]
    except MasterNotFoundError:
        return True  # no master agreed on: treat as a failover under way
    moved = tuple(current) != tuple(server)
    if moved:
        pool.disconnect(inuse_connections=False)
    return moved




def kept_on_master(client: redis.Redis, key: str, value: str) -> bool:
    """Whether the master the sentinels name now holds ``value`` at ``key``, read on a connection to that very
    master (a promoted replica receives nothing more from the old master, so what it lacks now it never gets).
    False when that cannot be told: the sentinels agree on no master, Redis is unreachable, or the read went
    elsewhere."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return False
    try:
        master = tuple(pool.get_master_address())  # type: ignore[no-untyped-call]
        where, (found,) = pipelined(client, lambda pipe: pipe.get(key))
    except (redis.RedisError, MasterNotFoundError):
        return False
    text = found.decode() if isinstance(found, bytes) else found
    return tuple(where) == master and text == value


def online_replicas(info: dict[str, Any]) -> int:
    """The replicas an ``INFO replication`` reply lists as attached and ``state=online`` (one in a full sync is
    not: it has not received the data set yet)."""
    count = 0
    for name, value in info.items():
        if not (name.startswith("slave") and name[5:].isdigit()):
            continue
        if isinstance(value, dict):
            state = value.get("state")
        else:
            state = dict(p.split("=", 1) for p in str(value).split(",") if "=" in p).get("state")
        count += state == "online"
    return count


class ReplicaWatch:
    """The replicas a master reports attached, as one process sees them through one connection pool: re-read at
    most every ``REFRESH_S`` (one ``INFO replication`` round trip a second, not one a claim), and at once after a
    ``WAIT`` that came back short. An episode (fewer attached than wanted) is logged when it begins and when it
    ends, never per claim."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        #: Attached, online replicas at the last read (None: not read yet).
        self.attached: int | None = None
        self.read_at = float("-inf")
        #: When (``clock``) the current episode began; None while enough replicas are attached.
        self.since: float | None = None
        self._lock = threading.Lock()

    def attached_now(self, client: redis.Redis, wanted: int) -> int:
        """Attached, online replicas, re-read when the last read is older than ``REFRESH_S`` (or was dropped)."""
        with self._lock:
            now = self.clock()
            if self.attached is None or now - self.read_at >= REFRESH_S:
                self.attached = online_replicas(client.info("replication"))
                self.read_at = now
                self._note(wanted, now)
            return self.attached

    def to_wait(self, client: redis.Redis, wanted: int) -> int:
        """How many replicas a ``WAIT`` after a claim asks for: ``min(wanted, attached)`` (0: no ``WAIT``)."""
        return min(wanted, self.attached_now(client, wanted)) if wanted > 0 else 0

    def short(self) -> None:
        """A ``WAIT`` came back with fewer acknowledgements than asked: re-read on the next call."""
        with self._lock:
            self.read_at = float("-inf")

    def holding_s(self) -> float:
        """Seconds left of the current episode's first ``CONFIRM_S`` (0 when there is no episode or it is older)."""
        with self._lock:
            if self.since is None:
                return 0.0
            return max(0.0, self.since + CONFIRM_S - self.clock())

    def _note(self, wanted: int, now: float) -> None:
        attached = self.attached or 0
        if attached < wanted and self.since is None:
            self.since = now
            log.warning("claims are not replicated: the master reports %d of %d wanted replica(s) attached; runs go "
                        "on unreplicated %.0fs from now unless the sentinels name another master (a failover can "
                        "then lose their claims, and a slot may run twice)", attached, wanted, CONFIRM_S)
        elif attached >= wanted and self.since is not None:
            self.since = None
            log.warning("claims are replicated again: the master reports %d of %d wanted replica(s) attached",
                        attached, wanted)


_watches: weakref.WeakKeyDictionary[Any, ReplicaWatch] = weakref.WeakKeyDictionary()
_watches_lock = threading.Lock()


def watch_for(client: redis.Redis) -> ReplicaWatch:
    """The process's ``ReplicaWatch`` of ``client``'s connection pool."""
    with _watches_lock:
        watch = _watches.get(client.connection_pool)
        if watch is None:
            watch = _watches[client.connection_pool] = ReplicaWatch()
        return watch


def replicas_to_wait(client: redis.Redis, wanted: int) -> int:
    """How many replicas to ``WAIT`` for after a claim or finalize: ``min(wanted, attached)`` (``ReplicaWatch``)."""
    return watch_for(client).to_wait(client, wanted) if wanted > 0 else 0


def settle(client: redis.Redis, server: Server, wanted: int, waited: int, acked: int, *,
           claim: str | None = None, token: str | None = None) -> bool:
    """Whether a write (a claim at key ``claim`` holding ``token``, a finalize) that ``acked`` of ``wanted``
    replicas acknowledged (``waited`` were asked for) counts as made: False when the sentinels name another master
    than ``server`` (the write will be discarded), after holding it through an episode's first ``CONFIRM_S`` (see
    the module).

    Unacknowledged is not lost: a claim the replica received just before its promotion, its acknowledgement not
    yet sent, is on the new master, with the loop moved past the slots its fire gave up. A claim found there
    (``kept_on_master``) counts as made: its run is ours and runs, and the fire records the slots it passed over;
    refused, the run was left to recovery and those slots had no record at all."""
    if wanted <= 0 or acked >= wanted:
        return True
    watch = watch_for(client)
    if acked < waited:
        watch.short()
    while True:
        if failed_over(client, server):
            if claim is not None and token is not None and kept_on_master(client, claim, token):
                log.warning("claim %s not acknowledged by a replica, but the new master has it: running it", claim)
                return True
            if claim is not None:
                log.warning("claim %s not replicated and the sentinels name a new master: not running it", claim)
            return False
        watch.attached_now(client, wanted)
        left = watch.holding_s()
        if left <= 0:
            return True
        time.sleep(min(POLL_S, left))
