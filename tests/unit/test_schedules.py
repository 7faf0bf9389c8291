"""Tests for loopsq.domain.schedules: schedule shapes, the first run, the next slot and due slots (§3.3-§3.5)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from loopsq.domain.schedules import (
    CATCH_UP_POLICIES,
    Schedule,
    compute_next_after,
    due_slots,
    initial_next_run,
    parse_time,
)
from loopsq.domain.timeutil import from_iso, to_iso
from loopsq.errors import ValidationError

NEW_YORK = "America/New_York"
EVERY_MINUTE = Schedule(type="interval", every_ms=60_000)
HOURLY = Schedule(type="cron", expression="0 * * * *")


def t(text: str) -> datetime:
    return from_iso(text)


def isos(slots: list[datetime]) -> list[str]:
    return [to_iso(slot) for slot in slots]


def due(schedule: Schedule, next_at: str | None, now: str, **overrides: Any) -> list[str]:
    """``due_slots`` on ISO strings, with an active loop, catch-up latest and limit 50 unless overridden."""
    arguments: dict[str, Any] = {
        "schedule": schedule,
        "status": "active",
        "next_run_at": None if next_at is None else t(next_at),
        "expires_at": None,
        "retry_scheduled_for": None,
        "catch_up": "latest",
        "catch_up_limit": 50,
        "tz": "UTC",
        "now": t(now),
    }
    arguments.update(overrides)
    return isos(due_slots(**arguments))


def validation_error(value: Any) -> str:
    with pytest.raises(ValidationError) as info:
        Schedule.from_dict(value)
    return str(info.value)


# Shapes


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        (
            {"type": "once", "at": "2026-01-01T00:00:00.000Z"},
            {"type": "once", "at": "2026-01-01T00:00:00.000Z"},
        ),
        (
            {"type": "interval", "everyMs": 60000},
            {"type": "interval", "everyMs": 60000, "anchor": "fixed_rate"},
        ),
        (
            {"type": "interval", "everyMs": 5000.0, "anchor": "fixed_delay"},
            {"type": "interval", "everyMs": 5000, "anchor": "fixed_delay"},
        ),
        ({"type": "cron", "expression": " 0  9 * * * "}, {"type": "cron", "expression": "0 9 * * *"}),
        ({"type": "dynamic"}, {"type": "dynamic", "minIntervalMs": 60000}),
        ({"type": "dynamic", "minIntervalMs": 1000}, {"type": "dynamic", "minIntervalMs": 1000}),
    ],
)
def test_schedules_round_trip_through_the_reference_json_shapes(
    shape: dict[str, Any], expected: dict[str, Any]
) -> None:
    schedule = Schedule.from_dict(shape)
    assert schedule.to_dict() == expected
    assert Schedule.from_dict(schedule.to_dict()) == schedule


def test_constructing_a_schedule_fills_the_reference_defaults() -> None:
    assert EVERY_MINUTE.anchor == "fixed_rate"
    assert Schedule(type="dynamic").min_interval_ms == 60_000


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "schedule must be an object"),
        ("interval", "schedule must be an object"),
        ({}, "schedule.type must be once, interval, cron or dynamic, got None"),
        ({"type": "x"}, "schedule.type must be once, interval, cron or dynamic, got 'x'"),
        ({"type": "interval", "everyMs": 0}, "interval everyMs must be > 0, got 0"),
        ({"type": "interval", "everyMs": -5}, "interval everyMs must be > 0, got -5"),
        ({"type": "interval"}, "interval everyMs must be > 0, got None"),
        ({"type": "interval", "everyMs": "60000"}, "interval everyMs must be > 0, got '60000'"),
        ({"type": "interval", "everyMs": True}, "interval everyMs must be > 0, got True"),
        ({"type": "interval", "everyMs": float("nan")}, "interval everyMs must be > 0, got nan"),
        (
            {"type": "interval", "everyMs": 1.5},
            "interval everyMs must be a whole number of milliseconds, got 1.5",
        ),
        (
            {"type": "interval", "everyMs": 10**20},
            f"interval everyMs must be at most 3153600000000 (100 years), got {10**20}",
        ),
        (
            {"type": "interval", "everyMs": 1000, "anchor": "x"},
            "schedule.anchor must be fixed_rate or fixed_delay, got 'x'",
        ),
        ({"type": "once", "at": "nope"}, "invalid schedule.at: nope"),
        ({"type": "once", "at": 5}, "invalid schedule.at: 5"),
        ({"type": "once"}, "invalid schedule.at: None"),
        ({"type": "cron", "expression": "0 0 31 2 *"}, 'cron expression never matches: "0 0 31 2 *"'),
        ({"type": "cron", "expression": "* * *"}, 'cron must have 5 fields, got 3: "* * *"'),
        ({"type": "cron", "expression": 5}, "schedule.expression must be a string, got 5"),
        ({"type": "dynamic", "minIntervalMs": 0}, "dynamic minIntervalMs must be > 0, got 0"),
    ],
)
def test_invalid_shapes_name_the_field_and_quote_the_value(value: Any, message: str) -> None:
    assert validation_error(value) == message


# parse_time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-15T09:00:00Z", "2026-01-15T09:00:00.000Z"),
        ("2026-01-15T09:00:00.123456z", "2026-01-15T09:00:00.123Z"),
        ("2026-01-15T09:00:00+01:00", "2026-01-15T08:00:00.000Z"),
        ("2026-01-15T09:00:00", "2026-01-15T14:00:00.000Z"),
        ("2026-07-15 09:00", "2026-07-15T13:00:00.000Z"),
        ("2026-01-15", "2026-01-15T05:00:00.000Z"),
        ("  2026-01-15T09:00Z ", "2026-01-15T09:00:00.000Z"),
        # 02:30 does not exist on 2026-03-08 in New York; like a JS Date it lands an hour later, 03:30 EDT.
        ("2026-03-08T02:30:00", "2026-03-08T07:30:00.000Z"),
        # 01:30 happens twice on 2026-11-01; the first one (EDT) is meant.
        ("2026-11-01T01:30:00", "2026-11-01T05:30:00.000Z"),
    ],
)
def test_times_without_an_offset_are_wall_time_in_the_zone(text: str, expected: str) -> None:
    assert to_iso(parse_time(text, NEW_YORK, "--at")) == expected


@pytest.mark.parametrize(
    "text", ["", "tomorrow", "2026-13-01", "2026-01-01T25:00", "0001-01-01T00:00:00+01:00"]
)
def test_unparseable_times_name_the_field(text: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_time(text, "UTC", "--expires-at")
    assert str(info.value) == f"invalid --expires-at: {text}"


# initial_next_run


def test_the_first_run_of_each_schedule_type() -> None:
    start = t("2026-01-01T00:00:00.500Z")
    assert to_iso(initial_next_run(EVERY_MINUTE, start, "UTC")) == "2026-01-01T00:01:00.500Z"
    assert to_iso(initial_next_run(HOURLY, start, "UTC")) == "2026-01-01T01:00:00.000Z"
    assert to_iso(initial_next_run(Schedule(type="dynamic"), start, "UTC")) == "2026-01-01T00:01:00.500Z"
    cron_9am = Schedule(type="cron", expression="0 9 * * *")
    assert to_iso(initial_next_run(cron_9am, start, NEW_YORK)) == "2026-01-01T14:00:00.000Z"


def test_a_once_schedule_in_the_past_is_due_immediately() -> None:
    once = Schedule(type="once", at="2020-01-01T00:00:00")
    assert to_iso(initial_next_run(once, t("2026-01-01T00:00:00Z"), NEW_YORK)) == "2020-01-01T05:00:00.000Z"


# compute_next_after


def test_a_once_schedule_has_no_next_slot() -> None:
    once = Schedule(type="once", at="2026-01-01T00:00:00Z")
    assert compute_next_after(once, t("2026-01-01T00:00:00Z"), t("2026-01-01T00:00:05Z"), "UTC") is None


@pytest.mark.parametrize(
    ("finished", "expected"),
    [
        ("2026-01-01T00:00:10.000Z", "2026-01-01T00:01:00.000Z"),
        ("2026-01-01T00:01:00.000Z", "2026-01-01T00:02:00.000Z"),
        ("2026-01-01T00:03:30.000Z", "2026-01-01T00:04:00.000Z"),
        ("2036-01-01T00:00:30.000Z", "2036-01-01T00:01:00.000Z"),
    ],
)
def test_fixed_rate_keeps_phase_and_never_schedules_in_the_past(finished: str, expected: str) -> None:
    slot = compute_next_after(EVERY_MINUTE, t("2026-01-01T00:00:00Z"), t(finished), "UTC")
    assert slot is not None
    assert to_iso(slot) == expected


def test_fixed_delay_counts_from_the_end_of_the_run() -> None:
    delay = Schedule(type="interval", every_ms=60_000, anchor="fixed_delay")
    slot = compute_next_after(delay, t("2026-01-01T00:00:00Z"), t("2026-01-01T00:03:10.250Z"), "UTC")
    assert slot is not None
    assert to_iso(slot) == "2026-01-01T00:04:10.250Z"


@pytest.mark.parametrize(
    ("finished", "expected"),
    [
        ("2026-01-01T10:05:00.000Z", "2026-01-01T11:00:00.000Z"),
        ("2026-01-01T11:00:00.000Z", "2026-01-01T12:00:00.000Z"),
        ("2026-01-01T12:30:00.000Z", "2026-01-01T13:00:00.000Z"),
        ("2030-06-01T00:00:01.000Z", "2030-06-01T01:00:00.000Z"),
    ],
)
def test_cron_skips_slots_that_passed_while_the_run_was_going(finished: str, expected: str) -> None:
    slot = compute_next_after(HOURLY, t("2026-01-01T10:00:00Z"), t(finished), "UTC")
    assert slot is not None
    assert to_iso(slot) == expected


def test_dynamic_runs_again_one_minimum_interval_after_finishing() -> None:
    dynamic = Schedule(type="dynamic", min_interval_ms=90_000)
    slot = compute_next_after(dynamic, t("2026-01-01T00:00:00Z"), t("2026-01-01T00:10:00Z"), "UTC")
    assert slot is not None
    assert to_iso(slot) == "2026-01-01T00:11:30.000Z"


# due_slots


def test_interval_latest_gives_the_reference_example_slot() -> None:
    assert due(EVERY_MINUTE, "2026-01-01T00:00:00Z", "2026-01-01T00:04:30Z") == ["2026-01-01T00:04:00.000Z"]


def test_interval_all_returns_every_missed_slot_in_order() -> None:
    assert due(EVERY_MINUTE, "2026-01-01T00:00:00Z", "2026-01-01T00:04:30Z", catch_up="all") == [
        "2026-01-01T00:00:00.000Z",
        "2026-01-01T00:01:00.000Z",
        "2026-01-01T00:02:00.000Z",
        "2026-01-01T00:03:00.000Z",
        "2026-01-01T00:04:00.000Z",
    ]


def test_interval_all_returns_only_the_oldest_slots_up_to_the_limit() -> None:
    slots = due(
        EVERY_MINUTE, "2016-01-01T00:00:00Z", "2026-01-01T00:00:00Z", catch_up="all", catch_up_limit=3
    )
    assert slots == ["2016-01-01T00:00:00.000Z", "2016-01-01T00:01:00.000Z", "2016-01-01T00:02:00.000Z"]


def test_a_limit_below_one_still_runs_the_due_slot() -> None:
    assert due(
        EVERY_MINUTE, "2026-01-01T00:00:00Z", "2026-01-01T00:04:30Z", catch_up="all", catch_up_limit=0
    ) == ["2026-01-01T00:00:00.000Z"]


def test_catch_up_none_runs_only_the_scheduled_slot() -> None:
    for schedule in (EVERY_MINUTE, HOURLY):
        assert due(schedule, "2026-01-01T00:00:00Z", "2026-01-01T05:04:30Z", catch_up="none") == [
            "2026-01-01T00:00:00.000Z"
        ]


def test_a_pending_retry_takes_precedence_over_catch_up() -> None:
    retry = t("2026-01-01T00:00:30Z")
    for policy in CATCH_UP_POLICIES:
        slots = due(
            EVERY_MINUTE,
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:04:30Z",
            catch_up=policy,
            retry_scheduled_for=retry,
        )
        assert slots == ["2026-01-01T00:00:30.000Z"]


@pytest.mark.parametrize(
    "overrides",
    [
        {"status": "paused"},
        {"status": "stopped"},
        {"expires_at": from_iso("2026-01-01T00:04:30Z")},
        {"expires_at": from_iso("2026-01-01T00:01:00Z")},
        {"next_run_at": None},
        {"next_run_at": from_iso("2026-01-01T00:04:30.001Z")},
    ],
)
def test_nothing_is_due_for_a_paused_expired_unscheduled_or_future_loop(overrides: dict[str, Any]) -> None:
    assert due(EVERY_MINUTE, "2026-01-01T00:00:00Z", "2026-01-01T00:04:30Z", **overrides) == []


def test_a_loop_expiring_later_is_still_due() -> None:
    slots = due(
        EVERY_MINUTE, "2026-01-01T00:00:00Z", "2026-01-01T00:04:30Z", expires_at=t("2026-01-01T00:04:31Z")
    )
    assert slots == ["2026-01-01T00:04:00.000Z"]


def test_once_and_dynamic_run_their_next_slot_whatever_the_policy() -> None:
    once = Schedule(type="once", at="2026-01-01T00:00:00Z")
    for schedule in (once, Schedule(type="dynamic")):
        for policy in CATCH_UP_POLICIES:
            slots = due(schedule, "2026-01-01T00:00:00Z", "2026-01-03T00:00:00Z", catch_up=policy)
            assert slots == ["2026-01-01T00:00:00.000Z"]


def test_cron_all_steps_through_matches_up_to_the_limit() -> None:
    assert due(HOURLY, "2026-01-01T00:00:00Z", "2026-01-01T03:30:00Z", catch_up="all") == [
        "2026-01-01T00:00:00.000Z",
        "2026-01-01T01:00:00.000Z",
        "2026-01-01T02:00:00.000Z",
        "2026-01-01T03:00:00.000Z",
    ]
    assert due(HOURLY, "2026-01-01T00:00:00Z", "2026-01-01T03:30:00Z", catch_up="all", catch_up_limit=2) == [
        "2026-01-01T00:00:00.000Z",
        "2026-01-01T01:00:00.000Z",
    ]


def test_cron_latest_jumps_to_the_last_match_even_after_years_of_downtime() -> None:
    every_minute = Schedule(type="cron", expression="* * * * *")
    assert due(every_minute, "2016-01-01T00:00:00Z", "2026-01-01T00:04:30Z") == ["2026-01-01T00:04:00.000Z"]
    assert due(HOURLY, "2026-01-01T00:00:00Z", "2026-01-01T03:30:00Z") == ["2026-01-01T03:00:00.000Z"]


def test_cron_latest_keeps_the_scheduled_slot_when_no_match_followed_it() -> None:
    assert due(HOURLY, "2026-01-01T00:20:00Z", "2026-01-01T00:50:00Z") == ["2026-01-01T00:20:00.000Z"]


def test_cron_latest_in_the_repeated_hour_returns_the_first_occurrence() -> None:
    half_hourly = Schedule(type="cron", expression="*/30 * * * *")
    slots = due(half_hourly, "2026-11-01T04:00:00Z", "2026-11-01T06:45:00Z", tz=NEW_YORK)
    assert slots == ["2026-11-01T05:30:00.000Z"]


def test_an_unknown_catch_up_policy_is_rejected() -> None:
    with pytest.raises(ValidationError, match=r"^catchUp must be none, latest or all, got 'some'$"):
        due(EVERY_MINUTE, "2026-01-01T00:00:00Z", "2026-01-01T00:04:30Z", catch_up="some")
