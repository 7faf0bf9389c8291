"""Claims that survive a failover: ``WAIT`` for a replica before a claimed run executes.

Redis replicates asynchronously. When Sentinel promotes the replica, the old master goes on accepting writes until
Sentinel turns it into a replica of the new one (about 11 s on loopback, ``bench/failover_loss.py``), and every
write it acknowledged meanwhile is then discarded. A claim written there is lost: the slot is free again on the
new master and would run twice. So the claim transition is followed, on the same connection, by ``WAIT
<replicas> <ms>``; a claim no replica acknowledged is confirmed (``confirm``) before its run starts:

- the claim key is gone or holds another token: lost, the run does not start;
- the sentinels name another master than the one our connections went to: a failover is under way and the
  claim will be lost, the run does not start;
- a replica acknowledges it (a write on the same connection, then ``WAIT``): the run starts;
- still neither after ``CONFIRM_S``: the replica is down or lagging while the master stays; the run starts
  (availability over durability), with a warning.

A finalize is followed by the same ``WAIT``: when no replica acknowledged it and the sentinels name a new master,
it is recorded again there (the run is still running under our lease on the new master), so a run that finished
during a failover keeps its result instead of being recovered and run again.

Replicas waited for: ``LOOPSQ_CLAIM_REPLICAS`` (0 turns it off), else 1 on a Sentinel connection and 0 otherwise.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline
from redis.sentinel import MasterNotFoundError, SentinelConnectionPool

from loopsq.errors import ValidationError

log = logging.getLogger(__name__)

REPLICAS_ENV = "LOOPSQ_CLAIM_REPLICAS"
#: How long one ``WAIT`` waits for a replica's acknowledgement (on loopback it comes within a millisecond).
WAIT_MS = 1000
#: How long an unacknowledged claim is confirmed before it runs anyway on a master the sentinels still name.
CONFIRM_S = 5.0


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
    sentinels). When they do, the pool's connections are closed, so that the next command asks the sentinels and
    goes to the new master instead of writing on to one whose writes will be discarded."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return False
    try:
        current = pool.sentinel_manager.discover_master(pool.service_name)
    except MasterNotFoundError:
        return True  # no master agreed on: treat as a failover under way
    moved = tuple(current) != tuple(server)
    if moved:
        pool.disconnect()
    return moved


def replicated(client: redis.Redis, server: Server, probe_key: str, replicas: int, *,
               budget_s: float | None = None) -> bool:
    """After a write no replica acknowledged (a finalize): True once a replica acknowledges a later write to the
    same master (``probe_key``, then ``WAIT``: replication is one ordered stream), or when ``budget_s`` runs out
    on a master the sentinels still name; False when they name another master (``failed_over``), where the
    write is to be made again."""
    budget_s = CONFIRM_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget_s
    while True:
        if failed_over(client, server):
            return False
        def probe(pipe: Pipeline) -> None:
            pipe.set(probe_key, "1", px=60_000)
            pipe.wait(replicas, WAIT_MS)

        answered, (_ok, acked) = pipelined(client, probe)
        if answered != server:
            return False  # another server answered: the write is to be made again where we now are
        if int(acked) >= replicas:
            return True
        if time.monotonic() >= deadline:
            log.warning("a write not acknowledged by %d replica(s) within %.0fs, on a master the sentinels still "
                        "name: going on (a replica is down or lagging)", replicas, budget_s)
            return True


def confirm(client: redis.Redis, server: Server, key: str, token: str, ttl_ms: int, replicas: int, *,
            budget_s: float | None = None) -> bool:
    """Confirm the write of ``token`` at ``key`` (a claim) that no replica has acknowledged yet (see the module).

    Returns True when its run may start, False when the claim is lost or about to be.
    """
    budget_s = CONFIRM_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget_s
    while True:
        if failed_over(client, server):
            log.warning("claim %s not replicated and the sentinels name a new master: not running it", key)
            return False
        # A write (the PEXPIRE), so that the WAIT after it covers the claim too: replication is one ordered stream.
        def recheck(pipe: Pipeline) -> None:
            pipe.get(key)
            pipe.pexpire(key, ttl_ms)
            pipe.wait(replicas, WAIT_MS)

        server, (current, _renewed, acked) = pipelined(client, recheck)
        if current is None or (current.decode() if isinstance(current, bytes) else current) != token:
            log.warning("claim %s was lost (a failover discarded it): not running it", key)
            return False
        if int(acked) >= replicas:
            return True
        if time.monotonic() >= deadline:
            log.warning("claim %s not acknowledged by %d replica(s) within %.0fs, on a master the sentinels still "
                        "name: running it (a replica is down or lagging)", key, replicas, budget_s)
            return True
