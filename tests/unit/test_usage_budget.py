"""Usage parsed per provider from the agent CLIs' JSON output, and budgets: windows, figures, the pause."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from loopsq.domain.budget import account, parse_budget_flag, reached, window_start
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.run_rules import Advance, LoopRun
from loopsq.domain.usage import Usage, parse_usage
from loopsq.errors import ValidationError

CLAUDE = json.dumps({"type": "result", "subtype": "success", "total_cost_usd": 0.0421, "usage": {
    "input_tokens": 12, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200, "output_tokens": 345}})
CODEX = "\n".join(json.dumps(e) for e in [
    {"type": "thread.started", "thread_id": "t"},
    {"type": "turn.completed", "usage": {"input_tokens": 1000, "cached_input_tokens": 800, "output_tokens": 50}},
    {"type": "item.completed", "item": {"type": "agent_message", "text": "done"}},
    {"type": "turn.completed", "usage": {"input_tokens": 500, "cached_input_tokens": 0, "output_tokens": 25}},
])
OPENCODE = "\n".join(json.dumps(e) for e in [
    {"type": "step_start", "part": {}},
    {"type": "step_finish", "part": {"cost": 0.01, "tokens": {"input": 100, "output": 20, "reasoning": 5,
                                                               "cache": {"read": 50, "write": 0}}}},
    {"type": "step_finish", "part": {"cost": 0.02, "tokens": {"input": 200, "output": 40, "reasoning": 0,
                                                               "cache": {"read": 0, "write": 10}}}},
])


CODEWITH = "\n".join(json.dumps(e) for e in [
    {"type": "thread.started", "thread_id": "t"},
    {"type": "turn.completed", "usage": {"input_tokens": 500, "cached_input_tokens": 400, "output_tokens": 20}},
    {"type": "turn.completed", "usage": {"input_tokens": 900, "cached_input_tokens": 700, "output_tokens": 40}},
])


@pytest.mark.parametrize(("provider", "stdout", "usage"), [
    ("claude", CLAUDE, Usage(1212, 345, 0.0421)),
    ("claude", "not json at all\n", None),
    ("codex", CODEX, Usage(1500, 75, None)),
    ("opencode", OPENCODE, Usage(360, 65, 0.03)),
    ("aicopilot", OPENCODE, Usage(360, 65, 0.03)),
    ("cursor", json.dumps({"type": "result", "usage": {"inputTokens": 7, "outputTokens": 3}}), Usage(7, 3, None)),
    ("codewith", '{"agent": {"agentId": "a"}}', None),
    # codewith's turn.completed carries the thread's running total: the last one counts, not their sum
    ("codewith", CODEWITH, Usage(900, 40, None)),
])
def test_usage_is_parsed_per_provider(provider: str, stdout: str, usage: Usage | None) -> None:
    found = parse_usage(provider, stdout)
    if usage is None or found is None:
        assert found == usage
    else:
        assert (found.input_tokens, found.output_tokens) == (usage.input_tokens, usage.output_tokens)
        assert found.cost_usd == pytest.approx(usage.cost_usd) if usage.cost_usd is not None else found.cost_usd is None


T = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)  # a Wednesday


def test_windows_are_the_utc_day_and_the_iso_week() -> None:
    assert window_start("day", T) == "2026-12-02"
    assert window_start("week", T) == "2026-11-30"


def _loop(**extra: object) -> object:
    return new_loop({"name": "x", "schedule": {"type": "interval", "everyMs": 60_000},
                     "target": {"type": "command", "command": "true"}, **extra}, T)


def _run(cost: float | None = None, status: str = "succeeded") -> LoopRun:
    return LoopRun(id="r", loop_id="l", loop_name="x", scheduled_for="2026-12-02T15:00:00.000Z", attempt=1,
                   status=status, created_at="", updated_at="", input_tokens=10 if cost is not None else None,
                   output_tokens=5 if cost is not None else None, cost_usd=cost)


def test_a_cost_budget_pauses_the_loop_with_the_figures_once_reached() -> None:
    loop = _loop(budgetCost={"limit": 1, "per": "day"})
    for _ in range(2):
        advance = account(Advance(loop, "loop_advanced"), _run(0.4), T)  # type: ignore[arg-type]
        loop = advance.loop
        assert loop.status == "active"  # type: ignore[attr-defined]
    advance = account(Advance(loop, "loop_advanced"), _run(0.4), T)  # type: ignore[arg-type]
    assert advance.transition == "paused_by_budget"
    assert advance.loop.status_reason == "budget reached: $1.20 spent this day (limit $1.00/day)"
    assert advance.loop.usage["day"] == {"start": "2026-12-02", "runs": 3, "inputTokens": 30, "outputTokens": 15,
                                         "costUsd": 1.2}
    # The next day's window starts from zero.
    later = account(Advance(advance.loop.with_changes(status="active"), "none"), _run(0.1), T + timedelta(days=1))
    assert later.loop.usage["day"]["runs"] == 1 and reached(later.loop) is None
    assert later.loop.usage["week"]["runs"] == 4


def test_a_runs_budget_counts_every_run_but_skipped_ones() -> None:
    loop = _loop(budgetRuns={"limit": 2, "per": "week"})
    loop = account(Advance(loop, "none"), _run(status="skipped"), T).loop  # type: ignore[arg-type]
    assert loop.usage is None  # type: ignore[attr-defined]
    loop = account(Advance(loop, "none"), _run(status="failed"), T).loop  # type: ignore[arg-type]
    final = account(Advance(loop, "none"), _run(), T)
    assert final.loop.status_reason == "budget reached: 2 runs this week (limit 2/week)"


def test_loops_without_budget_or_usage_are_not_written() -> None:
    loop = _loop()
    assert account(Advance(loop, "none"), _run(), T).loop is loop  # type: ignore[arg-type]


@pytest.mark.parametrize(("flag", "text", "cost", "message"), [
    ("--budget-runs", "5", False, "--budget-runs must be N/day or N/week, got '5'"),
    ("--budget-runs", "1.5/day", False, "--budget-runs must be N/day or N/week, got '1.5/day'"),
    ("--budget-runs", "0/day", False, "--budget-runs must be greater than zero, got '0/day'"),
    ("--budget-runs", "5/month", False, "--budget-runs must be N/day or N/week, got '5/month'"),
    ("--budget-cost", "lots/day", True, "--budget-cost must be AMOUNT/day or AMOUNT/week, got 'lots/day'"),
    ("--budget-cost", "$0/week", True, "--budget-cost must be greater than zero, got '$0/week'"),
    ("--budget-cost", "2000000/day", True, "--budget-cost must be at most 1000000/day, got '2000000/day'"),
])
def test_bad_budget_flags_name_the_flag_and_the_value(flag: str, text: str, cost: bool, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_budget_flag(flag, text, cost=cost)
    assert info.value.message == message


def test_good_budget_flags() -> None:
    assert parse_budget_flag("--budget-cost", "$4.50/week", cost=True) == {"limit": 4.5, "per": "week"}
    assert parse_budget_flag("--budget-runs", "20/day", cost=False) == {"limit": 20, "per": "day"}
