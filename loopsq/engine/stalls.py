"""The progress watchdog (ARCHITECTURE invariant 8): repair a stalled loop — find and remove what blocks it —
record it (``keys.stalls``), count it (``keys.repaired_counts``, ``loopsq_loops_repaired_total{cause}``) and log
one line naming the cause.

Two causes are repaired, each where it shows, never by a pass over every loop:

- ``lost_fire_job`` (maintenance, on a loop its watch index brings up): the loop's timer fired, the job's hash says
  ``queued``, yet no queue holds it; or it says ``started`` by a live worker, past the loop's grace, while no run
  of the loop goes on: the worker took it on the new master and its settle went to the old one, which a failover
  then discarded (a worker's pool holds connections to both masters until the old one is demoted). Either way
  maintenance would count it in flight forever (the second, for as long as that worker lives). The hash goes and
  the timer is armed now.
- ``hot_loop`` (a fire, on its refusal path only): a slot's claim is refused again and again (a claim key left
  behind) while no run of the loop goes on; each refusal re-armed the timer at the same past time. Past
  ``HOT_REFUSALS`` refusals in a minute the loop moves past the slot, which is recorded ``missed`` (``stalled``).
"""

from __future__ import annotations

import logging
from datetime import datetime

import redis

from loopsq.domain import missed
from loopsq.domain import stalls as rules
from loopsq.domain.models import Loop
from loopsq.domain.timeutil import to_iso, to_ms
from loopsq.engine import timers
from loopsq.engine.routing import loop_queue
from loopsq.engine.runtime import Runtime
from loopsq.state.keys import Keys

log = logging.getLogger("loopsq.stalls")

#: Refusals that say nothing is stuck: the slot is settled or behind the loop, or the loop is gone or not active.
_NOT_STUCK = frozenset({"done", "exhausted", "past", "gone", "inactive"})


def record(rt: Runtime, loop: Loop, cause: str, now: datetime, *, repaired: bool, how: str) -> None:
    """Record, count (a repair) and log, in one line, that ``loop`` was found stalled for ``cause``."""
    prune(rt, now)
    stall = rules.stall_at(cause, now, repaired=repaired)
    pipe = rt.client.pipeline(transaction=False)
    pipe.hset(rt.keys.stalls, loop.id, stall.to_json())
    if repaired:
        pipe.hincrby(rt.keys.repaired_counts, cause, 1)
    pipe.execute()
    log.warning("loop %s (id=%s) stalled, cause=%s: %s; %s", loop.name, loop.id, cause, rules.CAUSE_TEXT[cause],
                how)


def repair_lost_fire(rt: Runtime, loop: Loop, due: datetime, now: datetime) -> bool:
    """Maintenance's check of a loop overdue past its grace, with no run going on, whose timer's job is ``queued``
    or ``started`` by a live worker: when no queue holds the queued job, or the started one was started longer
    than the grace ago (a fire holds a run of its loop within moments of its start), drop its hash and arm the
    timer now. Should that fire still be under way after all, the slot's claim keeps the re-armed timer from
    running the slot twice. Returns whether it was repaired."""
    timer = rt.client.get(rt.keys.timer(loop.id))
    job_id = _s(timer) if timer else ""
    if not job_id:
        return False
    status, started, worker = rt.raw.hmget(timers.job_key(job_id), ["status", "started_at", "worker_name"])
    left = ""
    if status is not None and _s(status) == "started":
        at = timers.enqueued_time(started)
        if at is None or to_ms(now) - to_ms(at) <= rules.grace_ms(loop, due, rules.grace_min_ms()):
            return False
        left = f" (left started by {_s(worker or b'-')} {(to_ms(now) - to_ms(at)) // 1000}s ago)"
    elif timers.queued_in_place(rt.raw, job_id) is not False:
        return False
    timers.drop_stranded(rt.raw, job_id)
    armed = timers.arm(rt.raw, rt.keys, loop.id, now, queue_name=loop_queue(loop, rt.keys))
    late = (to_ms(now) - to_ms(due)) // 1000
    record(rt, loop, rules.LOST_FIRE_JOB, now, repaired=armed is not None,
           how=f"slot {to_iso(due)} overdue {late}s; dropped job {job_id}{left}, timer re-armed now")
    return armed is not None


def refused(rt: Runtime, loop: Loop, slot: datetime, reason: str, now: datetime) -> bool:
    """A fire's claim of ``slot`` was refused for ``reason``: count the refusal, and past ``HOT_REFUSALS`` in a
    minute with no run of the loop going on, move the loop past the slot and record it missed. Only on a fire's
    refusal path (a fire that claims costs nothing more). Returns whether the loop was moved."""
    if reason in _NOT_STUCK:
        return False
    slot_iso = to_iso(slot)
    key = rt.keys.slot_fires(loop.id, slot_iso)
    pipe = rt.client.pipeline(transaction=False)
    pipe.incr(key)
    pipe.expire(key, rules.HOT_WINDOW_S, nx=True)
    pipe.scard(rt.keys.loop_active(loop.id))
    count, _, running = pipe.execute()
    # Exactly one fire repairs a slot (the one whose refusal crosses the limit), and never while a run goes on.
    if int(count) != rules.HOT_REFUSALS + 1 or int(running):
        return False
    moved = rt.runs.advance_past(loop.id, slot, now)
    reason_ = missed.stalled(rules.CAUSE_TEXT[rules.HOT_LOOP])
    if moved is not None:
        rt.runs.record_missed(loop.id, slot, slot, 1, reason_.kind, reason_.text, now)
    record(rt, loop, rules.HOT_LOOP, now, repaired=moved is not None,
           how=f"slot {slot_iso} refused ({reason}) {rules.HOT_REFUSALS + 1} times; recorded missed, loop moved on")
    return moved is not None


def prune(rt: Runtime, now: datetime) -> None:
    """Drop the records ``doctor`` no longer shows: repairs older than ``RECENT_REPAIR_MS``, and loops gone. (An
    unrepaired record stays until a repair of its loop replaces it.) Called as a stall is recorded: the hash
    holds at most one entry a loop, and costs a maintenance pass nothing."""
    found = records(rt.client, rt.keys)
    if not found:
        return
    ids = list(found)
    pipe = rt.client.pipeline(transaction=False)
    for loop_id in ids:
        pipe.exists(rt.keys.loop(loop_id))
    stale = [loop_id for loop_id, exists in zip(ids, pipe.execute(), strict=True)
             if not exists or (found[loop_id].repaired and not found[loop_id].is_recent(now))]
    if stale:
        rt.client.hdel(rt.keys.stalls, *stale)


def records(client: redis.Redis, keys: Keys) -> dict[str, rules.Stall]:
    """The stall records (``keys.stalls``), by loop id (unreadable ones left out): what ``doctor`` reports."""
    out: dict[str, rules.Stall] = {}
    for loop_id, text in client.hgetall(keys.stalls).items():
        stall = rules.Stall.from_json(_s(text))
        if stall is not None:
            out[_s(loop_id)] = stall
    return out


def repaired_counts(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """Loops repaired per cause since the deployment began (``loopsq_loops_repaired_total``)."""
    return {_s(k): int(_s(v)) for k, v in client.hgetall(keys.repaired_counts).items()}


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
