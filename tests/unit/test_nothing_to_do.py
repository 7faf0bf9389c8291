"""Exit 75 (EX_TEMPFAIL) of an overlap-skip loop's command or agent means "nothing to do now" (OpenLoops 0.4.39):
the run is recorded skipped with the reason, never retried, not counted by the circuit breaker, and the loop
moves on as after a success."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loopsq.domain import run_rules as rules
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import to_iso

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVERY_MIN = {"type": "interval", "everyMs": 60_000}
COMMAND = {"type": "command", "command": "true"}


def loop_at(schedule: dict[str, Any] = EVERY_MIN, target: dict[str, Any] = COMMAND, **policies: Any) -> Loop:
    return new_loop({"name": "l", "timezone": "UTC", "schedule": schedule, "target": target, **policies}, T0)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def ended(loop: Loop, slot: datetime, status: str, error: str | None, attempt: int = 1) -> LoopRun:
    return LoopRun(id="r1", loop_id=loop.id, loop_name=loop.name, scheduled_for=to_iso(slot), attempt=attempt,
                   status=status, created_at=to_iso(slot), updated_at=to_iso(slot), source="scheduled", error=error,
                   exit_code=75)


@pytest.mark.parametrize("target", [COMMAND, {"type": "agent", "provider": "codex", "prompt": "p"}])
def test_exit_75_of_an_overlap_skip_command_or_agent_is_recorded_skipped_with_the_reason(
        target: dict[str, Any]) -> None:
    loop = loop_at(target=target)
    assert rules.finished_status(loop, "failed", 75, "process exited with code 75") == (
        "skipped", "nothing to do (exit 75)")


@pytest.mark.parametrize(("policies", "status", "exit_code"), [
    ({"overlap": "allow"}, "failed", 75), ({"overlap": "replace"}, "failed", 75), ({}, "failed", 74),
    ({}, "timed_out", 75), ({}, "succeeded", 0), ({}, "cancelled", 75),
])
def test_any_other_end_is_recorded_as_the_executor_reported_it(policies: dict[str, Any], status: str,
                                                               exit_code: int) -> None:
    assert rules.finished_status(loop_at(**policies), status, exit_code, "e") == (status, "e")


def test_a_workflow_loop_ends_as_its_workflow_does() -> None:
    loop = loop_at(target={"type": "workflow", "workflowId": "w1"})
    assert rules.finished_status(loop, "failed", 75, "e") == ("failed", "e")


def test_nothing_to_do_is_not_retried_leaves_the_streak_and_advances_as_a_success() -> None:
    loop = loop_at(maxAttempts=3).with_changes(failure_streak=4)  # one more failure would trip the breaker
    skipped = ended(loop, at(1), "skipped", rules.NOTHING_TO_DO_ERROR)
    assert rules.is_nothing_to_do(skipped)
    advance = rules.after_finish(loop, skipped, at(1.1))
    assert (advance.transition, advance.loop.status) == ("loop_advanced", "active")
    assert (advance.loop.failure_streak, advance.loop.retry_scheduled_for) == (4, None)
    failed = rules.after_finish(loop, ended(loop, at(1), "failed", "process exited with code 75"), at(1.1))
    assert failed.transition == "retry_scheduled"  # (an overlap-allow loop's exit 75 is an ordinary failure)


def test_a_fixed_delay_loop_gets_its_next_slot_from_the_end_of_a_run_with_nothing_to_do() -> None:
    loop = loop_at({"type": "interval", "everyMs": 60_000, "anchor": "fixed_delay"})
    claimed = rules.after_claim(loop, at(1), at(1), is_retry=False)
    advance = rules.after_finish(claimed, ended(claimed, at(1), "skipped", rules.NOTHING_TO_DO_ERROR), at(1.5))
    assert (advance.transition, advance.loop.next_run_at) == ("loop_advanced", to_iso(at(2.5)))


def test_a_once_loop_with_nothing_to_do_stops_as_after_a_success() -> None:
    loop = loop_at({"type": "once", "at": to_iso(at(1))})
    claimed = rules.after_claim(loop, at(1), at(1), is_retry=False)
    advance = rules.after_finish(claimed, ended(claimed, at(1), "skipped", rules.NOTHING_TO_DO_ERROR), at(1.1))
    assert (advance.transition, advance.loop.status) == ("loop_stopped", "stopped")
