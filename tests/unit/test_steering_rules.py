"""The pure steering rule: how a run's control moves its loop (clamped nextIn, stop, needs_human), and when it
does not (a loop no longer active, a pending retry, manual and backfill runs, abandoned runs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import Advance, LoopRun
from loopsq.domain.steering import steer
from loopsq.domain.timeutil import from_iso

T = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _loop(**extra: Any) -> Loop:
    return new_loop({"name": "x", "schedule": {"type": "interval", "everyMs": 60_000},
                     "target": {"type": "command", "command": "true"}, **extra}, T)


def _run(control: dict[str, Any] | None, **extra: Any) -> LoopRun:
    return LoopRun(id="r1", loop_id="l", loop_name="x", scheduled_for="2026-12-01T12:00:00.000Z", attempt=1,
                   status=extra.pop("status", "succeeded"), created_at="", updated_at="", control=control,
                   source=extra.pop("source", "scheduled"), **extra)


@pytest.mark.parametrize(("next_in", "expected_s"), [(30_000, 30), (500, 2), (7_200_000, 3600)])
def test_next_in_is_clamped_to_the_loops_bounds(next_in: int, expected_s: int) -> None:
    loop = _loop(steerable=True, minIntervalMs=2000, maxIntervalMs=3_600_000)
    advance = steer(Advance(loop, "loop_advanced"), _run({"nextInMs": next_in}), T)
    assert from_iso(str(advance.loop.next_run_at)) == T + timedelta(seconds=expected_s)
    assert advance.transition == "loop_steered"


def test_stop_needs_human_and_done() -> None:
    loop = _loop()
    stopped = steer(Advance(loop, "loop_advanced"), _run({"stop": True, "note": "enough"}), T)
    assert (stopped.loop.status, stopped.loop.status_reason, stopped.transition) == (
        "stopped", "stopped by run r1 (stop): enough", "loop_stopped")
    done = steer(Advance(loop, "loop_advanced"), _run({"outcome": "done"}), T)
    assert (done.loop.status, done.loop.status_reason) == ("stopped", "stopped by run r1 (done)")
    human = steer(Advance(loop, "loop_advanced"), _run({"outcome": "needs_human"}), T)
    assert (human.loop.status, human.loop.status_reason, human.transition) == (
        "paused", "needs_human (run r1)", "paused_by_outcome")


@pytest.mark.parametrize("case", ["not steerable", "retry pending", "manual", "backfill", "abandoned", "paused"])
def test_when_a_control_moves_nothing(case: str) -> None:
    loop = _loop(steerable=case != "not steerable")
    advance = Advance(loop.with_changes(status="paused") if case == "paused" else loop,
                      "retry_scheduled" if case == "retry pending" else "loop_advanced")
    run = _run({"nextInMs": 5000, **({"stop": True} if case in ("backfill", "abandoned", "paused") else {})},
               source={"manual": "ad_hoc", "backfill": "backfill"}.get(case, "scheduled"),
               status="abandoned" if case == "abandoned" else "succeeded")
    assert steer(advance, run, T) == advance
