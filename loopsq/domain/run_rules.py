"""Loop runs and the pure scheduling decisions around them: what is due, how a claim or a finished run moves
the loop, retry delays. No I/O; the time is passed in.

loopsq keeps the reference's one-row-per-slot model (``UNIQUE(loop_id, scheduled_for)``; a retry increments
``attempt`` on the same row) and adds ``retryAt``: the loop's next regular slot (``nextRunAt``) and a pending
retry of an earlier slot are kept apart, so fixed-rate and cron slots keep their times while a run is going.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any

from loopsq.domain.models import Loop
from loopsq.domain.schedules import compute_next_after, cron_next, due_slots
from loopsq.domain.timeutil import from_iso, to_iso

#: A slot that did not run, recorded with its reason; one row stands for a streak of such slots
#: (``domain.missed``). Settled, never retried.
MISSED = "missed"
RUN_STATUSES = ("running", "succeeded", "failed", "timed_out", "abandoned", "skipped", MISSED)
TERMINAL = frozenset({"succeeded", "failed", "timed_out", "abandoned", "skipped", MISSED})
RETRYABLE = frozenset({"failed", "timed_out", "abandoned"})
SOURCES = ("scheduled", "ad_hoc", "due_slot", "retry_slot", "trigger", "backfill")
#: Runs that are not a slot of the schedule: they never move the loop, though the retry rule applies to them too.
#: (A backfill run has a past slot of the schedule, run on request: ``engine.backfill``.)
MANUAL_SOURCES = ("ad_hoc", "trigger", "backfill")
#: Retries waiting behind the loop's pending one (``Loop.retry_queue``) at most; beyond it the oldest is dropped.
RETRY_QUEUE_MAX = 100
SKIP_ERROR = "previous run still active"
#: A run a worker gave up when it was stopped (SIGTERM, after the grace). Not the run's fault: it is retried at
#: once, even when its attempts are used up.
SHUTDOWN_ERROR = "worker shut down before completion"
#: The error of a run that overlap ``replace`` cancelled for a newer slot (``replaced by slot <slot>``).
REPLACED_ERROR = "replaced by slot "
#: A command or agent run of an overlap-``skip`` loop that exits 75 (``EX_TEMPFAIL``) had nothing to do now
#: (OpenLoops 0.4.39): it is recorded ``skipped`` with ``NOTHING_TO_DO_ERROR`` (``finished_status``), is never
#: retried, leaves the failure streak as it was, and the loop moves on as after a success (``after_finish``).
NOTHING_TO_DO_EXIT = 75
NOTHING_TO_DO_ERROR = "nothing to do (exit 75)"
#: The error of a run cancelled on request (``loopsq cancel``, the API, the SDK, the dashboard), with
#: ``: <reason>`` when one was given. Such a run is settled: never retried.
USER_CANCEL_ERROR = "cancelled by user"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@functools.cache
def _run_fields() -> tuple[tuple[str, str], ...]:
    """(attribute, camelCase key) of every stored field of ``LoopRun``, worked out once (a run is converted
    several times per transition)."""
    return tuple((f.name, _camel(f.name)) for f in fields(LoopRun) if f.name != "extra")


@functools.cache
def _run_names() -> dict[str, str]:
    """camelCase key -> attribute of ``LoopRun``'s stored fields."""
    return {key: attr for attr, key in _run_fields()}


@dataclass(frozen=True)
class LoopRun:
    """One execution record of a loop slot (the same row across attempts)."""

    id: str
    loop_id: str
    loop_name: str
    scheduled_for: str
    attempt: int
    status: str
    created_at: str
    updated_at: str
    started_at: str | None = None
    finished_at: str | None = None
    claimed_by: str | None = None
    lease_expires_at: str | None = None
    pid: int | None = None
    exit_code: int | None = None
    duration_ms: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    error: str | None = None
    source: str | None = None
    host: str | None = None
    pid_start_time: float | None = None
    worker_id: str | None = None
    idempotency_key: str | None = None
    #: The earlier attempts of this slot, oldest first (``attempt_history``): a retry reuses the row.
    previous_attempts: list[dict[str, Any]] | None = None
    #: How many times this attempt was re-run after a worker shutdown gave it up (None: never). A re-run is not a
    #: new attempt: it did not fail (``next_attempt``).
    rerun: int | None = None
    #: The caller asked for no retry (``--no-retry``, ``retry: false``): a failure settles the slot at once.
    no_retry: bool | None = None
    #: What the run's control file said (``domain.control``): its outcome, also on its own for filtering, and
    #: the warning when the file was malformed (then nothing of it applied).
    outcome: str | None = None
    control: dict[str, Any] | None = None
    control_warning: str | None = None
    #: The workspace lease this run held (``--workspace``) and its fencing number (``state.workspaces``).
    workspace: str | None = None
    workspace_fence: int | None = None
    #: What an agent run used, as its provider CLI reported it (``domain.usage``).
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    #: A ``missed`` row stands for a streak of slots: ``scheduled_for`` is its first, ``missed_last`` its last,
    #: ``missed_count`` how many, ``missed_kind`` why (``domain.missed.KINDS``; the text is in ``error``).
    missed_last: str | None = None
    missed_count: int | None = None
    missed_kind: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """camelCase JSON shape with absent fields dropped."""
        out: dict[str, Any] = {}
        for attr, key in _run_fields():
            value = getattr(self, attr)
            if value is not None:
                out[key] = value
        if self.extra:
            out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    def to_json(self) -> str:
        """The stored form."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoopRun:
        """From the stored camelCase shape."""
        names = _run_names()
        kwargs = {names[k]: v for k, v in data.items() if k in names}
        kwargs["extra"] = {k: v for k, v in data.items() if k not in names}
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> LoopRun:
        """Parse the stored form."""
        return cls.from_dict(json.loads(text))

    def with_changes(self, **changes: Any) -> LoopRun:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)


    @property
    def terminal(self) -> bool:
        """True once the run has ended (any status but ``running``)."""
        return self.status in TERMINAL


#: Earlier attempts kept on a run row, and the tail of each one's output (every transition rewrites the row).
ATTEMPT_HISTORY_MAX = 5
ATTEMPT_OUTPUT_TAIL = 2048


def attempt_history(ended: LoopRun) -> list[dict[str, Any]]:
    """The ``previousAttempts`` of the row's next attempt: ``ended``'s own, plus a summary of ``ended`` (status,
    error, exit code, times, worker and host, the last ``ATTEMPT_OUTPUT_TAIL`` characters of its output). Only
    the newest ``ATTEMPT_HISTORY_MAX`` are kept."""
    summary: dict[str, Any] = {
        "attempt": ended.attempt, "status": ended.status, "error": ended.error, "exitCode": ended.exit_code,
        "startedAt": ended.started_at, "finishedAt": ended.finished_at, "durationMs": ended.duration_ms,
        "workerId": ended.worker_id, "host": ended.host,
        "stdout": (ended.stdout or "")[-ATTEMPT_OUTPUT_TAIL:], "stderr": (ended.stderr or "")[-ATTEMPT_OUTPUT_TAIL:],
    }
    if ended.rerun:
        summary["rerun"] = ended.rerun
    summary = {k: v for k, v in summary.items() if v is not None and v != ""}
    return [*(ended.previous_attempts or []), summary][-ATTEMPT_HISTORY_MAX:]


def attempt_label(attempt: int, rerun: int | None) -> str:
    """``attempt 1``, or ``attempt 1 (re-run after shutdown)`` for a re-run (``attempt 1 (re-run 2 after
    shutdown)`` from the second on)."""
    if not rerun:
        return f"attempt {attempt}"
    return f"attempt {attempt} (re-run after shutdown)" if rerun == 1 else f"attempt {attempt} (re-run {rerun} after shutdown)"


def is_shutdown_rerun(ended: LoopRun) -> bool:
    """Whether ``ended`` was given up by a worker shutting down (it did not fail: it is re-run, not retried)."""
    return ended.status == "abandoned" and ended.error == SHUTDOWN_ERROR


def may_run_again(ended: LoopRun, loop: Loop) -> bool:
    """Whether a settled retryable row may be claimed again: a shutdown re-run always; a retry while attempts are
    left and the caller did not ask for no retry."""
    if is_shutdown_rerun(ended):
        return True
    return not ended.no_retry and ended.attempt < loop.max_attempts


def next_attempt(ended: LoopRun, stamp: str) -> LoopRun:
    """The row as its next claim starts it: the next attempt, or the same attempt re-run after a shutdown (counted
    in ``rerun``, claimed under its own key); ``ended`` joins ``previousAttempts``."""
    rerun = is_shutdown_rerun(ended)
    return ended.with_changes(
        attempt=ended.attempt if rerun else ended.attempt + 1, rerun=(ended.rerun or 0) + 1 if rerun else None,
        status="running", finished_at=None, pid=None, exit_code=None, duration_ms=None, stdout=None, stderr=None,
        error=None, host=None, pid_start_time=None, updated_at=stamp, previous_attempts=attempt_history(ended),
        outcome=None, control=None, control_warning=None, workspace=None, workspace_fence=None,
        input_tokens=None, output_tokens=None, cost_usd=None,
    )


def finished_status(loop: Loop, status: str, exit_code: int | None, error: str | None) -> tuple[str, str | None]:
    """The status and error a finished command or agent target's run is recorded with: as the executor reported
    them, except a failure with exit code 75 of an overlap-``skip`` loop (``NOTHING_TO_DO_EXIT``), which is
    ``skipped``: nothing to do now. (A workflow loop's run ends as its workflow does.)"""
    if (status == "failed" and exit_code == NOTHING_TO_DO_EXIT and loop.overlap == "skip"
            and loop.target_type in ("command", "agent")):
        return "skipped", NOTHING_TO_DO_ERROR
    return status, error


def is_nothing_to_do(run: LoopRun) -> bool:
    """Whether ``run`` ended ``skipped`` because its target said it had nothing to do (``finished_status``)."""
    return run.status == "skipped" and run.error == NOTHING_TO_DO_ERROR


def run_source(existing: LoopRun | None, source: str) -> str:
    """The source a claimed run records: a retry of a manual run stays manual (its slot is not the schedule's, so
    it must never move the loop); otherwise how this claim came."""
    if existing is not None and existing.source in MANUAL_SOURCES:
        return str(existing.source)
    return source


def with_retry(loop: Loop, slot: str, at: str, stamp: str) -> Loop:
    """``loop`` with a retry of ``slot`` due at ``at``: the pending one if there is none (or it is that slot), else
    queued behind it (a pending retry is never overwritten by another slot's)."""
    if loop.retry_scheduled_for is None or loop.retry_scheduled_for == slot:
        return loop.with_changes(retry_scheduled_for=slot, retry_at=at, updated_at=stamp)
    queue = [entry for entry in loop.retry_queue or [] if entry.get("slot") != slot]
    queue.append({"slot": slot, "at": at})
    return loop.with_changes(retry_queue=queue[-RETRY_QUEUE_MAX:], updated_at=stamp)


def next_retry(loop: Loop) -> Loop:
    """``loop`` once its pending retry is taken: the oldest queued retry becomes the pending one, if any."""
    queue = list(loop.retry_queue or [])
    if not queue:
        return loop.with_changes(retry_scheduled_for=None, retry_at=None, retry_queue=None)
    head, rest = queue[0], queue[1:]
    return loop.with_changes(retry_scheduled_for=head["slot"], retry_at=head["at"], retry_queue=rest or None)


def lease_renew_every_ms(lease_ms: int) -> int:
    """How often a held lease is renewed: at a third of its length (the reference's cadence), at least every 10 ms,
    at most every minute."""
    return max(10, min(60_000, lease_ms // 3))


def lease_ttl_ms(lease_ms: int) -> int:
    """The TTL the lease key gets at each claim or renewal: the lease plus one renewal period. The key was renewed
    at most a period before any moment, so it outlives any Redis outage shorter than the lease itself."""
    return lease_ms + lease_renew_every_ms(lease_ms)


def advances_at_finish(loop: Loop) -> bool:
    """Fixed-delay, dynamic and once loops compute their next slot when a run ends; the others when it starts."""
    schedule = loop.schedule
    return schedule.type in ("once", "dynamic") or (schedule.type == "interval" and schedule.anchor == "fixed_delay")


def _dt(value: str | None) -> datetime | None:
    return from_iso(value) if value else None


def due(loop: Loop, now: datetime) -> list[datetime]:
    """The slots of ``loop`` to run at ``now``, oldest first.

    A pending retry wins over everything (as the reference): only the retried slot is due, once its ``retryAt``
    has come; regular slots wait. Otherwise the reference's catch-up rules apply to ``nextRunAt``.
    """
    if loop.status != "active":
        return []
    expires_at = _dt(loop.expires_at)
    if expires_at is not None and expires_at <= now:
        return []
    if loop.retry_scheduled_for is not None:
        retry_at = _dt(loop.retry_at) or _dt(loop.retry_scheduled_for)
        return [from_iso(loop.retry_scheduled_for)] if retry_at is not None and retry_at <= now else []
    return due_slots(
        schedule=loop.schedule,
        status=loop.status,
        next_run_at=_dt(loop.next_run_at),
        expires_at=expires_at,
        retry_scheduled_for=None,
        catch_up=loop.catch_up,
        catch_up_limit=loop.catch_up_limit,
        tz=loop.timezone,
        now=now,
    )


def timer_at(loop: Loop) -> datetime | None:
    """When the loop's timer must fire next: its pending retry, else its next slot (None: nothing to arm)."""
    if loop.status != "active":
        return None
    if loop.retry_scheduled_for is not None:
        return _dt(loop.retry_at) or _dt(loop.retry_scheduled_for)
    return _dt(loop.next_run_at)


def _next_regular(loop: Loop, slot: datetime, now: datetime, *, ends_backlog: bool) -> datetime | None:
    """The regular slot after ``slot`` once it has been taken at ``now`` (fixed-rate interval and cron).

    With catch-up ``all`` the very next slot is kept even if it is already past, so a backlog is worked through
    in order (and survives a crash: the next fire picks it up) — until the slot where the limit cut the backlog
    (``ends_backlog``: see ``backlog_cut``), after which the loop moves to the first slot after ``now``, as the
    reference does. Otherwise missed slots are skipped.
    """
    schedule = loop.schedule
    if loop.catch_up == "all" and not ends_backlog:
        if schedule.type == "interval" and schedule.every_ms:
            return slot + timedelta(milliseconds=schedule.every_ms)
        if schedule.type == "cron" and schedule.expression:
            return cron_next(schedule, slot, loop.timezone)
    return compute_next_after(schedule, slot, now, loop.timezone)


def user_cancel_error(reason: str | None) -> str:
    """The error recorded on a run cancelled on request (``cancelled by user[: <reason>]``)."""
    text = (reason or "").strip()
    if not text or text == USER_CANCEL_ERROR:
        return USER_CANCEL_ERROR
    return f"{USER_CANCEL_ERROR}: {text}"


def backlog_cut(loop: Loop, slots: list[datetime], now: datetime) -> datetime | None:
    """The last of ``slots`` (from ``due``) when catch-up ``all`` cut a longer backlog at ``catchUpLimit``: once
    it is taken, the loop moves to the first slot after ``now`` (the reference runs exactly the oldest
    ``catchUpLimit`` missed slots, then skips the rest). None when nothing was cut."""
    if loop.catch_up != "all" or loop.retry_scheduled_for is not None or not slots:
        return None
    if len(slots) < max(1, loop.catch_up_limit):
        return None
    following = _next_regular(loop, slots[-1], now, ends_backlog=False)
    return slots[-1] if following is not None and following <= now else None


def after_claim(loop: Loop, slot: datetime, now: datetime, *, is_retry: bool, ends_backlog: bool = False) -> Loop:
    """The loop once ``slot`` is claimed (or skipped) at ``now``.

    A retry clears the pending retry (the run row now carries it). A regular slot moves ``nextRunAt``: to the
    following slot for fixed-rate and cron loops (so its timer can be armed while this run goes on), to nothing
    for loops that schedule from the end of a run (armed again when it ends). ``ends_backlog``: ``slot`` is the
    slot where catch-up ``all`` cut the backlog at its limit (``backlog_cut``).
    """
    stamp = to_iso(now)
    if is_retry:
        return next_retry(loop).with_changes(updated_at=stamp)
    if advances_at_finish(loop):
        return loop.with_changes(next_run_at=None, updated_at=stamp)
    upcoming = _next_regular(loop, slot, now, ends_backlog=ends_backlog)
    return loop.with_changes(next_run_at=to_iso(upcoming) if upcoming else None, updated_at=stamp)


def slot_is_past(loop: Loop, slot_iso: str) -> bool:
    """A regular slot the loop has already moved past (claimed, skipped or settled before): it is never due again.

    The loop's pending retry is never past; otherwise a slot before the loop's next slot (or any slot while a
    loop that schedules from the end of a run has none) is. A stale claimer, delayed while the slot's row ran,
    settled and left the history window, cannot run it a second time.
    """
    if loop.retry_scheduled_for == slot_iso:
        return False
    if loop.next_run_at is None:
        return True
    return from_iso(slot_iso) < from_iso(loop.next_run_at)


#: Exponential retry delays get up to this fraction of the delay added as jitter (never subtracted), so that a
#: fleet of failing loops does not retry in step while ``retryDelayMs`` stays a minimum.
RETRY_JITTER_FRACTION = 0.1


def retry_delay_ms(loop: Loop, attempt: int, rng: random.Random | None = None) -> int:
    """Delay before retrying after failed attempt ``attempt`` (1-based); never below ``retryDelayMs``.

    ``fixed``: exactly ``retryDelayMs``. ``exponential``: ``retryDelayMs * 2^(attempt-1)`` capped at
    ``retryMaxDelayMs`` (never below ``retryDelayMs``), plus a random jitter of up to ``RETRY_JITTER_FRACTION`` of
    that delay.
    """
    base = loop.retry_delay_ms
    if loop.retry_backoff != "exponential":
        return base
    delay: int = base * 2 ** max(0, attempt - 1)
    if loop.retry_max_delay_ms is not None:
        delay = max(base, min(delay, loop.retry_max_delay_ms))
    jitter: int = (rng or random.Random()).randint(0, int(delay * RETRY_JITTER_FRACTION))
    return delay + jitter


@dataclass(frozen=True)
class Advance:
    """The loop after a run ended, and which loop transition that was (for the change stream)."""

    loop: Loop
    #: "retry_scheduled" | "loop_advanced" | "loop_stopped" | "paused_by_streak" | "loop_expired" | "none"
    transition: str


def after_finish(loop: Loop, run: LoopRun, finished_at: datetime, rng: random.Random | None = None) -> Advance:
    """The loop once ``run`` has ended at ``finished_at`` (§3.9 with loopsq's fixes and additions).

    Nothing moves a loop that is no longer active (a pause or stop during the run is respected). Otherwise one
    retry rule holds for every run of the loop, scheduled, run now or triggered: a failed attempt with attempts
    left schedules a retry of the same slot, unless the caller asked for none (``noRetry``); a run a worker
    shutdown gave up is re-run at once (it did not fail: ``next_attempt``). A manual run's slot (``ad_hoc``,
    ``trigger``) is not the schedule's: once settled it moves nothing. A settled regular slot updates the failure
    streak, and a streak reaching ``pauseAfterFailures`` (the circuit breaker; 0, or None for a loop stored before
    the default breaker, is none) pauses the loop with the reason recorded (``breaker_reason``); loops
    scheduling from the end of a run get their next slot (a once loop stops). A run that overlap ``replace``
    cancelled for a newer slot is settled, not retried: its retry would in turn replace the newer run; nor is one
    cancelled on request. A run whose target had nothing to do (``skipped``, exit 75: ``finished_status``) is
    not retried, leaves the failure streak as it was and moves the loop on as a success does. A loop with
    ``expiresAfterRuns`` N counts its successful settled slots in a row (``successStreak``: a final failure starts
    it again, a nothing-to-do run leaves it) and is ``expired`` at the Nth (OpenLoops 0.5.3).
    """
    stamp = to_iso(finished_at)
    succeeded = run.status == "succeeded"
    # A target that said "nothing to do" (exit 75, ``finished_status``): neither a success nor a failure.
    nothing = run.status == "skipped"
    if loop.status != "active":
        return Advance(loop, "none")
    replaced = run.status == "failed" and (run.error or "").startswith((REPLACED_ERROR, USER_CANCEL_ERROR))
    if is_shutdown_rerun(run):
        return Advance(with_retry(loop, run.scheduled_for, stamp, stamp), "retry_scheduled")
    if not succeeded and not nothing and not replaced and not run.no_retry and run.attempt < loop.max_attempts:
        retry_at = finished_at + timedelta(milliseconds=retry_delay_ms(loop, run.attempt, rng))
        return Advance(with_retry(loop, run.scheduled_for, to_iso(retry_at), stamp), "retry_scheduled")
    if run.source in MANUAL_SOURCES:
        return Advance(loop, "none")
    # The slot is settled: it counts towards the failure streak once, however many attempts it took (and towards
    # the success streak of a loop that expires after N successful runs).
    streak = loop.failure_streak if nothing else 0 if succeeded else loop.failure_streak + 1
    loop = loop.with_changes(failure_streak=streak, updated_at=stamp)
    if loop.expires_after_runs:
        wins = loop.success_streak or 0
        loop = loop.with_changes(success_streak=wins if nothing else wins + 1 if succeeded else 0)
    failed = not succeeded and not nothing
    if failed and loop.pause_after_failures and streak >= loop.pause_after_failures:  # (0 or None: no breaker)
        return Advance(loop.with_changes(status="paused", status_reason=breaker_reason(loop, run, streak)),
                       "paused_by_streak")
    if succeeded and loop.expires_after_runs and (loop.success_streak or 0) >= loop.expires_after_runs:
        reason = (f"expired after {loop.success_streak} consecutive successful runs; resume it to start a new "
                  f"count (loopsq resume {loop.id})")
        return Advance(loop.with_changes(status="expired", status_reason=reason, next_run_at=None,
                                         retry_scheduled_for=None, retry_at=None, retry_queue=None), "loop_expired")
    slot = from_iso(run.scheduled_for)
    if advances_at_finish(loop):
        upcoming = compute_next_after(loop.schedule, slot, finished_at, loop.timezone)
        if upcoming is None:
            return Advance(loop.with_changes(status="stopped", next_run_at=None), "loop_stopped")
        return Advance(loop.with_changes(next_run_at=to_iso(upcoming)), "loop_advanced")
    # Fixed-rate and cron loops moved at claim time. Regular slots that passed while a retry held them back are
    # skipped, as the reference's advance after a retry never schedules a slot in the past.
    next_run = _dt(loop.next_run_at)
    if run.attempt > 1 and next_run is not None and next_run <= finished_at and loop.catch_up != "all":
        upcoming = compute_next_after(loop.schedule, next_run, finished_at, loop.timezone)
        loop = loop.with_changes(next_run_at=to_iso(upcoming) if upcoming else None)
    return Advance(loop, "loop_advanced")


#: How the reason of a loop the circuit breaker paused begins (OpenLoops 0.4.0's prefix).
BREAKER_PREFIX = "circuit breaker open"


def breaker_reason(loop: Loop, run: LoopRun, streak: int) -> str:
    """Why the circuit breaker paused ``loop`` after ``run`` made ``streak`` unsuccessful slots in a row, and what
    to do: ``circuit breaker open: paused after 5 consecutive unsuccessful runs (last: failed: <error>); fix the
    cause, then resume it (loopsq resume <id>)``."""
    last = f"{run.status}: {run.error}" if run.error else run.status
    return (f"{BREAKER_PREFIX}: paused after {streak} consecutive unsuccessful runs (last: {last}); fix the cause, "
            f"then resume it (loopsq resume {loop.id})")


def manual_slot(loop: Loop, now: datetime) -> tuple[datetime, str]:
    """The slot and source of a manual run-now (reference 0.3.3).

    An active loop with a due retry runs it (``retry_slot``); one with a due regular slot runs that slot
    (``due_slot``); anything else (not due, not active) is an ad-hoc run at ``now`` that never moves the loop.
    """
    if loop.status == "active":
        if loop.retry_scheduled_for is not None:
            retry_at = _dt(loop.retry_at) or from_iso(loop.retry_scheduled_for)
            if retry_at <= now:
                return from_iso(loop.retry_scheduled_for), "retry_slot"
        else:
            slots = due(loop, now)
            if slots:
                return slots[0], "due_slot"
    return now, "ad_hoc"
