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

Replicas waited for: ``LOOPSQ_CLAIM_REPLICAS`` (0 turns it off), else 1 on a Sentinel connection and 0 otherwise.
"""

from __future__ import annotations

import logging
import os
import time

import redis
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


def failed_over(client: redis.Redis) -> bool:
    """Whether the sentinels now name another master than the one ``client``'s connections went to (always
    False for a client without sentinels)."""
    pool = client.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return False
    ours = pool.master_address
    try:
        current = pool.sentinel_manager.discover_master(pool.service_name)
    except MasterNotFoundError:
        return True  # no master agreed on: treat as a failover under way
    return ours is not None and tuple(current) != tuple(ours)


def confirm(client: redis.Redis, key: str, token: str, ttl_ms: int, replicas: int, *,
            budget_s: float = CONFIRM_S) -> bool:
    """Confirm the write of ``token`` at ``key`` (a claim) that no replica has acknowledged yet (see the module).

    Returns True when its run may start, False when the claim is lost or about to be.
    """
    deadline = time.monotonic() + budget_s
    while True:
        if failed_over(client):
            log.warning("claim %s not replicated and the sentinels name a new master: not running it", key)
            return False
        pipe = client.pipeline(transaction=False)
        pipe.get(key)
        pipe.pexpire(key, ttl_ms)  # a write on this connection, so that WAIT covers the claim before it
        pipe.wait(replicas, WAIT_MS)
        current, _renewed, acked = pipe.execute()
        if current is None or (current.decode() if isinstance(current, bytes) else current) != token:
            log.warning("claim %s was lost (a failover discarded it): not running it", key)
            return False
        if int(acked) >= replicas:
            return True
        if time.monotonic() >= deadline:
            log.warning("claim %s not acknowledged by %d replica(s) within %.0fs, on a master the sentinels still "
                        "name: running it (a replica is down or lagging)", key, replicas, budget_s)
            return True
