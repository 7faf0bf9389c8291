"""The progress watchdog's pure rules (``domain.stalls``): the grace, when a loop is stalled, the records, and
how ``doctor`` reports them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loopsq.domain import stalls
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.errors import ValidationError
from loopsq.ops.doctor import Check, stall_checks

T0 = datetime(2026, 5, 1, 8, 0, 0, tzinfo=UTC)


def loop_with(schedule: dict[str, Any]) -> Loop:
    return new_loop({"name": "ingest", "timezone": "UTC", "schedule": schedule,
                     "target": {"type": "command", "command": "true"}}, T0)


EVERY_1S = {"type": "interval", "everyMs": 1_000}
EVERY_MINUTE = {"type": "interval", "everyMs": 60_000}
CRON_5M = {"type": "cron", "expression": "*/5 * * * *"}


def test_the_grace_floor_is_30_seconds_unless_the_variable_says_otherwise() -> None:
    assert stalls.grace_min_ms({}) == 30_000
    assert stalls.grace_min_ms({"LOOPSQ_STALL_GRACE_MIN": ""}) == 30_000
    assert stalls.grace_min_ms({"LOOPSQ_STALL_GRACE_MIN": "2s"}) == 2_000


@pytest.mark.parametrize("value", ["0s", "soon", "-5s"])
def test_a_grace_floor_that_is_no_duration_above_zero_is_refused_quoting_it(value: str) -> None:
    with pytest.raises(ValidationError) as exc:
        stalls.grace_min_ms({"LOOPSQ_STALL_GRACE_MIN": value})
    assert exc.value.message == (
        f"LOOPSQ_STALL_GRACE_MIN must be a duration greater than zero such as 30s, got '{value}'")


def test_the_grace_is_two_cadences_or_the_floor_whichever_is_longer() -> None:
    assert stalls.grace_ms(loop_with(EVERY_1S), T0, 30_000) == 30_000
    assert stalls.grace_ms(loop_with(EVERY_MINUTE), T0, 30_000) == 120_000
    assert stalls.grace_ms(loop_with(CRON_5M), T0, 30_000) == 600_000
    assert stalls.grace_ms(loop_with({"type": "once", "at": "2026-05-01T09:00:00Z"}), T0, 30_000) == 30_000


def test_a_loop_is_stalled_only_once_overdue_past_its_grace() -> None:
    loop = loop_with(EVERY_MINUTE)
    assert not stalls.overdue(loop, T0, T0 + timedelta(seconds=120), 30_000)
    assert stalls.overdue(loop, T0, T0 + timedelta(seconds=120, milliseconds=1), 30_000)
    assert not stalls.overdue(loop, None, T0 + timedelta(days=1), 30_000)
    paused = loop.with_changes(status="paused")
    assert not stalls.overdue(paused, T0, T0 + timedelta(days=1), 30_000)


def test_a_stall_record_reads_back_and_is_recent_for_an_hour() -> None:
    stall = stalls.stall_at(stalls.HOT_LOOP, T0, repaired=True)
    assert stall.to_json() == '{"cause":"hot_loop","at":"2026-05-01T08:00:00.000Z","repaired":true}'
    assert stalls.Stall.from_json(stall.to_json()) == stall
    assert stalls.Stall.from_json("{not json") is None
    assert stalls.Stall.from_json('{"cause":"hot_loop"}') is None
    assert stall.is_recent(T0 + timedelta(hours=1))
    assert not stall.is_recent(T0 + timedelta(hours=1, milliseconds=1))
    assert stall.text() == "hot_loop: a claim the slot can never pass"


def test_doctor_fails_for_a_loop_not_repaired_and_warns_for_a_recent_repair() -> None:
    records = {
        "a1": stalls.stall_at(stalls.LOST_FIRE_JOB, T0, repaired=True),
        "b2": stalls.stall_at(stalls.HOT_LOOP, T0, repaired=False),
        "c3": stalls.stall_at(stalls.HOT_LOOP, T0 - timedelta(hours=2), repaired=True),  # long ago: not shown
        "gone": stalls.stall_at(stalls.HOT_LOOP, T0, repaired=False),  # its loop was deleted
    }
    names = {"a1": "ingest", "b2": "report", "c3": "old"}
    assert stall_checks(records, names, T0 + timedelta(minutes=5)) == [
        Check("loop:a1:stall", "warn", "loop was stalled and has been repaired: ingest",
              "lost_fire_job: its fire job was in no queue; repaired at 2026-05-01T08:00:00.000Z"),
        Check("loop:b2:stall", "fail", "loop is stalled and was not repaired: report",
              "hot_loop: a claim the slot can never pass; found at 2026-05-01T08:00:00.000Z"),
    ]
    assert stall_checks({}, names, T0) == [Check("stalls", "ok", "no loop stalled within the last hour")]
