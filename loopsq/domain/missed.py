"""Missed slots: which slots of a loop's schedule will not run, as streaks (first, last, count), and why.

A slot that does not run is recorded, never dropped (``ARCHITECTURE.md``, invariant 7). Catch-up is the first
cause: ``latest`` and ``none`` run one slot of a backlog and ``all`` at most ``catchUpLimit``; the loop then moves
past the rest (``run_rules.due``, ``run_rules.after_claim``). ``dropped`` names those slots as one ``Streak``
without enumerating them: an interval loop's count is arithmetic, a cron loop's is counted up to a cap. The other
reasons (no free worker, no worker with the labels, no scheduler) are the engine's to detect; their texts are here.

Only loops with a fixed grid of slots miss any: fixed-rate intervals and cron. A ``fixed_delay`` interval, a
``dynamic`` or a ``once`` loop has one pending slot at a time, measured from the end of the last run; a late
timer makes that run late, it drops nothing.

Pure: the time is a parameter, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from loopsq.domain import run_rules
from loopsq.domain.models import Loop
from loopsq.domain.schedules import cron_next, cron_prev
from loopsq.domain.timeutil import from_iso, to_ms
from loopsq.errors import ValidationError

MISSED = run_rules.MISSED

CATCH_UP = "catch_up"
NO_FREE_WORKER = "no_free_worker"
NO_WORKER_LABELS = "no_worker_labels"
NO_SCHEDULER = "no_scheduler"
#: Why slots were missed: the ``missedKind`` of a missed row and the ``reason`` label of
#: ``loopsq_slots_missed_total``.
#: Slots the progress watchdog gave up to get a stalled loop going again (``engine.stalls``).
STALLED = "stalled"
KINDS = (CATCH_UP, NO_FREE_WORKER, NO_WORKER_LABELS, NO_SCHEDULER, STALLED)

#: How many slots of a cron streak are counted one by one (~30 µs each); beyond it ``Streak.count`` says this.
CRON_COUNT_CAP = 1_000

_MS = timedelta(milliseconds=1)


@dataclass(frozen=True)
class Streak:
    """Consecutive slots of one loop's schedule that did not run."""

    #: The streak's first and last slot (both exact).
    first: datetime
    last: datetime
    #: How many slots, ``first`` and ``last`` included. Exact for an interval loop (arithmetic, however long the
    #: streak); for a cron loop counted up to ``CRON_COUNT_CAP`` and then ``CRON_COUNT_CAP``, so that a year
    #: of a minutely cron costs a bounded walk (``last`` stays exact).
    count: int


@dataclass(frozen=True)
class Reason:
    """Why slots were missed: the kind (one of ``KINDS``) and the text a missed row records as its ``error``."""

    kind: str
    text: str


def catch_up(loop: Loop) -> Reason:
    """``catch-up latest skipped it``, ``catch-up none skipped it`` or ``catch-up limit 50 cut it`` (``all``), by
    the loop's policy."""
    if loop.catch_up == "all":
        return Reason(CATCH_UP, f"catch-up limit {max(1, loop.catch_up_limit)} cut it")
    return Reason(CATCH_UP, f"catch-up {loop.catch_up} skipped it")


def no_free_worker(waited_ms: int) -> Reason:
    """``no free worker for 42s``: the slot waited that long for a worker with room and none came."""
    return Reason(NO_FREE_WORKER, f"no free worker for {_span(waited_ms)}")


def no_worker_labels(labels: Iterable[str]) -> Reason:
    """``no worker has labels gpu, repo:web``: no live worker carries every label the run requires (sorted)."""
    return Reason(NO_WORKER_LABELS, f"no worker has labels {', '.join(sorted(set(labels)))}")


def stalled(cause: str) -> Reason:
    """``stalled: <cause>``: slots given up to repair a stalled loop."""
    return Reason(STALLED, f"stalled: {cause}")


def no_scheduler() -> Reason:
    """``no scheduler ran``: no scheduler process moved the loop's timer while its slots came and went."""
    return Reason(NO_SCHEDULER, "no scheduler ran")


def check_kind(kind: str) -> str:
    """``kind`` when it is one of ``KINDS``.

    Raises:
        ValidationError: ``missed kind must be one of catch_up, ..., got 'x'``.
    """
    if kind not in KINDS:
        raise ValidationError(f"missed kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return kind


def _span(ms: int) -> str:
    """A wait in whole seconds (``42s``, ``2m30s``, ``1h5s``); under a second in milliseconds."""
    if ms < 1000:
        return f"{max(0, ms)}ms"
    seconds = ms // 1000
    parts = [(seconds // 3600, "h"), (seconds % 3600 // 60, "m"), (seconds % 60, "s")]
    return "".join(f"{value}{unit}" for value, unit in parts if value)


def label(count: int | None) -> str:
    """How a missed row is shown: ``missed``, a multiplication sign and its count (``missed \N{MULTIPLICATION SIGN}14``)."""
    return f"{MISSED} \N{MULTIPLICATION SIGN}{count or 1}"


def has_grid(loop: Loop) -> bool:
    """Whether the loop's slots lie on a fixed grid that a late timer can leave behind (fixed-rate interval,
    cron)."""
    schedule = loop.schedule
    if schedule.type == "cron":
        return True
    return schedule.type == "interval" and schedule.anchor != "fixed_delay" and bool(schedule.every_ms)


def next_slot(loop: Loop, slot: datetime) -> datetime | None:
    """The slot of the loop's grid after ``slot`` (one of its slots); None for a loop without a grid."""
    schedule = loop.schedule
    if not has_grid(loop):
        return None
    if schedule.type == "interval":
        return slot + timedelta(milliseconds=int(schedule.every_ms or 0))
    return cron_next(schedule, slot, loop.timezone)


def streak(loop: Loop, first: datetime, until: datetime) -> Streak | None:
    """The slots of the loop's grid from ``first`` (one of them) up to ``until`` inclusive; None when ``first`` is
    after ``until``. A loop without a grid has only ``first``."""
    if first > until:
        return None
    schedule = loop.schedule
    if not has_grid(loop):
        return Streak(first, first, 1)
    if schedule.type == "interval":
        every = int(schedule.every_ms or 0)
        count = (to_ms(until) - to_ms(first)) // every + 1
        return Streak(first, first + timedelta(milliseconds=(count - 1) * every), count)
    last, count = first, 1
    while count < CRON_COUNT_CAP:
        upcoming = cron_next(schedule, last, loop.timezone)
        if upcoming > until:
            return Streak(first, last, count)
        last, count = upcoming, count + 1
    final = cron_prev(schedule, until, loop.timezone)
    return Streak(first, final if final is not None and final > last else last, count)


def without_first(loop: Loop, missed: Streak) -> Streak | None:
    """``missed`` less its first slot (when a backfill runs that slot, or it already has a row); None when
    nothing is left."""
    following = next_slot(loop, missed.first)
    if missed.count <= 1 or following is None or following > missed.last:
        return None
    return Streak(following, missed.last, missed.count - 1)


def dropped(loop: Loop, now: datetime) -> Streak | None:
    """The slots that ``run_rules.due(loop, now)`` will NOT run because of catch-up, as one streak (None: none).

    ``latest``: the slots from ``nextRunAt`` up to the one it runs. ``none``: the slots after ``nextRunAt`` up to
    ``now``, which the loop moves past once ``nextRunAt`` is claimed. ``all``: the slots after the
    ``catchUpLimit``-th up to ``now``, when the limit cut the backlog (``run_rules.backlog_cut``); nothing when
    it did not. Nothing is dropped while a retry is pending (regular slots wait behind it, they are not skipped),
    by a loop that is not due, or by a loop without a grid (``has_grid``).

    Slots that come due between ``now`` and the claim that moves the loop (with ``all``, while the backlog runs)
    are not in it: ``streak(loop, next_slot(loop, slot), <the claim's now>)`` names those.
    """
    if not has_grid(loop) or loop.retry_scheduled_for is not None or loop.next_run_at is None:
        return None
    slots = run_rules.due(loop, now)
    if not slots:
        return None
    if loop.catch_up == "latest":
        start = from_iso(loop.next_run_at)
        return streak(loop, start, slots[0] - _MS) if slots[0] > start else None
    following = next_slot(loop, slots[-1])
    return streak(loop, following, now) if following is not None else None
