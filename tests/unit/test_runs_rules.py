"""Pure run rules: what is due, how a claim and a finished run move the loop, retry delays, run-now sources."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from loopsq.domain import run_rules as rules
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import from_iso, to_iso

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def loop_at(schedule: dict[str, Any], **policies: Any) -> Loop:
    body = {"name": "l", "timezone": "UTC", "schedule": schedule, "target": {"type": "command", "command": "true"},
            **policies}
    return new_loop(body, T0)


EVERY_MIN = {"type": "interval", "everyMs": 60_000}


def run_of(loop: Loop, slot: datetime, status: str, attempt: int = 1, source: str = "scheduled") -> LoopRun:
    return LoopRun(id="r1", loop_id=loop.id, loop_name=loop.name, scheduled_for=to_iso(slot), attempt=attempt,
                   status=status, created_at=to_iso(slot), updated_at=to_iso(slot), source=source,
                   error=None if status == "succeeded" else "process exited with code 1")


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_reference_example_latest_catch_up_picks_the_latest_slot_not_after_now() -> None:
    loop = loop_at(EVERY_MIN).with_changes(next_run_at="2026-01-01T00:00:00.000Z")
    assert rules.due(loop, T0 + timedelta(minutes=4, seconds=30)) == [at(4)]


def test_a_pending_retry_is_due_only_at_its_retry_time_and_alone() -> None:
    loop = loop_at(EVERY_MIN).with_changes(next_run_at=to_iso(at(1)), retry_scheduled_for=to_iso(at(0)),
                                            retry_at=to_iso(at(0.5)))
    assert rules.due(loop, at(0.4)) == []
    assert rules.due(loop, at(3)) == [at(0)]
    assert rules.timer_at(loop) == at(0.5)


def test_paused_and_expired_loops_have_nothing_due_and_no_timer() -> None:
    loop = loop_at(EVERY_MIN)
    assert rules.due(loop.with_changes(status="paused"), at(10)) == []
    assert rules.timer_at(loop.with_changes(status="paused")) is None
    assert rules.due(loop.with_changes(expires_at=to_iso(at(5))), at(10)) == []


def test_a_fixed_rate_claim_moves_the_loop_to_the_next_slot_so_its_timer_can_be_armed() -> None:
    loop = loop_at(EVERY_MIN)
    claimed = rules.after_claim(loop, at(1), at(1), is_retry=False)
    assert claimed.next_run_at == to_iso(at(2))


def test_a_late_fixed_rate_claim_skips_missed_slots_unless_catch_up_is_all() -> None:
    assert rules.after_claim(loop_at(EVERY_MIN), at(1), at(3.5), is_retry=False).next_run_at == to_iso(at(4))
    backlog = loop_at(EVERY_MIN, catchUp="all")
    assert rules.after_claim(backlog, at(1), at(3.5), is_retry=False).next_run_at == to_iso(at(2))


def test_fixed_delay_loops_have_no_next_slot_while_a_run_goes_and_get_it_from_the_end_of_the_run() -> None:
    loop = loop_at({"type": "interval", "everyMs": 60_000, "anchor": "fixed_delay"})
    claimed = rules.after_claim(loop, at(1), at(1), is_retry=False)
    assert claimed.next_run_at is None
    advance = rules.after_finish(claimed, run_of(claimed, at(1), "succeeded"), at(1.5))
    assert (advance.transition, advance.loop.next_run_at) == ("loop_advanced", to_iso(at(2.5)))


def test_reference_retry_example_schedules_the_same_slot_after_the_delay() -> None:
    loop = loop_at(EVERY_MIN, maxAttempts=2, retryDelayMs=5_000)
    failed = run_of(loop, at(1), "failed")
    advance = rules.after_finish(loop, failed, at(1) + timedelta(seconds=5))
    assert advance.transition == "retry_scheduled"
    assert advance.loop.retry_scheduled_for == to_iso(at(1))
    assert advance.loop.retry_at == to_iso(at(1) + timedelta(seconds=10))


def test_an_exhausted_failure_does_not_retry_and_counts_towards_the_streak() -> None:
    loop = loop_at(EVERY_MIN, maxAttempts=2)
    advance = rules.after_finish(loop, run_of(loop, at(1), "failed", attempt=2), at(1.1))
    assert advance.transition == "loop_advanced"
    assert advance.loop.retry_scheduled_for is None
    assert advance.loop.failure_streak == 1


def test_a_failure_streak_pauses_the_loop_and_records_why() -> None:
    loop = loop_at(EVERY_MIN, pauseAfterFailures=2).with_changes(failure_streak=1)
    advance = rules.after_finish(loop, run_of(loop, at(1), "timed_out"), at(1.1))
    assert advance.transition == "paused_by_streak"
    assert advance.loop.status == "paused"
    assert advance.loop.status_reason == (
        "circuit breaker open: paused after 2 consecutive unsuccessful runs (last: timed_out: process exited with "
        f"code 1); fix the cause, then resume it (loopsq resume {loop.id})"
    )


def test_a_new_loop_gets_the_default_circuit_breaker_stored_and_pauses_after_five_unsuccessful_slots() -> None:
    loop = loop_at(EVERY_MIN)
    assert loop.pause_after_failures == 5 and loop.to_dict()["pauseAfterFailures"] == 5
    for minute in range(1, 5):
        advance = rules.after_finish(loop, run_of(loop, at(minute), "failed"), at(minute + 0.1))
        assert (advance.transition, advance.loop.status) == ("loop_advanced", "active")
        loop = advance.loop
    advance = rules.after_finish(loop, run_of(loop, at(5), "failed"), at(5.1))
    assert (advance.transition, advance.loop.status, advance.loop.failure_streak) == ("paused_by_streak", "paused", 5)
    assert advance.loop.status_reason is not None
    assert advance.loop.status_reason.startswith("circuit breaker open: paused after 5 consecutive unsuccessful runs")


def test_a_loop_stored_before_the_default_breaker_keeps_running_however_many_slots_fail() -> None:
    stored = loop_at(EVERY_MIN).to_dict()
    del stored["pauseAfterFailures"]  # as a loop created before the default breaker was stored
    loop = Loop.from_dict(stored)
    assert loop.pause_after_failures is None
    for minute in range(1, 12):
        advance = rules.after_finish(loop, run_of(loop, at(minute), "failed"), at(minute + 0.1))
        assert (advance.transition, advance.loop.status) == ("loop_advanced", "active")
        loop = advance.loop
    assert loop.failure_streak == 11


def test_pause_after_failures_zero_turns_the_breaker_off_and_is_stored() -> None:
    loop = loop_at(EVERY_MIN, pauseAfterFailures=0)
    assert loop.to_dict()["pauseAfterFailures"] == 0
    loop = loop.with_changes(failure_streak=40)
    advance = rules.after_finish(loop, run_of(loop, at(1), "failed"), at(1.1))
    assert (advance.transition, advance.loop.status, advance.loop.failure_streak) == ("loop_advanced", "active", 41)
    assert rules.after_finish(loop, run_of(loop, at(1), "succeeded"), at(1.1)).loop.status == "active"


def test_a_success_resets_the_streak() -> None:
    loop = loop_at(EVERY_MIN, pauseAfterFailures=3).with_changes(failure_streak=2)
    assert rules.after_finish(loop, run_of(loop, at(1), "succeeded"), at(1.1)).loop.failure_streak == 0


def test_a_settled_ad_hoc_run_never_moves_the_loop() -> None:
    loop = loop_at(EVERY_MIN, maxAttempts=1)
    advance = rules.after_finish(loop, run_of(loop, at(0.3), "failed", source="ad_hoc"), at(0.4))
    assert advance == rules.Advance(loop, "none")  # (with attempts left it is retried: test_retry_rule)


def test_a_loop_paused_during_its_run_is_not_moved() -> None:
    loop = loop_at(EVERY_MIN, maxAttempts=3).with_changes(status="paused")
    assert rules.after_finish(loop, run_of(loop, at(1), "failed"), at(1.1)).transition == "none"


def test_a_once_loop_stops_after_its_run() -> None:
    loop = loop_at({"type": "once", "at": to_iso(at(1))})
    claimed = rules.after_claim(loop, at(1), at(1), is_retry=False)
    advance = rules.after_finish(claimed, run_of(claimed, at(1), "succeeded"), at(1.1))
    assert (advance.transition, advance.loop.status, advance.loop.next_run_at) == ("loop_stopped", "stopped", None)


def test_fixed_backoff_is_exactly_the_retry_delay() -> None:
    assert rules.retry_delay_ms(loop_at(EVERY_MIN, retryDelayMs=1234), 5) == 1234


def test_run_now_sources_follow_the_reference() -> None:
    loop = loop_at(EVERY_MIN)
    assert rules.manual_slot(loop, at(0.5)) == (at(0.5), "ad_hoc")
    assert rules.manual_slot(loop, at(1.5)) == (at(1), "due_slot")
    retrying = loop.with_changes(retry_scheduled_for=to_iso(at(1)), retry_at=to_iso(at(1.2)))
    assert rules.manual_slot(retrying, at(1.5)) == (at(1), "retry_slot")
    assert rules.manual_slot(retrying, at(1.1)) == (at(1.1), "ad_hoc")
    assert rules.manual_slot(loop.with_changes(status="paused"), at(5)) == (at(5), "ad_hoc")


def test_loop_runs_round_trip_their_camel_case_json() -> None:
    run = run_of(loop_at(EVERY_MIN), at(1), "failed").with_changes(pid=42, pid_start_time=12.5, worker_id="w")
    assert LoopRun.from_json(run.to_json()) == run
    assert run.to_dict()["pidStartTime"] == 12.5 and "stdout" not in run.to_dict()


def test_the_attempt_history_keeps_each_ended_attempt_with_its_output_tail_and_only_the_newest_five() -> None:
    loop = loop_at(EVERY_MIN)
    run = run_of(loop, at(0), "failed").with_changes(
        exit_code=1, started_at=to_iso(at(0)), finished_at=to_iso(at(0.1)), duration_ms=6000, worker_id="w1",
        host="h1", stdout="x" * 5000 + "END", stderr="")
    (first,) = rules.attempt_history(run)
    assert first == {"attempt": 1, "status": "failed", "error": "process exited with code 1", "exitCode": 1,
                     "startedAt": to_iso(at(0)), "finishedAt": to_iso(at(0.1)), "durationMs": 6000,
                     "workerId": "w1", "host": "h1", "stdout": ("x" * 5000 + "END")[-rules.ATTEMPT_OUTPUT_TAIL:]}
    for attempt in range(2, 9):
        run = run.with_changes(attempt=attempt, previous_attempts=rules.attempt_history(run))
    history = rules.attempt_history(run)
    assert [a["attempt"] for a in history] == [4, 5, 6, 7, 8]


def test_catch_up_all_cut_at_its_limit_moves_to_the_first_slot_after_now() -> None:
    loop = loop_at(EVERY_MIN, catchUp="all", catchUpLimit=3).with_changes(next_run_at=to_iso(at(0)))
    now = at(4.5)
    slots = rules.due(loop, now)
    assert slots == [at(0), at(1), at(2)]
    assert rules.backlog_cut(loop, slots, now) == at(2)
    first = rules.after_claim(loop, at(0), now, is_retry=False, ends_backlog=False)
    assert first.next_run_at == to_iso(at(1))  # the backlog is worked through in order
    last = rules.after_claim(loop, at(2), now, is_retry=False, ends_backlog=True)
    assert last.next_run_at == to_iso(at(5))  # the missed 00:03 and 00:04 are skipped


def test_catch_up_all_within_its_limit_cuts_nothing() -> None:
    loop = loop_at(EVERY_MIN, catchUp="all", catchUpLimit=50).with_changes(next_run_at=to_iso(at(0)))
    slots = rules.due(loop, at(4.5))
    assert len(slots) == 5
    assert rules.backlog_cut(loop, slots, at(4.5)) is None
    assert rules.backlog_cut(loop_at(EVERY_MIN, catchUp="latest").with_changes(next_run_at=to_iso(at(0))),
                             [at(4)], at(4.5)) is None


def test_a_retry_delay_is_a_minimum_that_jitter_only_lengthens() -> None:
    loop = loop_at(EVERY_MIN, retryDelayMs=4000, retryBackoff="exponential", retryMaxDelayMs=20_000,
                   maxAttempts=9)
    rng = random.Random(3)
    for attempt, full in ((1, 4000), (2, 8000), (3, 16_000), (4, 20_000)):
        delays = {rules.retry_delay_ms(loop, attempt, rng) for _ in range(300)}
        assert min(delays) >= full, (attempt, min(delays))
        assert max(delays) <= full + int(full * rules.RETRY_JITTER_FRACTION)
        assert len(delays) > 1
    failed = run_of(loop, at(1), "failed")
    for seed in range(50):
        advance = rules.after_finish(loop, failed, at(1), random.Random(seed))
        assert advance.loop.retry_at is not None
        assert (from_iso(advance.loop.retry_at) - at(1)).total_seconds() >= 4.0


def test_a_max_delay_below_the_retry_delay_does_not_shorten_it() -> None:
    loop = loop_at(EVERY_MIN, retryDelayMs=4000, retryBackoff="exponential", retryMaxDelayMs=1000)
    assert all(rules.retry_delay_ms(loop, 1, random.Random(s)) >= 4000 for s in range(50))


def test_a_lease_key_lives_one_renewal_period_longer_than_the_lease() -> None:
    from loopsq.domain.run_rules import lease_renew_every_ms, lease_ttl_ms

    # Renewed at a third of the lease, at most a minute apart: the key outlives any outage shorter than the lease.
    assert [lease_renew_every_ms(ms) for ms in (15, 3_000, 10_000, 1_800_000)] == [10, 1_000, 3_333, 60_000]
    assert [lease_ttl_ms(ms) for ms in (3_000, 10_000, 1_800_000)] == [4_000, 13_333, 1_860_000]
