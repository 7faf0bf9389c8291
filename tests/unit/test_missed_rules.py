"""Missed slots, the pure part: which slots catch-up drops (``dropped``), as one streak, and the reasons' texts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loopsq.domain import missed
from loopsq.domain import run_rules as rules
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.missed import Streak
from loopsq.domain.models import Loop
from loopsq.domain.timeutil import to_iso
from loopsq.errors import ValidationError

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = 60_000


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def make(schedule: dict[str, Any], next_run_at: datetime, catch_up: str = "latest", limit: int = 50,
         **changes: Any) -> Loop:
    body = {"name": "l", "timezone": "UTC", "schedule": schedule, "target": {"type": "command", "command": "true"},
            "catchUp": catch_up, "catchUpLimit": limit}
    return new_loop(body, T0 - timedelta(days=1)).with_changes(next_run_at=to_iso(next_run_at), **changes)


EVERY_MINUTE = {"type": "interval", "everyMs": MINUTE}
QUARTER_HOURS = {"type": "cron", "expression": "*/15 * * * *"}


# -- interval ------------------------------------------------------------------------------------------------------
def test_catch_up_latest_drops_every_slot_before_the_one_it_runs() -> None:
    loop = make(EVERY_MINUTE, at(0), "latest")
    assert rules.due(loop, at(4.5)) == [at(4)]  # the reference's example
    assert missed.dropped(loop, at(4.5)) == Streak(at(0), at(3), 4)


def test_catch_up_none_drops_the_slots_after_the_one_it_runs() -> None:
    loop = make(EVERY_MINUTE, at(0), "none")
    assert rules.due(loop, at(4.5)) == [at(0)]
    assert missed.dropped(loop, at(4.5)) == Streak(at(1), at(4), 4)


def test_catch_up_all_drops_only_what_its_limit_cuts() -> None:
    cut = make(EVERY_MINUTE, at(0), "all", limit=2)
    assert rules.due(cut, at(4.5)) == [at(0), at(1)]
    assert missed.dropped(cut, at(4.5)) == Streak(at(2), at(4), 3)
    assert missed.dropped(make(EVERY_MINUTE, at(0), "all", limit=5), at(4.5)) is None  # exactly the limit: none cut
    assert missed.dropped(make(EVERY_MINUTE, at(0), "all", limit=50), at(4.5)) is None


def test_a_slot_on_time_drops_nothing() -> None:
    for policy in ("latest", "none", "all"):
        loop = make(EVERY_MINUTE, at(0), policy)
        assert missed.dropped(loop, at(0)) is None
        assert missed.dropped(loop, at(0.99)) is None
        assert missed.dropped(loop, at(-1)) is None  # not due yet


def test_a_ten_year_outage_of_a_one_second_interval_is_counted_by_arithmetic() -> None:
    loop = make({"type": "interval", "everyMs": 1000}, T0, "latest")
    now = T0 + timedelta(days=3653, milliseconds=500)
    # 315 million slots: enumerating them would hang the test (pytest-timeout), counting them does not.
    assert missed.dropped(loop, now) == Streak(T0, now - timedelta(milliseconds=1500), 3653 * 86400)


def test_the_jitter_offset_keeps_the_grid_of_next_run_at() -> None:
    loop = make(EVERY_MINUTE, at(0) + timedelta(seconds=7), "latest")
    assert missed.dropped(loop, at(3.5)) == Streak(at(0) + timedelta(seconds=7), at(2) + timedelta(seconds=7), 3)


# -- cron ----------------------------------------------------------------------------------------------------------
def test_cron_catch_up_latest_none_and_all_drop_the_matches_they_skip() -> None:
    assert missed.dropped(make(QUARTER_HOURS, at(0), "latest"), at(70)) == Streak(at(0), at(45), 4)
    assert missed.dropped(make(QUARTER_HOURS, at(0), "none"), at(70)) == Streak(at(15), at(60), 4)
    assert missed.dropped(make(QUARTER_HOURS, at(0), "all", limit=2), at(70)) == Streak(at(30), at(60), 3)
    assert missed.dropped(make(QUARTER_HOURS, at(0), "all", limit=5), at(70)) is None


def test_a_cron_streak_is_counted_up_to_the_cap_and_its_last_slot_stays_exact() -> None:
    minutely = make({"type": "cron", "expression": "* * * * *"}, at(0), "latest")
    week = at(7 * 24 * 60 + 0.5)
    streak = missed.dropped(minutely, week)
    assert streak == Streak(at(0), at(7 * 24 * 60 - 1), missed.CRON_COUNT_CAP)


def test_a_cron_streak_keeps_the_loop_s_time_zone() -> None:
    # 09:00 in Paris is 08:00 UTC in January: the matches dropped are Paris's.
    daily = make({"type": "cron", "expression": "0 9 * * *"}, T0 + timedelta(hours=8), "none",
                 timezone="Europe/Paris")
    assert missed.dropped(daily, T0 + timedelta(days=3, hours=9)) == Streak(
        T0 + timedelta(days=1, hours=8), T0 + timedelta(days=3, hours=8), 3)


# -- what drops nothing --------------------------------------------------------------------------------------------
def test_nothing_is_dropped_while_a_retry_waits_or_the_loop_is_not_active() -> None:
    loop = make(EVERY_MINUTE, at(0), "latest")
    for policy in ("latest", "none", "all"):
        retrying = make(EVERY_MINUTE, at(0), policy, limit=1).with_changes(retry_scheduled_for=to_iso(at(-1)),
                                                                           retry_at=to_iso(at(0)))
        assert rules.due(retrying, at(4.5)) == [at(-1)]
        assert missed.dropped(retrying, at(4.5)) is None
    assert missed.dropped(loop.with_changes(status="paused"), at(4.5)) is None
    assert missed.dropped(loop.with_changes(expires_at=to_iso(at(2))), at(4.5)) is None
    assert missed.dropped(loop.with_changes(next_run_at=None), at(4.5)) is None


@pytest.mark.parametrize("schedule", [
    {"type": "interval", "everyMs": MINUTE, "anchor": "fixed_delay"},
    {"type": "dynamic", "minIntervalMs": MINUTE},
    {"type": "once", "at": "2026-01-01T00:00:00.000Z"},
], ids=["fixed_delay", "dynamic", "once"])
def test_a_loop_without_a_grid_of_slots_drops_nothing(schedule: dict[str, Any]) -> None:
    for policy in ("latest", "none", "all"):
        assert missed.dropped(make(schedule, at(0), policy, limit=1), at(100)) is None


# -- dropped and due together cover every slot --------------------------------------------------------------------
def _slots(loop: Loop, start: datetime, until: datetime) -> list[datetime]:
    found, moment = [], start
    while moment <= until:
        found.append(moment)
        following = missed.next_slot(loop, moment)
        assert following is not None
        moment = following
    return found


def _expand(loop: Loop, streak: Streak | None) -> list[datetime]:
    if streak is None:
        return []
    slots = _slots(loop, streak.first, streak.last)
    assert len(slots) == streak.count
    return slots


@pytest.mark.parametrize("schedule", [EVERY_MINUTE, {"type": "interval", "everyMs": 7 * MINUTE}, QUARTER_HOURS,
                                      {"type": "cron", "expression": "5,20 */2 * * *"}],
                         ids=["1m", "7m", "cron-15m", "cron-odd"])
@pytest.mark.parametrize("policy", ["latest", "none", "all"])
@pytest.mark.parametrize("limit", [1, 3, 50])
def test_the_slots_due_runs_and_the_streak_it_drops_are_every_slot_up_to_now_once(
        schedule: dict[str, Any], policy: str, limit: int) -> None:
    first = at(5) if schedule.get("expression", "").startswith("5,") else at(0)
    loop = make(schedule, first, policy, limit=limit)
    for minutes in (0, 1, 14, 15, 16, 59, 61, 125, 300, 721):
        now = at(minutes) + timedelta(seconds=30)
        due = rules.due(loop, now)
        dropped = _expand(loop, missed.dropped(loop, now))
        if not due:
            assert dropped == []
            continue
        assert not set(due) & set(dropped)
        if policy == "all" and rules.backlog_cut(loop, due, now) is None:
            assert dropped == []  # a backlog within the limit is run whole (over several fires): nothing dropped
        else:  # the loop moves past now: every slot up to now is run or dropped, once
            assert sorted([*due, *dropped]) == _slots(loop, first, now)


# -- streak helpers ------------------------------------------------------------------------------------------------
def test_without_first_takes_one_slot_off_the_front() -> None:
    loop = make(EVERY_MINUTE, at(0))
    assert missed.without_first(loop, Streak(at(0), at(3), 4)) == Streak(at(1), at(3), 3)
    assert missed.without_first(loop, Streak(at(3), at(3), 1)) is None
    cron = make(QUARTER_HOURS, at(0))
    assert missed.without_first(cron, Streak(at(0), at(45), 4)) == Streak(at(15), at(45), 3)


def test_a_streak_from_after_its_end_is_none() -> None:
    assert missed.streak(make(EVERY_MINUTE, at(0)), at(2), at(1)) is None


# -- reasons -------------------------------------------------------------------------------------------------------
def test_each_reason_has_its_kind_and_exact_text() -> None:
    assert missed.catch_up(make(EVERY_MINUTE, at(0), "latest")) == missed.Reason("catch_up", "catch-up latest skipped it")
    assert missed.catch_up(make(EVERY_MINUTE, at(0), "none")).text == "catch-up none skipped it"
    assert missed.catch_up(make(EVERY_MINUTE, at(0), "all", limit=50)).text == "catch-up limit 50 cut it"
    assert missed.no_free_worker(42_000) == missed.Reason("no_free_worker", "no free worker for 42s")
    assert [missed.no_free_worker(ms).text for ms in (42_999, 150_000, 3_605_000, 250)] == [
        "no free worker for 42s", "no free worker for 2m30s", "no free worker for 1h5s", "no free worker for 250ms"]
    assert missed.no_worker_labels(["gpu"]) == missed.Reason("no_worker_labels", "no worker has labels gpu")
    assert missed.no_worker_labels(["repo:web", "gpu", "gpu"]).text == "no worker has labels gpu, repo:web"
    assert missed.no_scheduler() == missed.Reason("no_scheduler", "no scheduler ran")
    assert {r.kind for r in (missed.catch_up(make(EVERY_MINUTE, at(0))), missed.no_free_worker(1),
                             missed.no_worker_labels(["a"]), missed.no_scheduler(), missed.stalled("x"))} == set(missed.KINDS)


def test_an_unknown_kind_is_refused_naming_it() -> None:
    with pytest.raises(ValidationError, match=r"^missed kind must be one of catch_up, no_free_worker, "
                                              r"no_worker_labels, no_scheduler, stalled, got 'oops'$"):
        missed.check_kind("oops")


def test_missed_is_a_settled_status_that_is_never_retried() -> None:
    assert missed.MISSED == "missed"
    assert "missed" in rules.RUN_STATUSES and "missed" in rules.TERMINAL and "missed" not in rules.RETRYABLE
