"""Maintenance, about once a second on the leading scheduler: expire loops, repair loops and timers, recover
runs whose owner is gone, re-enqueue lost triggers.

Nothing here trusts a single write to have happened: a crash between a run's finalize and the re-arm of its
loop's timer, a lost RQ job, a worker killed mid-run — each leaves a state this pass notices and mends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from loopsq.domain import run_rules as rules
from loopsq.domain import timeutil
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.schedules import initial_next_run
from loopsq.domain.timeutil import from_iso, to_iso, to_ms
from loopsq.engine import timers
from loopsq.engine.recovery import live_worker_hosts, recover_runs, recover_workflow_runs, recovery_paused
from loopsq.engine.runtime import Runtime
from loopsq.state.commit import Tx

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
        return loop.with_changes(status="expired", next_run_at=None, retry_scheduled_for=None, retry_at=None,
                                 updated_at=to_iso(now)), "loop_expired"
    if rules.timer_at(loop) is None and loop.id not in active_loops:
        # Nothing will ever wake this loop (e.g. its last run's owner died before the loop was advanced).
        nxt = initial_next_run(loop.schedule, now, loop.timezone) if loop.schedule.type != "once" else None
        if nxt is None:
            return loop.with_changes(status="stopped", updated_at=to_iso(now)), "loop_repaired"
        return loop.with_changes(next_run_at=to_iso(nxt), updated_at=to_iso(now)), "loop_repaired"
    return None, ""


def maintain(rt: Runtime, now: datetime | None = None) -> Report:
    """One maintenance pass."""
    now = now or timeutil.now()
    report = Report()
    report.recovery_paused = recovery_paused(rt)
    if not report.recovery_paused:
        live_hosts = live_worker_hosts(rt, now)
        report.recovered = recover_runs(rt, now, live_hosts)
        report.workflows_failed = recover_workflow_runs(rt, now, live_hosts=live_hosts)
    loops = rt.loops.all()
    running = rt.runs.get_many(rt.runs.running_ids())
    active_loops = {run.loop_id for run in running}
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
    for loop in current:
        want = rules.timer_at(loop)
        score, status = states[loop.id]
        if want is None:
            if score is not None:
                timers.disarm(rt.raw, rt.keys, loop.id)
                report.disarmed += 1
            continue
        in_flight = score is None and status in ("queued", "started", "deferred", "scheduled")
        on_time = score is not None and abs(score * 1000 - to_ms(want)) < 1
        if not (in_flight or on_time):
            timers.arm(rt.raw, rt.keys, loop.id, want)
            report.armed += 1
    report.retriggered = retrigger(rt, now)
    return report


def retrigger(rt: Runtime, now: datetime) -> int:
    """Re-enqueue triggers whose job was lost (reserved more than 30 s ago, still unclaimed)."""
    stale = rt.client.zrangebyscore(rt.keys.triggers, 0, to_ms(now) - TRIGGER_GRACE_MS)
    count = 0
    for raw_id in stale:
        run_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
        if rt.client.exists(rt.keys.run(run_id)):
            rt.client.zrem(rt.keys.triggers, run_id)
            continue
        timers.enqueue(rt.raw, "worker.jobs.run_triggered", run_id)
        rt.client.zadd(rt.keys.triggers, {run_id: to_ms(now)})
        count += 1
    return count
