"""Jitter: a deterministic per-loop offset applied to every slot of interval and cron loops; the slot recorded is
the jittered one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from loopsq.domain import run_rules as rules
from loopsq.domain.jitter import offset_ms
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.schedules import Schedule, compute_next_after, due_slots, initial_next_run
from loopsq.domain.timeutil import from_iso

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)


def test_the_offset_is_deterministic_per_loop_and_spread_below_the_jitter() -> None:
    offsets = [offset_ms(f"loop-{i}", 60_000) for i in range(1000)]
    assert offsets == [offset_ms(f"loop-{i}", 60_000) for i in range(1000)]
    assert all(0 <= o < 60_000 for o in offsets)
    # 1,000 loops on the same schedule land in many different seconds, none holding more than a few percent.
    seconds = [o // 1000 for o in offsets]
    assert len(set(seconds)) == 60 and max(seconds.count(s) for s in set(seconds)) < 40


def test_a_cron_loops_slots_all_carry_its_offset() -> None:
    cron = Schedule(type="cron", expression="0 * * * *", offset_ms=123_456)
    first = initial_next_run(cron, T0, "UTC")
    assert first == T0 + timedelta(milliseconds=123_456)
    assert compute_next_after(cron, first, first + timedelta(seconds=1), "UTC") == first + timedelta(hours=1)
    late = first + timedelta(hours=3, minutes=30)
    slots = due_slots(schedule=cron, status="active", next_run_at=first, expires_at=None, retry_scheduled_for=None,
                      catch_up="all", catch_up_limit=50, tz="UTC", now=late)
    assert slots == [first + timedelta(hours=h) for h in range(4)]
    latest = due_slots(schedule=cron, status="active", next_run_at=first, expires_at=None, retry_scheduled_for=None,
                       catch_up="latest", catch_up_limit=50, tz="UTC", now=late)
    assert latest == [first + timedelta(hours=3)]


def test_new_loops_on_one_cron_get_their_own_offsets_stored_in_the_schedule() -> None:
    body = {"name": "x", "schedule": {"type": "cron", "expression": "0 * * * *", "offsetMs": 5},
            "target": {"type": "command", "command": "true"}, "timezone": "UTC", "jitterMs": 3_600_000}
    loops = [new_loop(body, T0) for _ in range(20)]
    for loop in loops:
        assert loop.jitter_ms == 3_600_000
        assert loop.schedule.offset_ms == offset_ms(loop.id, 3_600_000) or None
        assert loop.to_dict()["schedule"].get("offsetMs") == loop.schedule.offset_ms
        # The first jittered slot after T0: 10:00 plus the offset (the 10:00 slot, jittered, is still to come).
        offset = loop.schedule.offset_ms
        assert from_iso(str(loop.next_run_at)) == (T0 + timedelta(milliseconds=offset) if offset else
                                                   T0 + timedelta(hours=1))
        # The next slot after a claim keeps the offset.
        claimed = rules.after_claim(loop, from_iso(str(loop.next_run_at)), from_iso(str(loop.next_run_at)),
                                    is_retry=False)
        assert from_iso(str(claimed.next_run_at)) - from_iso(str(loop.next_run_at)) == timedelta(hours=1)
    assert len({loop.next_run_at for loop in loops}) == 20
    # Without jitter a request's own offsetMs is dropped.
    plain = new_loop({**body, "jitterMs": None}, T0)
    assert plain.schedule.offset_ms is None and plain.next_run_at == "2026-12-01T11:00:00.000Z"


def test_times_before_the_year_1000_keep_four_digit_years_and_read_back() -> None:
    from loopsq.domain.timeutil import to_iso

    moment = datetime(999, 1, 1, tzinfo=UTC)
    assert to_iso(moment) == "0999-01-01T00:00:00.000Z" and from_iso(to_iso(moment)) == moment
