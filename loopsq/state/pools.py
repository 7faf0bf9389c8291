"""Fleet-wide pools in Redis: named limits shared by every worker, each slot a fenced, leased holder, with a fair
queue of waiters.

A pool is the workspace lease (``state.workspaces``) generalised from one holder to ``limit``. Its definition is a
field of ``keys.pools`` (``{"limit": N}``); ``set`` and ``delete`` are transitions with their change-stream event
(``pool_set``, ``pool_deleted``; the pool in the change's ``detail``, as no mirror table holds pools). Its state:

- ``keys.pool_holders(P)``: holder id -> ``<lease key>|<token>|<fence>|<since ms>``. A holder is live while its
  lease key (``keys.pool_lease(P, holder)``, a string with a TTL) holds its token: ``renew`` extends it
  (compare-and-extend), ``release`` deletes it (compare-and-delete), and a holder whose worker died simply lets it
  lapse. The hash's own TTL is kept at least as long as any lease in it, so it goes when the last lease has gone.
- ``keys.pool_waiters(P)``: holders waiting for a slot, scored by their first ask (ms; strictly increasing, so
  that two asks in one millisecond are still served in the order they came): a FIFO queue.
- ``keys.pool_seen(P)``: waiter id -> its last ask (ms). A waiter that has not asked for ``waiter_ttl_ms`` has left
  the queue. Both keys expire ``waiter_ttl_ms`` after the latest ask, when every waiter in them has left.
- ``keys.pool_fence(P)``: the last fencing number handed out. It starts from Redis's clock in microseconds, so a
  pool deleted and set again never hands out a fence it handed out before (each acquisition takes Redis more
  than a microsecond).

``acquire`` is one Lua script on Redis's clock (``TIME``): it drops dead holders and waiters that stopped asking,
answers a holder that holds a live slot with that slot (a resent acquisition), and otherwise records the ask and
admits the holder only if fewer waiters still asking are ahead of it than there are free slots. So there are never
more than ``limit`` live holders whatever the races, a lowered limit lets the holders above it finish and admits
nobody until under it, and a slot that frees goes to the head of the queue, not to a later asker.

Acquisitions, renewals and releases append no change: like a run lease's beats they are hot, leased state that no
mirror holds, and the engine records what a run waited for and got on the run itself.

``delete`` removes the pool's keys (and the lease keys of the holders it saw; any other expires on its own within
its lease). Holders running then finish undisturbed: their ``renew`` answers False and their ``release`` does
nothing, so the engine must not treat a pool slot's failed renewal as a reason to stop a run; and an ``acquire``
of the deleted pool answers None (no such pool).
"""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from typing import Any

import redis

from loopsq.domain.pools import check_pool_limit, check_pool_name
from loopsq.domain.timeutil import from_ms, gen_id, to_iso
from loopsq.domain.timeutil import now as _now
from loopsq.errors import ConflictError, ValidationError
from loopsq.state import pool_scripts
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys, has_old_spelling

#: A waiter that has not asked for this long has left the queue.
WAITER_TTL_MS = 30_000
#: How many waiters ahead of an asker one ``acquire`` looks at (and drops, when they stopped asking) at most; an
#: asker further back is told its position counting those beyond as waiting, and moves up as the queue advances.
MAX_WALK = 256
MAX_RETRIES = 20


@dataclass(frozen=True)
class Pool:
    """A pool's definition."""

    name: str
    limit: int

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "limit": self.limit}


@dataclass(frozen=True)
class Acquired:
    """A slot held: the token its lease holds (for ``renew`` and ``release``) and its fencing number. ``fresh``:
    taken by this call; False: the holder held a live slot already (this call's ``acquire`` re-entered it)."""

    token: str
    fence: int
    fresh: bool = True


@dataclass(frozen=True)
class Waiting:
    """No slot yet: ``position`` waiters still asking are ahead (0: next in line); ``holders`` of ``limit`` held."""

    position: int
    holders: int
    limit: int


@dataclass(frozen=True)
class HolderInfo:
    """A live holder: its fence, since when it holds the slot (ISO), and how long its lease has left."""

    holder: str
    fence: int
    since: str
    expires_in_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {"holder": self.holder, "fence": self.fence, "since": self.since, "expiresInMs": self.expires_in_ms}


@dataclass(frozen=True)
class WaiterInfo:
    """A waiter still asking: its place (0: next in line), since when it waits and when it last asked (ISO)."""

    holder: str
    position: int
    since: str
    last_asked_at: str

    def to_dict(self) -> dict[str, Any]:
        return {"holder": self.holder, "position": self.position, "since": self.since,
                "lastAskedAt": self.last_asked_at}


@dataclass(frozen=True)
class PoolState:
    """A pool with its live holders (by acquisition) and its waiters still asking (in queue order)."""

    pool: Pool
    holders: list[HolderInfo]
    waiters: list[WaiterInfo]

    def summary(self) -> dict[str, Any]:
        """``{name, limit, inUse, waiting}``."""
        return {**self.pool.to_dict(), "inUse": len(self.holders), "waiting": len(self.waiters)}

    def to_dict(self) -> dict[str, Any]:
        """The summary with ``holders`` and ``waiters``."""
        return {**self.summary(), "holders": [h.to_dict() for h in self.holders],
                "waiters": [w.to_dict() for w in self.waiters]}


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _parse_holder(value: str) -> tuple[str, str, int, int] | None:
    """``<lease key>|<token>|<fence>|<since ms>`` -> its parts (the lease key may hold ``|``: parsed from the right)."""
    parts = value.rsplit("|", 3)
    if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
        return None
    return parts[0], parts[1], int(parts[2]), int(parts[3])


def _limit_of(raw: Any) -> int:
    return int(json.loads(_s(raw))["limit"])


class PoolStore:
    """Pools on one Redis connection."""

    def __init__(self, client: redis.Redis, keys: Keys, *, waiter_ttl_ms: int = WAITER_TTL_MS,
                 committer: Committer | None = None) -> None:
        self.client = client
        self.keys = keys
        self.waiter_ttl_ms = waiter_ttl_ms
        self.committer = committer or Committer(client, keys)
        self._acquire = client.register_script(pool_scripts.ACQUIRE)
        self._renew = client.register_script(pool_scripts.RENEW)
        self._release = client.register_script(pool_scripts.RELEASE)

    # -- definitions ---------------------------------------------------------------------------------------------
    def set(self, name: str, limit: int) -> Pool:
        """Create pool ``name`` with ``limit``, or change its limit (one ``pool_set`` transition; none when the
        limit is already that). A lowered limit lets the holders above it finish.

        Raises:
            ValidationError: a name that is not a label, a limit that is not a whole number from 1 to 10000.
        """
        name = check_pool_name(name)
        limit = check_pool_limit(limit)
        value = json.dumps({"limit": limit}, separators=(",", ":"))
        for _ in range(MAX_RETRIES):
            raw = self.client.hget(self.keys.pools, name)
            current = None if raw is None else _s(raw)
            if current is not None and _limit_of(current) == limit:
                return Pool(name, limit)
            tx = (Tx("pool_set", to_iso(_now()))
                  .expect_field(self.keys.pools, name, current)
                  .hset(self.keys.pools, name, value)
                  .describe(pool=name, limit=limit,
                            previousLimit=None if current is None else _limit_of(current)))
            if self.committer.commit(tx).ok:
                return Pool(name, limit)
        raise ConflictError(f"pool {name} changed concurrently {MAX_RETRIES} times; try again")

    def get(self, name: str) -> Pool | None:
        """Pool ``name``, or None."""
        raw = self.client.hget(self.keys.pools, name)
        return None if raw is None else Pool(name, _limit_of(raw))

    def list(self) -> builtins.list[Pool]:
        """Every pool, by name."""
        found = self.client.hgetall(self.keys.pools)
        return sorted((Pool(_s(k), _limit_of(v)) for k, v in found.items()), key=lambda pool: pool.name)

    def delete(self, name: str) -> bool:
        """Remove pool ``name`` and its keys (one ``pool_deleted`` transition); False when there is none. Holders
        running then finish: their ``renew`` answers False, their ``release`` does nothing."""
        holders_key = self.keys.pool_holders(name)
        for _ in range(MAX_RETRIES):
            raw = self.client.hget(self.keys.pools, name)
            if raw is None:
                return False
            tx = (Tx("pool_deleted", to_iso(_now()))
                  .expect_field(self.keys.pools, name, _s(raw))
                  .hdel(self.keys.pools, name))
            for holder in self.client.hkeys(holders_key):
                tx.delete_key(self.keys.pool_lease(name, _s(holder)))
            for keys in (self.keys, self.keys.before_encoding) if has_old_spelling(name) else (self.keys,):
                # A version before ``keys.key_part`` kept a pool with ``:`` in its name under the raw spelling;
                # its fence counter there has no TTL.
                for key in (keys.pool_holders(name), keys.pool_waiters(name), keys.pool_seen(name),
                            keys.pool_fence(name)):
                    tx.delete_key(key)
            tx.describe(pool=name, limit=_limit_of(raw))
            if self.committer.commit(tx).ok:
                return True
        raise ConflictError(f"pool {name} changed concurrently {MAX_RETRIES} times; try again")

    # -- slots ---------------------------------------------------------------------------------------------------
    def acquire(self, pool: str, holder: str, lease_ms: int) -> Acquired | Waiting | None:
        """Take a slot of ``pool`` for ``holder`` with a lease of ``lease_ms``, or join (or stay in) its queue.

        ``Acquired`` when it holds a slot (the same one when it held a live slot already); ``Waiting`` otherwise:
        ask again within ``waiter_ttl_ms`` to keep the place. None when there is no such pool.
        """
        if not holder:
            raise ValidationError("pool holder must be a non-empty string, got \"\"")
        if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms <= 0:
            raise ValidationError(f"lease_ms must be a positive integer, got {lease_ms!r}")
        keys = [self.keys.pools, self.keys.pool_holders(pool), self.keys.pool_waiters(pool),
                self.keys.pool_seen(pool), self.keys.pool_fence(pool), self.keys.pool_lease(pool, holder)]
        token = gen_id() + gen_id()
        reply = self._acquire(keys=keys, args=[pool, holder, lease_ms, token, self.waiter_ttl_ms, MAX_WALK])
        kind = int(reply[0])
        if kind == 0:
            return None
        if kind == 1:
            held = _s(reply[1])
            return Acquired(held, int(_s(reply[2])), fresh=held == token)
        return Waiting(int(reply[1]), int(reply[2]), int(reply[3]))

    def renew(self, pool: str, holder: str, token: str, lease_ms: int) -> bool:
        """Compare-and-extend ``holder``'s slot lease to ``lease_ms`` from now. False: the slot is not ours any
        more (its lease lapsed, it was released, or the pool was deleted); it is not re-made."""
        return bool(self._renew(keys=[self.keys.pool_holders(pool)], args=[holder, token, lease_ms]))

    def release(self, pool: str, holder: str, token: str) -> builtins.list[str]:
        """Compare-and-delete ``holder``'s slot (only while ``token`` is its token). Returns the waiters that may
        go now, head of the queue first, as many as there are free slots: the engine wakes them to ``acquire``."""
        keys = [self.keys.pools, self.keys.pool_holders(pool), self.keys.pool_waiters(pool), self.keys.pool_seen(pool)]
        reply = self._release(keys=keys, args=[pool, holder, token, self.waiter_ttl_ms, MAX_WALK])
        return [_s(item) for item in reply or []]

    def leave(self, pool: str, holder: str) -> None:
        """Stop waiting for ``pool`` (a holder's slot, if it has one, is kept: ``release`` frees that)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(self.keys.pool_waiters(pool), holder)
        pipe.hdel(self.keys.pool_seen(pool), holder)
        pipe.execute()

    # -- reads ---------------------------------------------------------------------------------------------------
    def state(self, name: str) -> PoolState | None:
        """Pool ``name`` with its live holders and its waiters still asking (judged on Redis's clock), or None."""
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(self.keys.pools, name)
        pipe.hgetall(self.keys.pool_holders(name))
        pipe.zrange(self.keys.pool_waiters(name), 0, -1, withscores=True)
        pipe.hgetall(self.keys.pool_seen(name))
        pipe.time()
        raw, holders, waiters, seen, (seconds, micros) = pipe.execute()
        if raw is None:
            return None
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        entries = [(_s(h), parsed) for h, v in holders.items() if (parsed := _parse_holder(_s(v))) is not None]
        leases = self.client.pipeline(transaction=False)
        for _holder, (lease, _token, _fence, _since) in entries:
            leases.get(lease)
            leases.pttl(lease)
        answers = leases.execute() if entries else []
        live = [HolderInfo(holder, fence, to_iso(from_ms(since)), int(answers[2 * i + 1]))
                for i, (holder, (_lease, token, fence, since)) in enumerate(entries)
                if answers[2 * i] is not None and _s(answers[2 * i]) == token]
        asked = {_s(k): int(_s(v)) for k, v in seen.items() if _s(v).isdigit()}
        fresh = [(_s(w), score) for w, score in waiters if now_ms - asked.get(_s(w), -10**18) <= self.waiter_ttl_ms]
        return PoolState(
            Pool(name, _limit_of(raw)),
            sorted(live, key=lambda h: h.fence),
            [WaiterInfo(w, i, to_iso(from_ms(int(score))), to_iso(from_ms(asked[w])))
             for i, (w, score) in enumerate(fresh)],
        )
