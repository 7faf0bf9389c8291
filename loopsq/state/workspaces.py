"""Workspace leases (``--workspace KEY``): loops, across all hosts, whose runs must not overlap on one workspace.

The lease of ``KEY`` is the key ``keys.workspace(KEY)`` holding ``<run id>|<token>|<fence>``: the holding run and
its run lease token. It is live exactly while that run's lease key holds that token, so it has the run lease's
liveness for free: renewed by the run's heartbeat, gone when the run is finalized, and taken over as soon as a
dead worker's run is recovered (or its lease expires). Acquiring it is one transition (``run_workspace_acquired``,
fenced by the acquirer's own run lease) that also records the workspace and a fencing number (one more per
acquisition, ``keys.workspace_fence``) on the run; a stale holder's value is replaced only if it is still the one
seen (compare-and-set). Release is a compare-and-delete of our own value. Runs that wait (overlap ``allow``)
queue in ``keys.workspace_queue(KEY)``, oldest first, so that waiting is fair.

Keys are spelled by ``keys.key_part``: ``X:fence`` is its own workspace, not ``X``'s fence counter. A fence an
older version counted under the raw spelling of a key (one with ``:``, ``*``, ``{``… in it) is carried over: the
next fence is one more than the larger of the two, so fences never go back across the upgrade (``_fence_of``).

A workflow step (``engine.step_workspaces``) is a holder with a lease of its own, ``keys.lease(step:<run>:<step>)``,
which its runner sets and beats (``take_own_lease``, ``renew_own_lease``); ``acquire_as`` takes a workspace for such a holder, fenced
by that lease, with the same compare-and-set on a dead holder's value, and records no run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import redis

from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import now as _now
from loopsq.domain.timeutil import to_iso, to_ms
from loopsq.state import run_codec
from loopsq.state.commit import Tx
from loopsq.state.keys import has_old_spelling
from loopsq.state.run_moves import _s
from loopsq.state.runs import RunStore

MAX_RETRIES = 50


def to_iso_now() -> str:
    return to_iso(_now())


@dataclass(frozen=True)
class Holder:
    """Who holds a workspace: the run, its lease token and the fence it got; ``live`` while its lease holds."""

    run_id: str
    token: str
    fence: int
    live: bool

    @classmethod
    def parse(cls, value: str, lease: str | None) -> Holder:
        parts = value.split("|")
        run_id, token, fence = parts[0], parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else ""
        return cls(run_id, token, int(fence) if fence.isdigit() else 0, lease is not None and lease == token)


@dataclass(frozen=True)
class Acquired:
    """The outcome of one attempt to take a workspace: ``run`` (as recorded with its workspace and fence) when
    taken; else the live ``holder``; neither when our own lease was lost."""

    run: LoopRun | None = None
    holder: Holder | None = None


def _fence_of(reply: object) -> int:
    """The fence an older version counted under a key's raw spelling, or 0. That spelling may instead be another
    key's lease under the raw spelling (``X:fence`` was both ``X``'s counter and workspace ``X:fence``'s lease),
    which is no number, or an error reply: either counts as none."""
    text = _s(reply) if isinstance(reply, (bytes, str)) else None
    return int(text) if text is not None and text.isascii() and text.isdigit() else 0


class WorkspaceLeases:
    """Workspace leases on a ``RunStore``'s connection."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.client: redis.Redis = store.client
        self.keys = store.keys

    def holder(self, key: str) -> Holder | None:
        """The current holder of ``key`` (live or not), or None when nobody holds it."""
        value = _s(self.client.get(self.keys.workspace(key)))
        if value is None:
            return None
        run_id = value.split("|", 1)[0]
        return Holder.parse(value, _s(self.client.get(self.keys.lease(run_id))))

    def live_holder(self, key: str) -> Holder | None:
        """The holder of ``key`` while it is live."""
        found = self.holder(key)
        return found if found is not None and found.live else None

    def acquire(self, key: str, run_id: str, token: str, now: datetime) -> Acquired:
        """Take ``key`` for the running run ``run_id`` (whose lease holds ``token``) unless another live run
        holds it."""
        ws_key, fence_key, lease_key = self.keys.workspace(key), self.keys.workspace_fence(key), self.keys.lease(run_id)
        for _ in range(MAX_RETRIES):
            value, fence_raw, floor = self._read(key)
            raw = run_codec.read(self.client, self.keys.run(run_id))
            if raw is None:
                return Acquired()
            holder_lease: str | None = None
            if value is not None:
                holder_id = value.split("|", 1)[0]
                holder_lease = _s(self.client.get(self.keys.lease(holder_id)))
                holder = Holder.parse(value, holder_lease)
                if holder.run_id == run_id and holder.token == token:
                    return Acquired(run=run_codec.decode(raw))  # ours already (a resent acquisition)
                if holder.live:
                    return Acquired(holder=holder)
            fence = max(int(fence_raw or 0), floor) + 1
            run = run_codec.decode(raw)
            if run.status != "running":
                return Acquired()
            new = run.with_changes(workspace=key, workspace_fence=fence, updated_at=to_iso(now))
            tx = (
                Tx("run_workspace_acquired", to_iso(now))
                .expect(lease_key, token)
                .expect(self.keys.run(run_id), raw)
                .expect(ws_key, value)
                .expect(fence_key, fence_raw)
            )
            if value is not None:
                tx.expect(self.keys.lease(value.split("|", 1)[0]), holder_lease)  # still dead as seen
            (
                tx.set(ws_key, f"{run_id}|{token}|{fence}")
                .set(fence_key, str(fence))
                .set(self.keys.run(run_id), run_codec.encode(new))
                .zrem(self.keys.workspace_queue(key), run_id)
                .patch("loop_runs", run.to_dict(), new.to_dict())
            )
            result = self.store.committer.commit(tx)
            if result.ok:
                return Acquired(run=new)
            if result.failed_guard == 0:
                return Acquired()  # our own lease is lost: we may not take anything
        return Acquired()

    def _read(self, key: str) -> tuple[str | None, str | None, int]:
        """``key``'s lease value, its fence counter, and the floor of its next fence (``_fence_of``), in one round
        trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.workspace(key))
        pipe.get(self.keys.workspace_fence(key))
        legacy = has_old_spelling(key)
        if legacy:
            pipe.get(self.keys.before_encoding.workspace_fence(key))
        replies = pipe.execute(raise_on_error=False)  # only the old spelling's reply may be an error to ignore
        for reply in replies[:2]:
            if isinstance(reply, Exception):
                raise reply
        value, fence_raw = _s(replies[0]), _s(replies[1])
        return value, fence_raw, _fence_of(replies[2]) if legacy else 0

    def release(self, key: str, run_id: str, token: str) -> bool:
        """Compare-and-delete: drop ``key``'s lease only while it is still ours."""
        ws_key = self.keys.workspace(key)
        with self.client.pipeline() as pipe:
            try:
                pipe.watch(ws_key)  # type: ignore[no-untyped-call]  # redis-py leaves watch untyped
                value = _s(pipe.get(ws_key))
                if value is None or not value.startswith(f"{run_id}|{token}|"):
                    return False
                pipe.multi()
                pipe.delete(ws_key)
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    # -- holders that are not loop runs: workflow steps ---------------------------------------------------------
    def take_own_lease(self, holder_id: str, token: str, lease_ms: int) -> bool:
        """Set ``holder_id``'s own lease (``keys.lease(holder_id)`` = ``token`` for ``lease_ms``; SET NX): a
        workflow step's, which its runner beats (``renew_own_lease``) while it waits for a workspace and holds one."""
        return bool(self.client.set(self.keys.lease(holder_id), token, px=lease_ms, nx=True))

    def renew_own_lease(self, holder_id: str, token: str, lease_ms: int) -> bool:
        """Compare-and-extend ``holder_id``'s own lease. False: it was lost, and is not re-made."""
        lease = self.keys.lease(holder_id)
        tx = Tx("workspace_lease_renewed", to_iso_now()).expect(lease, token).set(lease, token, px=lease_ms)
        return self.store.committer.commit(tx).ok

    def drop_own_lease(self, holder_id: str, token: str) -> None:
        """Delete ``holder_id``'s own lease if it is still ours."""
        lease = self.keys.lease(holder_id)
        self.store.committer.commit(Tx("workspace_lease_dropped", to_iso_now()).expect(lease, token).delete_key(lease))

    def acquire_as(self, key: str, holder_id: str, token: str, now: datetime) -> tuple[int | None, Holder | None]:
        """Take ``key`` for a holder with its own lease (``take_own_lease``) unless a live holder has it:
        ``(fence, None)`` when taken, ``(None, holder)`` when busy, ``(None, None)`` when our own lease is lost.
        One transition (``workspace_acquired``), fenced by our lease, compare-and-set on a dead holder's value."""
        ws_key, fence_key, lease_key = self.keys.workspace(key), self.keys.workspace_fence(key), self.keys.lease(holder_id)
        for _ in range(MAX_RETRIES):
            value, fence_raw, floor = self._read(key)
            holder_lease: str | None = None
            if value is not None:
                holder_lease = _s(self.client.get(self.keys.lease(value.split("|", 1)[0])))
                holder = Holder.parse(value, holder_lease)
                if holder.run_id == holder_id and holder.token == token:
                    return holder.fence, None  # ours already (a resent acquisition)
                if holder.live:
                    return None, holder
            fence = max(int(fence_raw or 0), floor) + 1
            tx = (Tx("workspace_acquired", to_iso(now)).expect(lease_key, token).expect(ws_key, value)
                  .expect(fence_key, fence_raw))
            if value is not None:
                tx.expect(self.keys.lease(value.split("|", 1)[0]), holder_lease)  # still dead as seen
            tx.set(ws_key, f"{holder_id}|{token}|{fence}").set(fence_key, str(fence)).zrem(
                self.keys.workspace_queue(key), holder_id)
            result = self.store.committer.commit(tx)
            if result.ok:
                return fence, None
            if result.failed_guard == 0:
                return None, None
        return None, None

    # -- the fair queue ----------------------------------------------------------------------------------------
    def enqueue(self, key: str, run_id: str, now: datetime) -> None:
        """Join ``key``'s queue (once: a rejoin keeps the original place)."""
        self.client.zadd(self.keys.workspace_queue(key), {run_id: to_ms(now)}, nx=True)

    def leave(self, key: str, run_id: str) -> None:
        """Leave ``key``'s queue."""
        self.client.zrem(self.keys.workspace_queue(key), run_id)

    def first_waiting(self, key: str) -> str | None:
        """The run whose turn it is: the oldest waiter whose run still holds a lease (dead waiters are dropped)."""
        queue = self.keys.workspace_queue(key)
        for _ in range(MAX_RETRIES):
            head = self.client.zrange(queue, 0, 0)
            if not head:
                return None
            run_id = str(_s(head[0]))
            if self.client.exists(self.keys.lease(run_id)):
                return run_id
            self.client.zrem(queue, run_id)
        return None
