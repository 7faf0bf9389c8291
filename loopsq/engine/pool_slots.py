"""Fleet-wide pools at run time (``--pool NAME``, ``state.pools``): a pooled loop's slot takes a slot of its pool
before it is claimed, and gives it back once its run is recorded.

A slot that finds the pool full is not claimed and holds no worker slot while it waits: it joins the pool's fair
queue, and the loop's timer is armed again ``RECHECK_MS`` later. Whoever gives a pool slot back wakes the waiters
that may now go (their loops' timers armed at once), so the recheck is only a safety net. A pool slot is a leased
holder renewed by the worker's beat (``Runtime.keep``): it goes back when the run ends, or when its worker dies
(its lease expires within ``POOL_LEASE_MS``).

Runs started by hand (run-now, a trigger, a backfill) are claimed first and wait for their pool slot on the worker
(``hold_for_claim``), up to ``MANUAL_WAIT_MS``; then they end ``skipped`` with the reason.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from loopsq.domain.models import Loop
from loopsq.domain.timeutil import now as clock_now
from loopsq.domain.timeutil import to_iso
from loopsq.engine import timers
from loopsq.engine.routing import loop_queue
from loopsq.engine.runtime import Runtime
from loopsq.state.pools import Acquired, PoolStore, Waiting

log = logging.getLogger("loopsq.runs")

#: A pool slot's lease: how long a dead worker's slot stays taken at most. Renewed every third of it.
POOL_LEASE_MS = 10_000
#: How soon a waiting loop asks again if nobody wakes it.
RECHECK_MS = 5_000
#: How long a run started by hand waits on its worker for its pool slot.
MANUAL_WAIT_MS = 600_000
POLL_S = 0.2


@dataclass(frozen=True)
class PoolHold:
    """A pool slot a run holds."""

    pool: str
    holder: str
    token: str

    @property
    def name(self) -> str:
        return f"pool slot of {self.holder} in {self.pool}"


def loop_pool(loop: Loop) -> str | None:
    """The pool a loop's runs take a slot of, if any."""
    return loop.pool or None


def missing_error(pool: str) -> str:
    """The reason a pooled run did not run when its pool is gone."""
    return f"pool {pool} does not exist"


def full_error(pool: str, waited_ms: int) -> str:
    """The reason a run started by hand gave up waiting for its pool."""
    return f"pool {pool} stayed full for {waited_ms // 1000}s"


def take_for_slot(rt: Runtime, loop: Loop, slot: datetime, now: datetime, *,
                  running: bool = False) -> PoolHold | Waiting | None:
    """A pool slot for ``loop``'s due ``slot`` before its claim: the hold; ``Waiting`` (the loop's timer is armed
    for a recheck, nothing else written); None when the pool does not exist.

    A loop waits and holds under its own id, whichever slot is due (catch-up may move it while it waits), so it
    keeps its place in the queue; so a pooled loop holds one pool slot at a time: with a run of it still going
    (``running``, overlap ``allow``), its next slot waits for that run to end.
    """
    pool = loop_pool(loop)
    assert pool is not None
    store = PoolStore(rt.client, rt.keys)
    holder = loop.id
    got = Waiting(position=0, holders=0, limit=0) if running else store.acquire(pool, holder, POOL_LEASE_MS)
    if got is None:
        return None
    if isinstance(got, Acquired) and not got.fresh:
        # The loop holds its slot already: another fire of it (raced past the running-run read) took it for a run
        # that goes on. This one must neither run beside it on the same slot nor give that slot back when its
        # claim is refused (a third run would take it: a pool of 2 held 3): it waits, as with a run going.
        got = Waiting(position=0, holders=0, limit=0)
        running = True
    if isinstance(got, Waiting):
        if not running and (got.position == 0 or log.isEnabledFor(logging.DEBUG)):
            log.info("slot %s of loop=%s waits for pool %s (%d of %d held, %d ahead)", to_iso(slot), loop.name, pool,
                     got.holders, got.limit, got.position)
        timers.arm(rt.raw, rt.keys, loop.id, now + timedelta(milliseconds=RECHECK_MS),
                   queue_name=loop_queue(loop, rt.keys))
        return got
    return _keep(rt, store, pool, holder, got)


def hold_for_claim(rt: Runtime, loop: Loop, run_id: str) -> PoolHold | str | None:
    """A pool slot for a run claimed by hand, waited for here: the hold; the reason it ended without one (the pool
    is gone, or stayed full for ``MANUAL_WAIT_MS``); None when the loop takes no pool."""
    pool = loop_pool(loop)
    if pool is None:
        return None
    return _wait_for(rt, pool, f"{loop.id}|run:{run_id}", threading.Event())


def hold_for_step(rt: Runtime, pool: str, holder: str, cancel: threading.Event) -> PoolHold | str:
    """A pool slot for a workflow step, waited for on its workflow run's worker (a step runs inside its run's
    job): the hold, or why the step fails without one (the pool is gone, it stayed full for ``MANUAL_WAIT_MS``,
    or the step was cancelled meanwhile)."""
    return _wait_for(rt, pool, holder, cancel)


def _wait_for(rt: Runtime, pool: str, holder: str, cancel: threading.Event) -> PoolHold | str:
    """Ask for a slot of ``pool`` until one is had (the hold), or why not: the pool is gone, it stayed full for
    ``MANUAL_WAIT_MS``, ``cancel`` was set, or the worker is stopping."""
    store = PoolStore(rt.client, rt.keys)
    started = time.monotonic()
    while True:
        got = store.acquire(pool, holder, POOL_LEASE_MS)
        if got is None:
            return missing_error(pool)
        if isinstance(got, Acquired):
            return _keep(rt, store, pool, holder, got)
        waited = int((time.monotonic() - started) * 1000)
        if waited >= MANUAL_WAIT_MS or cancel.is_set() or rt.stopping:
            store.leave(pool, holder)
            return "cancelled" if cancel.is_set() else full_error(pool, waited)
        cancel.wait(POLL_S)


def _keep(rt: Runtime, store: PoolStore, pool: str, holder: str, got: Acquired) -> PoolHold:
    hold = PoolHold(pool, holder, got.token)
    rt.keep(hold.name, lambda: store.renew(pool, holder, got.token, POOL_LEASE_MS), POOL_LEASE_MS / 3000.0)
    return hold


def give_back(rt: Runtime, hold: PoolHold | None) -> None:
    """Give a pool slot back, and wake the waiters that may now go (their loops' timers armed now)."""
    if hold is None:
        return
    rt.drop(hold.name)
    woken = rt.ride(lambda: PoolStore(rt.client, rt.keys).release(hold.pool, hold.holder, hold.token))
    now = clock_now()
    for waiter in woken:
        loop_id = waiter.split("|", 1)[0]
        if "|run:" in waiter or waiter.startswith("step:"):
            continue  # a run started by hand, or a workflow step, asks again by itself
        loop = rt.loops.get(loop_id)
        if loop is not None and loop.status == "active":
            timers.arm(rt.raw, rt.keys, loop_id, now, queue_name=loop_queue(loop, rt.keys))
