"""Maintenance, about once a second on the leading scheduler: expire loops, repair loops and timers, recover
runs whose owner is gone, re-enqueue lost triggers, trim history windows and the change stream.

Nothing here trusts a single write to have happened: a crash between a run's finalize and the re-arm of its
loop's timer, a lost RQ job, a worker killed mid-run — each leaves a state this pass notices and mends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from loopsq.domain import run_rules as rules
from loopsq.domain import stalls as stall_rules
from loopsq.domain import timeutil
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.schedules import initial_next_run
from loopsq.domain.timeutil import from_iso, to_iso, to_ms
from loopsq.engine import stalls, timers
from loopsq.engine.faults import crash_point
from loopsq.engine.recovery import live_worker_hosts, recover_runs, recover_workflow_runs, recovery_paused
from loopsq.engine.routing import enqueue_for_loop, loop_queue
from loopsq.engine.runtime import Runtime
from loopsq.state.commit import Tx
from loopsq.state.loop_watch import armed_score_ms
from loopsq.state.retention import Retention, TrimReport, Windows
from loopsq.state.stream_trim import trim_stream
from loopsq.system import limits

log = logging.getLogger("loopsq.maintenance")

TRIGGER_GRACE_MS = 30_000


@dataclass
class Report:
    """What one maintenance pass did."""

    expired: int = 0
    repaired: int = 0
    armed: int = 0
    disarmed: int = 0
    recovered: list[LoopRun] = field(default_factory=list)
    retriggered: int = 0
    #: Workflow runs of their own (no parent loop run) failed because their worker died.
    workflows_failed: int = 0
    #: Recovery waited: Redis was away moments ago (``recovery.recovery_paused``).
    recovery_paused: bool = False
    #: Stalled loops repaired (``engine.stalls``: a fire job in no queue).
    stalls_repaired: int = 0
    #: What left Redis's history windows in this pass.
    trimmed: TrimReport = field(default_factory=TrimReport)


def _update_loop(rt: Runtime, loop: Loop, new: Loop, change_type: str, now: datetime) -> bool:
    raw = loop.to_json()
    tx = (
        Tx(change_type, to_iso(now))
        .expect(rt.keys.loop(loop.id), raw)
        .set(rt.keys.loop(loop.id), new.to_json())
        .put("loops", new.to_dict())
    )
    return rt.committer.commit(tx).ok


def _wanted(loop: Loop, now: datetime, active_loops: set[str]) -> tuple[Loop | None, str]:
    """A loop that needs a state repair, and the change type; (None, "") when it is fine."""
    if loop.status != "active":
        return None, ""
    if loop.expires_at is not None and from_iso(loop.expires_at) <= now:
        return loop.with_changes(status="expired", next_run_at=None, retry_scheduled_for=None, retry_at=None, retry_queue=None,
                                 updated_at=to_iso(now)), "loop_expired"
    if rules.timer_at(loop) is None and loop.id not in active_loops:
        # Nothing will ever wake this loop (e.g. its last run's owner died before the loop was advanced).
        nxt = initial_next_run(loop.schedule, now, loop.timezone) if loop.schedule.type != "once" else None
        if nxt is None:
            return loop.with_changes(status="stopped", updated_at=to_iso(now)), "loop_repaired"
        return loop.with_changes(next_run_at=to_iso(nxt), updated_at=to_iso(now)), "loop_repaired"
    return None, ""


#: Loops looked at per pass at most from each index (a backlog is worked through over several passes).
WATCH_BATCH = 1_000
#: The full reconciliation: loops per pass (an SSCAN over every loop), and how long between two rounds.
RECONCILE_BATCH = 200
RECONCILE_EVERY_MS = 5 * 60_000
#: A watched loop found fine but still in flight (its timer's job queued or running, its run going on) is looked
#: at again after this long.
RECHECK_MS = 5_000


def maintain(rt: Runtime, now: datetime | None = None, *, full: bool = False, reindex: bool = True) -> Report:
    """One maintenance pass.

    Loops are looked at only where an index says something may be wrong (``state.loop_watch``: a timer whose
    time passed a grace ago without a claim, a write not followed by its arm, an ``expiresAt`` due), plus a
    bounded batch of the rare full reconciliation; an idle pass costs the same few commands however many loops
    are defined. ``full``: look at every loop now (``loopsq tick``); with ``reindex=False`` as well, that is the
    pass of every second before the indexes (the baseline of ``bench/maintenance_pass.py``).
    """
    now = now or timeutil.now()
    report = Report()
    report.recovery_paused = recovery_paused(rt)
    if not report.recovery_paused:
        live_hosts = live_worker_hosts(rt, now)
        report.recovered = recover_runs(rt, now, live_hosts)
        report.workflows_failed = recover_workflow_runs(rt, now, live_hosts=live_hosts)
    if full:
        check_loops(rt, rt.loops.ids(), now, report, reindex=reindex)
    else:
        check_loops(rt, _watched(rt, now) + _reconcile_batch(rt, now), now, report)
    report.retriggered = retrigger(rt, now)
    report.trimmed = trim_history(rt, now)
    return report


def _watched(rt: Runtime, now: datetime) -> list[str]:
    """Loops an index says are due for a look: watch score or ``expiresAt`` passed."""
    pipe = rt.client.pipeline(transaction=False)
    pipe.zrangebyscore(rt.keys.loop_watch, "-inf", to_ms(now), start=0, num=WATCH_BATCH)
    pipe.zrangebyscore(rt.keys.loop_expiry, "-inf", to_ms(now), start=0, num=WATCH_BATCH)
    watch, expiry = pipe.execute()
    return [str(i) for i in dict.fromkeys([*watch, *expiry])]


def _reconcile_batch(rt: Runtime, now: datetime) -> list[str]:
    """The next batch of the full reconciliation (every loop, ``RECONCILE_BATCH`` a pass, a round every
    ``RECONCILE_EVERY_MS``; the first round starts at once, which also seeds the indexes of a deployment that had
    none). Its state is in Redis, so a new leader goes on where the last one was."""
    state = rt.client.hgetall(rt.keys.reconcile)
    if int(state.get("nextAt") or 0) > to_ms(now):
        return []
    cursor, ids = rt.client.sscan(rt.keys.loops, int(state.get("cursor") or 0), count=RECONCILE_BATCH)
    if int(cursor) == 0:
        rt.client.hset(rt.keys.reconcile, mapping={"cursor": 0, "nextAt": to_ms(now) + RECONCILE_EVERY_MS})
    else:
        rt.client.hset(rt.keys.reconcile, mapping={"cursor": int(cursor), "nextAt": 0})
    return [str(i) for i in ids]


def check_loops(rt: Runtime, loop_ids: list[str], now: datetime, report: Report, *, reindex: bool = True) -> None:
    """Expire, repair and re-arm what is wrong with these loops, and set their index entries from what was found.

    ``reindex=False``: leave the indexes alone (the pre-index full pass, the baseline of
    ``bench/maintenance_pass.py``).
    """
    if not loop_ids:
        return
    ids = list(dict.fromkeys(loop_ids))
    loops = rt.loops.get_many(ids)
    pipe = rt.client.pipeline(transaction=False)
    for loop in loops:
        pipe.exists(rt.keys.loop_active(loop.id))
    active_loops = {loop.id for loop, busy in zip(loops, pipe.execute(), strict=True) if busy}
    current: list[Loop] = []
    for loop in loops:
        new, change = _wanted(loop, now, active_loops)
        if new is not None and _update_loop(rt, loop, new, change, now):
            if change == "loop_expired":
                report.expired += 1
            else:
                report.repaired += 1
            loop = new
        current.append(loop)
    states = timers.armed_state(rt.raw, rt.keys, [loop.id for loop in current])
    index = rt.client.pipeline(transaction=False)
    found = {loop.id for loop in current}
    for loop_id in ids:
        if loop_id not in found:  # removed meanwhile
            index.zrem(rt.keys.loop_watch, loop_id)
            index.zrem(rt.keys.loop_expiry, loop_id)
    now_ms = to_ms(now)
    for loop in current:
        want = rules.timer_at(loop)
        score, status = states[loop.id]
        if loop.status != "active":
            index.zrem(rt.keys.loop_watch, loop.id)
            index.zrem(rt.keys.loop_expiry, loop.id)
        elif loop.expires_at is not None:
            index.zadd(rt.keys.loop_expiry, {loop.id: to_ms(from_iso(loop.expires_at))})
        if want is None:
            if score is not None:
                timers.disarm(rt.raw, rt.keys, loop.id)
                report.disarmed += 1
            if loop.status == "active":  # waits for its running run: look again later
                index.zadd(rt.keys.loop_watch, {loop.id: now_ms + RECHECK_MS})
            continue
        in_flight = score is None and status in ("queued", "started", "deferred", "scheduled")
        on_time = score is not None and abs(score * 1000 - to_ms(want)) < 1
        # (``started`` here is by a live worker: a dead one's job is ``orphaned``, not in flight, and re-armed below)
        if in_flight and status in ("queued", "started") and loop.id not in active_loops and stall_rules.overdue(
                loop, want, now, stall_rules.grace_min_ms()) and stalls.repair_lost_fire(rt, loop, want, now):
            report.stalls_repaired += 1  # (its arm moved its watch entry)
        elif in_flight:
            index.zadd(rt.keys.loop_watch, {loop.id: now_ms + RECHECK_MS})
        elif on_time:
            index.zadd(rt.keys.loop_watch, {loop.id: max(armed_score_ms(to_ms(want), now_ms), now_ms + RECHECK_MS)})
        else:
            # (moves its watch entry past the new timer's time)
            timers.arm(rt.raw, rt.keys, loop.id, want, queue_name=loop_queue(loop, rt.keys))
            report.armed += 1
    if reindex and len(index):
        index.execute()


def trim_history(rt: Runtime, now: datetime) -> TrimReport:
    """Trim what fell out of the history windows (a bounded batch), then the change stream behind its mirrors."""
    windows = Windows(limits.keep_runs(), limits.keep_workflow_runs())
    retention = Retention(rt.client, rt.keys, rt.committer)
    retention.seed(now)  # once: what was written before history windows
    report = retention.trim_due(now, windows, after_trim=lambda: crash_point("mid_trim"))
    trim_stream(rt.client, rt.keys, limits.mirror_idle_ms())
    return report


def retrigger(rt: Runtime, now: datetime) -> int:
    """Re-enqueue triggers whose job was lost (reserved more than 30 s ago, still unclaimed)."""
    stale = rt.client.zrangebyscore(rt.keys.triggers, 0, to_ms(now) - TRIGGER_GRACE_MS)
    count = 0
    for raw_id in stale:
        run_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        if rt.client.exists(rt.keys.run(run_id)) or not rt.client.exists(rt.keys.trigger(run_id)):
            # Claimed (its claim consumed the request), or its request expired: nothing is left to run.
            rt.client.zrem(rt.keys.triggers, run_id)
            continue
        loop_id = _trigger_loop(rt, run_id)
        enqueue_for_loop(rt.client, rt.keys, loop_id or "", "worker.jobs.run_triggered", run_id,
                         result_ttl=timers.NO_RESULT_TTL)
        rt.client.zadd(rt.keys.triggers, {run_id: to_ms(now)})
        count += 1
    return count


def _trigger_loop(rt: Runtime, run_id: str) -> str | None:
    """The loop a pending trigger is for (its request's ``loopId``), None when unreadable."""
    import json

    raw = rt.client.get(rt.keys.trigger(run_id))
    try:
        return str(json.loads(raw)["loopId"]) if raw else None
    except (ValueError, KeyError, TypeError):
        return None
