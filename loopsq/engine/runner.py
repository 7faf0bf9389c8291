"""Executing loop slots: fire a loop's timer (due slots, overlap, claim, execute, finalize, re-arm), run-now,
and triggered runs.

The order of one slot is: overlap policy → claim (SET NX on the slot attempt; fixed-rate and cron loops move to
their next slot in the same transition, and that slot's timer is armed at once) → execute with the lease held
→ fenced finalize that also advances the loop → re-arm. A crash anywhere leaves state that maintenance repairs:
an expired lease or dead worker is recovered, a missing timer re-armed. A fire job then fires the timer jobs
queued behind it (``fire_queue.fire_queued``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import redis

from loopsq.domain import missed, timeutil
from loopsq.domain import run_rules as rules
from loopsq.domain.lifecycle import ensure_not_archived
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import from_iso, gen_id, to_iso
from loopsq.engine import missed_slots, pool_slots, stalls, timers
from loopsq.engine.faults import crash_point
from loopsq.engine.pool_slots import PoolHold, give_back, loop_pool
from loopsq.engine.prechecks import precheck_slot
from loopsq.engine.routing import loop_queue
from loopsq.engine.run_target import run_attributes, run_target
from loopsq.engine.runtime import LEASE_LOST, Runtime
from loopsq.engine.workspaces import hold_workspace, release_workspace
from loopsq.state.feature_skips import end_skipped, skip_slot
from loopsq.state.runs import After, Claim, Refusal
from loopsq.system import tracing

log = logging.getLogger("loopsq.runs")

RETRY_DEFER = timedelta(seconds=1)


@dataclass
class FireResult:
    """What one fire did, as the reference's tick counts it."""

    claimed: int = 0
    completed: int = 0
    skipped: int = 0
    runs: list[LoopRun] = field(default_factory=list)
    #: Timer jobs taken from the queue (``fire_queued``).
    taken: int = 0

    def absorb(self, other: FireResult) -> None:
        """Add ``other``'s counts and runs to this one's."""
        self.claimed += other.claimed
        self.completed += other.completed
        self.skipped += other.skipped
        self.runs.extend(other.runs)
        self.taken += other.taken


def ensure_timer(rt: Runtime, loop: Loop | None) -> None:
    """Arm the loop's timer at its next due time (or remove it when nothing is due)."""
    if loop is None:
        return
    at = rules.timer_at(loop)
    if at is None:
        timers.disarm(rt.raw, rt.keys, loop.id)
    else:
        timers.arm(rt.raw, rt.keys, loop.id, at, queue_name=loop_queue(loop, rt.keys))


class ArmAfter:
    """Arms a loop's timer in the round trip of the transition that wrote the loop (``timers.arm_after``, guarded
    by the loop's JSON), when the timer's time is after ``not_before`` and ``wanted(loop)``.

    Passed as ``after`` to a claim or a finalize. ``outcome(replies)`` then tells what happened to the arm it
    queued: ``ARMED`` (the time), ``MOVED`` (the loop was no longer the one written: whoever moved it arms it,
    and the caller re-reads), or None (nothing queued, or no reply: the caller arms as before).
    """

    def __init__(self, rt: Runtime, not_before: datetime, wanted: Callable[[Loop], bool] | None = None) -> None:
        self.rt, self.not_before, self.wanted = rt, not_before, wanted
        self.at: datetime | None = None

    def __call__(self, pipe: redis.client.Pipeline, loop: Loop, loop_json: str) -> None:
        self.at = None
        at = rules.timer_at(loop)
        if at is None or at <= self.not_before or (self.wanted is not None and not self.wanted(loop)):
            return
        timers.arm_after(pipe, self.rt.raw, self.rt.keys, loop.id, at, loop_json, loop_queue(loop, self.rt.keys))
        self.at = at

    def outcome(self, replies: list[object]) -> datetime | str | None:
        if self.at is None or not replies:
            return None
        reply = replies[-1]  # (the arm is the last command queued)
        if isinstance(reply, Exception):
            log.warning("arming the timer of loop after its transition failed: %s", reply)
            return None
        return self.at if reply else MOVED


#: ``ArmAfter.outcome``: the loop moved on between the transition and its arm.
MOVED = "moved"


def execute_claim(rt: Runtime, claim: Claim, *, rearm: bool = True) -> LoopRun:
    """Execute a claimed run with its lease held, then finalize it (fenced) and advance its loop (see
    ``_execute``); returns the run as recorded. A pooled loop's run waits here for its pool slot."""
    return _execute(rt, claim, rearm=rearm)[0]


def _execute(rt: Runtime, claim: Claim, *, rearm: bool = True,
             pool: PoolHold | None = None) -> tuple[LoopRun, Loop | None, datetime | str | None]:
    """``_execute_held`` with the run's pool slot: the one ``fire`` took before the claim (``pool``), else one
    waited for here (a run started by hand); given back once the run is recorded."""
    if pool is None and loop_pool(claim.loop) is not None:
        taken = pool_slots.hold_for_claim(rt, claim.loop, claim.run.id)
        if isinstance(taken, str):
            log.info("run %s of loop=%s skipped: %s", claim.run.id, claim.loop.name, taken)
            ended = end_skipped(rt.runs, claim.run.id, claim.token, timeutil.now(), error=taken, note=POOL_NOTE)
            return (ended[0] if ended is not None else (rt.runs.get(claim.run.id) or claim.run)), None, None
        pool = taken
    try:
        return _execute_held(rt, claim, rearm=rearm)
    finally:
        give_back(rt, pool)


#: The note of a run ended ``skipped`` for its pool.
POOL_NOTE = "pool"


def _execute_held(rt: Runtime, claim: Claim, *,
                  rearm: bool = True) -> tuple[LoopRun, Loop | None, datetime | str | None]:
    """Execute a claimed run with its lease held, then finalize it (fenced) and advance its loop. Returns the
    run as recorded, the loop as the finalize wrote it (None: unchanged or not written) and what became of the
    arm in the finalize's round trip (``ArmAfter.outcome``: the time armed, ``MOVED``, or None).

    The finalize arms the loop's timer in its own round trip (``ArmAfter``) when the next due time is ahead. With
    ``rearm`` the timer is otherwise armed once the run is recorded. ``fire`` passes False and arms once its due
    slots are done: re-arming between the slots of a catch-up backlog would arm a timer in the past, which fires
    at once on another worker and skips the rest of the backlog as overlapping.
    """
    run, loop = claim.run, claim.loop
    log.info("run %s claimed loop=%s slot=%s attempt=%d%s source=%s", run.id, loop.name, run.scheduled_for,
             run.attempt, f" rerun={run.rerun} (re-run after shutdown)" if run.rerun else "", run.source)
    held = rt.hold(run.id, claim.token, loop.lease_ms)
    crash_point("after_claim")
    blocked = hold_workspace(rt, claim, held)  # None: no workspace, or its lease is ours
    if blocked is not None:
        rt.release(run.id)
        return blocked, None, None  # (nothing armed)
    # The run's JSON as the claim wrote it: the finalize tries it first instead of reading it back. (The beat's
    # lease renewal or start record may change it meanwhile; a stale guess only costs a retry.)
    known_run = run.to_json()
    try:
        with tracing.span("loopsq.execute", attributes=run_attributes(run)) as traced:
            status, exit_code, stdout, stderr, error, pid, duration, control = run_target(rt, claim, held, traced)
        if held.reason == LEASE_LOST:
            log.warning("run %s lease lost; its outcome is not recorded", run.id)
            current = rt.runs.get(run.id)
            return current or run, None, None
        # The lease is still renewed while this waits for Redis (the run is released only below).
        ended_at = timeutil.now()
        started = held.started
        arm = ArmAfter(rt, ended_at)
        replies: list[object] = []
        with tracing.span("loopsq.finalize", attributes={**run_attributes(run), "loopsq.status": status}) as fin:
            finished = rt.runs.finalize(
                run.id, claim.token, ended_at, status=status, exit_code=exit_code, duration_ms=duration,
                stdout=stdout, stderr=stderr, error=error,
                pid=pid if pid is not None or started is None else started.pid,
                pid_start_time=started.start_time if started is not None else None,
                known=(known_run, loop.to_json()), fields=control, after=arm, replies=replies,
            ) or rt.runs.recorded_end(run.id, attempt=run.attempt, worker_id=rt.owner.worker_id, status=status,
                                      finished_at=ended_at)
            fin.set("loopsq.fenced", finished is None)
    finally:
        rt.release(run.id)
        release_workspace(rt, claim)
    if finished is None:
        log.warning("run %s lease lost before finalize; nothing written", run.id)
        return rt.runs.get(run.id) or run, None, None
    final, new_loop = finished
    crash_point("after_finalize")
    log.info("run %s %s loop=%s slot=%s attempt=%d%s", final.id, final.status, loop.name, final.scheduled_for,
             final.attempt, f" error={final.error}" if final.error and final.status != "succeeded" else "")
    armed = arm.outcome(replies)
    if rearm and armed == MOVED:
        ensure_timer(rt, rt.loops.get(loop.id))
    elif new_loop is not None and rearm and armed is None:
        ensure_timer(rt, new_loop)
    return final, new_loop, armed


def fire(rt: Runtime, loop_id: str, *, taken: timers.Taken | None = None) -> FireResult:
    """A loop's timer fired: run its due slots in order, then re-arm (``_fire``), in a ``loopsq.fire`` span."""
    with tracing.span("loopsq.fire", attributes={"loopsq.loop.id": loop_id}) as traced:
        out = _fire(rt, loop_id, taken=taken)
        traced.set("loopsq.claimed", out.claimed)
        traced.set("loopsq.skipped", out.skipped)
        return out


def _fire(rt: Runtime, loop_id: str, *, taken: timers.Taken | None = None) -> FireResult:
    """A loop's timer fired: run its due slots in order, then re-arm.

    Like the reference's tick, slots run one after another, and a failure that will be retried stops the rest
    (the retry runs first). Unlike it, a due slot whose row is already settled moves the loop past it, so a
    loop is never left due forever. Slots that catch-up gives up are recorded ``missed``, with why
    (``engine.missed_slots``; ``taken``: the timer job that fired, when a worker took one).
    """
    out = FireResult()
    loop_raw, active = _read_loop(rt, loop_id)
    if loop_raw is None:
        timers.disarm(rt.raw, rt.keys, loop_id)
        return out
    loop = Loop.from_json(loop_raw)
    # The loop as this fire last wrote it. Used to re-arm without reading it back when nothing but our own
    # claim and finalize touched it; a stale guess would only cost a timer that fires, finds nothing due and
    # re-arms from a fresh read.
    known: Loop | None = loop
    reread = False
    # The time this fire armed the loop's timer at, while the loop it last wrote still wants exactly that: then the
    # re-arm at the end has nothing to do. (Whoever else changed the loop meanwhile made finalize see it.)
    armed_at: datetime | None = None
    fired_at = timeutil.now()
    slots = rules.due(loop, fired_at)
    cut = rules.backlog_cut(loop, slots, fired_at)
    # The slots catch-up gives up: recorded missed once this fire has moved the loop past them.
    dropped = missed.dropped(loop, fired_at) if slots else None

    def settle_dropped(at: datetime) -> None:
        """Record the dropped streak, once the loop has moved on (after this fire's first transition)."""
        nonlocal dropped
        if dropped is not None:
            missed_slots.record(rt, loop, dropped, missed_slots.reason(loop, taken, fired_at, rt.started_at), at)
            dropped = None

    for index, slot in enumerate(slots):
        # The first slot is decided on the time the due slots were judged on: a claim or skip moves the loop to the
        # first slot after its time, and a slot that fell due in between (after ``fired_at``, not in ``slots``) was
        # passed over with no record at all. Decided at ``fired_at`` it stays due, for the timer armed at it.
        now = fired_at if index == 0 else timeutil.now()
        current: Loop | None = loop
        if index > 0:
            loop_raw, active = _read_loop(rt, loop_id)
            current = Loop.from_json(loop_raw) if loop_raw is not None else None
        if current is None or current.status != "active":
            reread = True
            break
        slot_iso = to_iso(slot)
        is_retry = current.retry_scheduled_for == slot_iso
        if active and current.overlap == "skip":
            reread = True
            if is_retry:
                rt.runs.defer_retry(loop_id, now + RETRY_DEFER, now)
                break
            skipped = rt.runs.skip(loop_id, slot, now, ends_backlog=slot == cut)
            settle_dropped(now)
            log.info("slot %s of loop=%s skipped: %s", slot_iso, current.name, rules.SKIP_ERROR)
            out.skipped += 1
            if skipped is not None:
                out.runs.append(skipped)
            continue
        gated = current.gate is not None or current.workspace is not None
        if gated:
            stopped, row = precheck_slot(rt, current, slot, now, is_retry=is_retry, ends_backlog=slot == cut)
            if stopped:
                reread = True
                settle_dropped(now)
                out.skipped += 1 if row is not None else 0
                out.runs.extend([row] if row is not None else [])
                continue
        pool_hold: PoolHold | None = None
        if loop_pool(current) is not None:
            took = pool_slots.take_for_slot(rt, current, slot, now, running=bool(active))
            if took is None:  # the pool is gone: never run uncapped; the slot is recorded with the reason
                reread = True
                row = skip_slot(rt.runs, loop_id, slot, now, error=pool_slots.missing_error(str(loop_pool(current))),
                                note=POOL_NOTE, ends_backlog=slot == cut)
                settle_dropped(now)
                out.skipped += 1
                out.runs.extend([row] if row is not None else [])
                continue
            if not isinstance(took, PoolHold):
                return out  # waits for its pool: its timer is armed for a recheck (a release wakes it sooner)
            pool_hold = took
        if active and current.overlap == "replace":
            for run_id in active:
                rt.runs.request_cancel(run_id, f"{rules.REPLACED_ERROR}{slot_iso}")
        # The next slot of a loop that moves at its claim (fixed rate, cron) is armed in the claim's round trip.
        arm_next = ArmAfter(rt, now, lambda moved: not rules.advances_at_finish(moved))
        # A scheduled slot reached for the first time has no run yet: the claim goes straight to its transition
        # with the loop read just now (its guards check both; a retry slot has its row, and a precheck may have
        # written the loop).
        try:
            claim = claim_slot(rt, loop_id, slot, now, source="scheduled", ends_backlog=slot == cut,
                               known_loop=None if gated or is_retry else loop_raw, fresh_slot=not is_retry,
                               after=arm_next)
        except BaseException:
            give_back(rt, pool_hold)
            raise
        if isinstance(claim, Refusal):
            give_back(rt, pool_hold)
            reread = True
            if claim.reason in ("done", "exhausted"):
                rt.runs.advance_past(loop_id, slot, now)
                settle_dropped(now)
            elif stalls.refused(rt, current, slot, claim.reason, now):  # a hot loop: moved past the slot
                settle_dropped(now)
            continue
        out.claimed += 1
        settle_dropped(now)
        armed_at = None
        claim_arm = arm_next.outcome(claim.after)
        if claim_arm == MOVED:
            reread = True
        elif isinstance(claim_arm, datetime):
            armed_at = claim_arm
        else:
            next_at = rules.timer_at(claim.loop)
            if next_at is not None and next_at > now and not rules.advances_at_finish(claim.loop):
                ensure_timer(rt, claim.loop)  # the next slot keeps its time while this run goes on
                armed_at = next_at
        # (armed below, once every due slot ran)
        final, written, finalize_arm = _execute(rt, claim, rearm=False, pool=pool_hold)
        known = written or claim.loop
        if finalize_arm == MOVED:
            reread = True  # the loop is no longer the one the finalize wrote
        elif written is None:
            armed_at = None
        elif isinstance(finalize_arm, datetime):
            armed_at = finalize_arm
        out.completed += 1
        out.runs.append(final)
        if final.status in rules.RETRYABLE and final.attempt < claim.loop.max_attempts:
            break
    if reread or known is None:
        ensure_timer(rt, rt.loops.get(loop_id))
    elif armed_at is None or rules.timer_at(known) != armed_at:
        ensure_timer(rt, known)
    return out


def _read_loop(rt: Runtime, loop_id: str) -> tuple[str | None, list[str]]:
    """The loop's JSON (None: gone) and the ids of its running runs, in one round trip."""
    pipe = rt.client.pipeline(transaction=False)
    pipe.get(rt.keys.loop(loop_id))
    pipe.smembers(rt.keys.loop_active(loop_id))
    raw, active = pipe.execute()
    text = raw.decode() if isinstance(raw, bytes) else raw
    return text, sorted(str(i.decode() if isinstance(i, bytes) else i) for i in active)


def claim_slot(rt: Runtime, loop_id: str, slot: datetime, now: datetime, *, source: str,
               run_id: str | None = None, idempotency_key: str | None = None,
               ends_backlog: bool = False, trigger_request: str | None = None, retry: bool = True,
               known_loop: str | None = None, fresh_slot: bool = False,
               after: After | None = None) -> Claim | Refusal:
    """``RunStore.claim`` for this runtime, which also recognizes its own claim when the reply was lost: a claim
    resent after Redis applied it is refused by its own guard (``claimed``/``running``), and is ours after all.
    ``retry=False``: the run is not retried (``--no-retry``). ``known_loop``, ``fresh_slot``, ``after``: see
    ``RunStore.claim``."""
    nonce = gen_id()
    with tracing.span("loopsq.claim", attributes={"loopsq.loop.id": loop_id, "loopsq.slot": to_iso(slot),
                                                  "loopsq.source": source}) as traced:
        result = rt.runs.claim(loop_id, slot, rt.owner, now, source=source, run_id=run_id,
                               idempotency_key=idempotency_key, nonce=nonce, ends_backlog=ends_backlog,
                               trigger_request=trigger_request, retry=retry, known_loop=known_loop,
                               fresh_slot=fresh_slot, after=after)
        if isinstance(result, Refusal) and result.reason in ("claimed", "running"):
            result = rt.runs.won_claim(loop_id, slot, nonce) or result
        if isinstance(result, Claim):
            traced.set("loopsq.run.id", result.run.id)
            traced.set("loopsq.attempt", result.run.attempt)
        else:
            traced.set("loopsq.refused", result.reason)
        return result


def _claim_ad_hoc(rt: Runtime, loop: Loop, slot: datetime, source: str, run_id: str | None,
                  key: str | None, request: str | None = None, retry: bool = True) -> Claim | Refusal:
    """Claim an ad-hoc slot at ``slot``; a slot taken by another run at the same millisecond moves 1 ms on (also
    when that run won it while this claim was being made). ``claimed`` is final only for this very run (it exists
    already, or its trigger was consumed). ``request``: the trigger request the claim consumes (a triggered run)."""
    result: Claim | Refusal = Refusal("gone")
    for _ in range(50):
        result = claim_slot(rt, loop.id, slot, timeutil.now(), source=source, run_id=run_id, idempotency_key=key,
                            trigger_request=request, retry=retry)
        if isinstance(result, Claim) or result.reason == "gone":
            return result
        if result.reason == "claimed" and (result.run is None or result.run.id == run_id or (
                run_id is not None and rt.runs.get(run_id) is not None)):
            return result  # this very run is taken: its request executed twice, or its trigger was consumed
        slot = slot + timedelta(milliseconds=1)
    return result


def run_now(rt: Runtime, id_or_name: str, run_id: str | None = None,
            on_claim: Callable[[LoopRun], None] | None = None, *, retry: bool = True,
            trace: Mapping[str, str] | None = None) -> LoopRun:
    """Run a loop now (reference 0.3.3 sources): its due retry, its due slot, or an ad-hoc slot.

    ``run_id`` names a new run (a retry keeps its row's id); ``on_claim`` learns the claimed run before it
    executes (a worker publishes its id to the waiting CLI there). The loop's retry policy applies to the run
    (``run_rules.after_finish``) unless ``retry`` is False. ``trace``: the W3C context of the request, the parent
    of the ``loopsq.run_now`` span (``loopsq.system.tracing``).

    Raises:
        NotFoundError: for an unknown loop.
        ConflictError: when the run could not be claimed.
    """
    with tracing.span("loopsq.run_now", parent=trace, attributes={"loopsq.loop": id_or_name}):
        return _run_now(rt, id_or_name, run_id, on_claim, retry=retry)


def _run_now(rt: Runtime, id_or_name: str, run_id: str | None, on_claim: Callable[[LoopRun], None] | None, *,
             retry: bool) -> LoopRun:
    from loopsq.errors import ConflictError

    loop = rt.loops.require(id_or_name)
    ensure_not_archived(loop, id_or_name)
    now = timeutil.now()
    slot, source = rules.manual_slot(loop, now)
    claim: Claim | Refusal
    if source != "ad_hoc":
        claim = claim_slot(rt, loop.id, slot, now, source=source, run_id=run_id, retry=retry)
        if isinstance(claim, Refusal) and claim.reason in ("done", "exhausted", "past"):
            if claim.reason != "past":  # (a past slot: the loop has moved on already)
                rt.runs.advance_past(loop.id, slot, now)
            source = "ad_hoc"
        elif isinstance(claim, Refusal) and claim.reason == "inactive":
            source = "ad_hoc"  # paused meanwhile: run-now of a loop that is not active is an ad-hoc run
    if source == "ad_hoc":
        claim = _claim_ad_hoc(rt, loop, now, "ad_hoc", run_id, None, retry=retry)
    if isinstance(claim, Refusal):
        raise ConflictError(f"could not claim manual run for {id_or_name} ({claim.reason})")
    if source != "ad_hoc":
        ensure_timer(rt, claim.loop)
    if on_claim is not None:
        on_claim(claim.run)
    return execute_claim(rt, claim)


def run_triggered(rt: Runtime, run_id: str) -> LoopRun | None:
    """Execute a triggered run (``LoopsClient.trigger``) under the run id the trigger reserved."""
    request = rt.client.get(rt.keys.trigger(run_id))
    if request is None:  # consumed by its claim (a duplicate job), or expired
        rt.client.zrem(rt.keys.triggers, run_id)
        return rt.runs.get(run_id)
    import json

    text = request.decode() if isinstance(request, bytes) else str(request)
    data = json.loads(text)
    loop = rt.loops.get(str(data["loopId"]))
    if loop is None:
        rt.client.zrem(rt.keys.triggers, run_id)
        return None
    # The claim consumes the trigger (its request key and its entry in ``keys.triggers``) in one transition. The
    # trigger's W3C context, when it carried one, is the parent of the run's spans.
    with tracing.span("loopsq.trigger", parent=tracing.valid_carrier(data),
                      attributes={"loopsq.loop.id": loop.id, "loopsq.run.id": run_id}):
        claim = _claim_ad_hoc(rt, loop, from_iso(str(data["at"])), "trigger", run_id, data.get("key"), text,
                              retry=data.get("retry", True) is not False)
        if isinstance(claim, Refusal):
            return rt.runs.get(run_id)
        return execute_claim(rt, claim)
