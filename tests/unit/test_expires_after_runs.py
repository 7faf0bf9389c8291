"""``--expires-after-runs N`` (OpenLoops 0.5.3): a loop expires after N consecutive successful runs of its schedule;
a final failure starts the count again, a skipped, missed or manual run does not count. The CLI, the API body, the
mirror, ``show`` and ``resume``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain import lifecycle
from loopsq.domain import run_rules as rules
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import to_iso
from loopsq.errors import ValidationError
from loopsq.mirror.schema import column_names, open_db
from tests.unit.cli_helpers import Cli, make_cli

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVERY_MIN = {"type": "interval", "everyMs": 60_000}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def loop_at(schedule: dict[str, Any] = EVERY_MIN, **policies: Any) -> Loop:
    return new_loop({"name": "l", "timezone": "UTC", "schedule": schedule,
                     "target": {"type": "command", "command": "true"}, **policies}, T0)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def run_of(loop: Loop, minute: int, status: str, *, source: str = "scheduled", attempt: int = 1) -> LoopRun:
    slot = to_iso(at(minute))
    error = {"succeeded": None, "skipped": rules.NOTHING_TO_DO_ERROR}.get(status, "process exited with code 1")
    return LoopRun(id=f"r{minute}", loop_id=loop.id, loop_name=loop.name, scheduled_for=slot, attempt=attempt,
                   status=status, created_at=slot, updated_at=slot, source=source, error=error)


def finish(loop: Loop, *statuses: str, source: str = "scheduled") -> tuple[Loop, list[str]]:
    """``loop`` after runs of minutes 1, 2, ... ending with ``statuses``; and the transition of each."""
    transitions = []
    for minute, status in enumerate(statuses, start=1):
        advance = rules.after_finish(loop, run_of(loop, minute, status, source=source), at(minute + 0.1))
        loop = advance.loop
        transitions.append(advance.transition)
    return loop, transitions


def test_a_loop_expires_at_its_nth_consecutive_successful_run_with_the_reason() -> None:
    loop = loop_at(expiresAfterRuns=3)
    assert (loop.expires_after_runs, loop.success_streak) == (3, 0)
    assert loop.to_dict()["expiresAfterRuns"] == 3 and loop.to_dict()["successStreak"] == 0
    loop, transitions = finish(loop, "succeeded", "succeeded", "succeeded")
    assert transitions == ["loop_advanced", "loop_advanced", "loop_expired"]
    assert (loop.status, loop.next_run_at, loop.success_streak) == ("expired", None, 3)
    assert loop.status_reason == (
        f"expired after 3 consecutive successful runs; resume it to start a new count (loopsq resume {loop.id})")
    assert rules.timer_at(loop) is None and rules.due(loop, at(10)) == []


def test_a_final_failure_starts_the_count_again_and_skipped_runs_do_not_count() -> None:
    loop, transitions = finish(loop_at(expiresAfterRuns=2), "succeeded", "failed", "succeeded", "skipped",
                               "succeeded")
    assert transitions[-1] == "loop_expired"
    assert transitions[:-1] == ["loop_advanced"] * 4
    loop, _ = finish(loop_at(expiresAfterRuns=2, maxAttempts=2), "succeeded", "failed")
    assert (loop.status, loop.success_streak) == ("active", 1)  # (attempts left: a retry, not a final failure)


def test_manual_runs_do_not_count() -> None:
    loop, transitions = finish(loop_at(expiresAfterRuns=1), "succeeded", "succeeded", source="ad_hoc")
    assert transitions == ["none", "none"] and (loop.status, loop.success_streak) == ("active", 0)


def test_a_loop_without_the_field_never_expires_and_keeps_no_count() -> None:
    loop, transitions = finish(loop_at(), *["succeeded"] * 20)
    assert set(transitions) == {"loop_advanced"}
    assert (loop.status, loop.success_streak) == ("active", None)
    assert "successStreak" not in loop.to_dict() and "expiresAfterRuns" not in loop.to_dict()


def test_resume_after_expiry_schedules_the_loop_again_with_a_new_count() -> None:
    loop, _ = finish(loop_at(expiresAfterRuns=1), "succeeded")
    assert loop.status == "expired"
    resumed = lifecycle.resume(loop, at(30))
    assert (resumed.status, resumed.success_streak, resumed.status_reason) == ("active", 0, None)
    assert resumed.next_run_at == to_iso(at(31))


@pytest.mark.parametrize("value", [0, -1, 1.5, "3", True])
def test_a_bad_expires_after_runs_in_a_body_names_the_field_and_the_value(value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        loop_at(expiresAfterRuns=value)
    assert caught.value.message.startswith("expiresAfterRuns must be a positive integer, got ")


def test_the_cli_stores_it_shows_it_with_the_count_and_refuses_bad_values(cli: Cli) -> None:
    created = cli.json("create", "command", "c", "--cmd", "true", "--every", "1m", "--expires-after-runs", "7")
    assert (created["expiresAfterRuns"], created["successStreak"]) == (7, 0)
    shown = cli.json("show", "c")
    assert (shown["expiresAfterRuns"], shown["successStreak"]) == (7, 0)
    workflow_flags = cli.run("create", "workflow", "--help").stdout
    assert "--expires-after-runs N" in workflow_flags
    for value in ("0", "-2", "x", "1.5"):
        before = cli.state()
        result = cli.run("create", "agent", "a", "--provider", "codex", "--prompt", "p", "--every", "1m",
                         "--expires-after-runs", value)
        assert (result.exit_code, result.stderr) == (
            2, f"error: --expires-after-runs must be a positive integer, got '{value}'\n")
        assert cli.state() == before


def test_a_mirror_of_the_previous_version_gains_the_columns_in_place_keeping_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    db = open_db(path)
    for column in ("expires_after_runs", "success_streak"):
        db.execute(f"ALTER TABLE loops DROP COLUMN {column}")
    db.close()
    again = open_db(path)
    try:
        assert column_names(again, "loops")[-2:] == ["expires_after_runs", "success_streak"]
    finally:
        again.close()


@pytest.mark.parametrize(("extra", "message"), [
    ({"expiresAfterRuns": 0}, "expiresAfterRuns must be a positive integer, got 0"),
    ({"expiresAfterRuns": 2}, None),
    ({"pauseAfterFailures": 0}, None),
    ({"pauseAfterFailures": -1}, "pauseAfterFailures must be an integer >= 0, got -1"),
    ({"idleTimeoutMs": None}, None),
])
def test_the_mcp_create_tools_take_expires_after_runs_a_zero_breaker_and_a_null_idle_timeout(
        extra: dict[str, Any], message: str | None) -> None:
    from loopsq.mcp import server
    from loopsq.mcp.arguments import check_schema

    for tool, fields in (("loop_create_agent", {"provider": "codex", "prompt": "p"}),
                         ("loop_create_command", {"command": "true"})):
        schema = server.TOOLS_BY_NAME[tool].schema
        arguments = {"name": "x", "schedule": EVERY_MIN, **fields,
                     **extra}
        if message is None:
            check_schema(schema, arguments)
            continue
        with pytest.raises(ValidationError) as refused:
            check_schema(schema, arguments)
        assert refused.value.message == message
