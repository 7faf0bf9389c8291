"""Result-driven cadence: how a run's control file (``domain.control``) moves its loop once the run has ended.

Applied by the run's finalize on top of ``run_rules.after_finish``, in the same transition, so the run's
outcome and the loop's new state are one step and one change entry. The rules, in order:

- nothing moves a loop that is no longer active (a pause or stop during the run wins), nor does a backfill run
  (it replays the past: ``engine.backfill``);
- ``outcome: needs_human`` pauses the loop, its reason ``needs_human: <note>``;
- ``stop: true`` or ``outcome: done`` stops it (``stopped by run <id> (done): <note>``);
- ``nextIn`` on a steerable loop moves its next slot to the end of the run plus ``nextIn``, clamped to the
  loop's ``minIntervalMs``/``maxIntervalMs``, unless a retry of the slot is pending (the retry runs first) or
  the run was a manual one (which never moves the loop).

No I/O; the time is passed in.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from loopsq.domain import limits
from loopsq.domain.lifecycle import stop
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import MANUAL_SOURCES, Advance, LoopRun
from loopsq.domain.timeutil import to_iso

#: The change-stream name of the loop transition a control file made (noted inside the run's own transition).
PAUSED = "paused_by_outcome"
STOPPED = "loop_stopped"
STEERED = "loop_steered"


def bounds_ms(loop: Loop) -> tuple[int, int]:
    """The interval a steerable loop's ``nextIn`` is clamped to: ``minIntervalMs`` (at least 1 s) to
    ``maxIntervalMs`` (100 years when unset)."""
    low = loop.min_interval_ms or limits.MIN_EVERY_MS
    high = loop.max_interval_ms or limits.MAX_MS
    return low, max(low, high)


def clamp_next_in(loop: Loop, next_in_ms: int) -> int:
    """``next_in_ms`` within the loop's bounds (``bounds_ms``)."""
    low, high = bounds_ms(loop)
    return min(high, max(low, next_in_ms))


def steer(advance: Advance, run: LoopRun, finished_at: datetime) -> Advance:
    """The loop after ``advance`` (``after_finish``'s result for ``run``) once ``run``'s control is applied."""
    control = run.control
    loop = advance.loop
    if not control or loop.status != "active" or run.status == "abandoned" or run.source == "backfill":
        return advance
    stamp = to_iso(finished_at)
    note = control.get("note")
    suffix = f": {note}" if note else ""
    if control.get("outcome") == "needs_human":
        reason = f"needs_human{suffix}" if note else f"needs_human (run {run.id})"
        return Advance(loop.with_changes(status="paused", status_reason=reason, updated_at=stamp), PAUSED)
    if control.get("stop") or control.get("outcome") == "done":
        what = "stop" if control.get("stop") else "done"
        stopped = stop(loop, finished_at).with_changes(status_reason=f"stopped by run {run.id} ({what}){suffix}")
        return Advance(stopped, STOPPED)
    next_in = control.get("nextInMs")
    if (not next_in or not loop.steerable or advance.transition == "retry_scheduled"
            or run.source in MANUAL_SOURCES):
        return advance
    at = finished_at + timedelta(milliseconds=clamp_next_in(loop, int(next_in)))
    transition = STEERED if advance.transition in ("none", "loop_advanced") else advance.transition
    return Advance(loop.with_changes(next_run_at=to_iso(at), updated_at=stamp), transition)
