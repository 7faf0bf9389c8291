"""``loopsq update`` (issue 31, point 2): a loop edited in place keeps its id, name, status and history; one
``loop_updated`` change per real edit and none for a no-op; a new schedule starts from now; bad input is one line,
exit 2, and changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.cli_helpers import Cli, make_cli

CREATE = ("create", "command", "job", "--every", "1h", "--cmd", "true")


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def bad(cli: Cli, *args: str) -> str:
    """Run a command that must be refused: exit 2, one line, nothing written; returns the message."""
    before = cli.state()
    result = cli.run(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert cli.state() == before
    return result.stderr.removeprefix("error: ").removesuffix("\n")


def changes(cli: Cli) -> list[str]:
    return [fields["type"] for _, fields in cli.redis.xrange("loopsq:changes")]


def stored(cli: Cli, loop_id: str) -> dict[str, Any]:
    return dict(json.loads(cli.redis.get(f"loopsq:loop:{loop_id}")))


def test_update_changes_the_schedule_from_now_and_keeps_id_name_and_history(cli: Cli) -> None:
    created = cli.json(*CREATE)
    cli.ok("run-now", "job", "--local")
    out = cli.ok("update", "job", "--every", "1m")
    assert out == f"updated loop {created['id']} (job) next=2026-01-01T00:01:00.000Z\n"
    loop = stored(cli, created["id"])
    assert loop["schedule"] == {"type": "interval", "everyMs": 60_000, "anchor": "fixed_rate"}
    assert (loop["id"], loop["name"], loop["status"], loop["createdAt"]) == (
        created["id"], "job", "active", created["createdAt"])
    assert [run["loopId"] for run in cli.json("runs", "job")] == [created["id"]]
    assert changes(cli).count("loop_updated") == 1
    assert cli.json("show", "job")["schedule"]["everyMs"] == 60_000  # the mirror applied the change


def test_an_update_that_changes_nothing_writes_nothing(cli: Cli) -> None:
    created = cli.json(*CREATE)
    before = cli.state()
    assert cli.ok("update", "job", "--every", "1h", "--cmd", "true") == (
        f"unchanged loop {created['id']} (job) next={created['nextRunAt']}\n")
    assert cli.state() == before
    assert "loop_updated" not in changes(cli)


def test_update_changes_target_policies_and_placement_but_not_the_status(cli: Cli) -> None:
    created = cli.json(*CREATE)
    cli.ok("pause", "job")
    cli.ok("pool", "set", "gpu", "--limit", "2")
    loop = cli.json("update", "job", "--cmd", "echo hi", "--attempts", "3", "--retry-delay", "5s",
                    "--timeout", "10s", "--env", "A=1", "--requires", "gpu", "--pool", "gpu",
                    "--budget-runs", "10/day", "--overlap", "allow", "-d", "nightly")
    assert loop["status"] == "paused"
    assert loop["nextRunAt"] == created["nextRunAt"]  # the schedule did not change
    assert (loop["maxAttempts"], loop["retryDelayMs"], loop["requires"], loop["pool"], loop["overlap"]) == (
        3, 5000, ["gpu"], "gpu", "allow")
    assert loop["budgetRuns"] == {"limit": 10, "per": "day"} and loop["description"] == "nightly"
    target = stored(cli, created["id"])["target"]
    assert (target["command"], target["timeoutMs"], target["env"]) == ("echo hi", 10_000, {"A": "1"})


def test_a_pending_next_slot_moves_to_the_new_cron_and_a_stopped_loop_keeps_none(cli: Cli) -> None:
    cli.json(*CREATE)
    loop = cli.json("update", "job", "--cron", "30 6 * * *", "--timezone", "UTC")
    assert loop["nextRunAt"] == "2026-01-01T06:30:00.000Z"
    cli.ok("stop", "job")
    assert "nextRunAt" not in cli.json("update", "job", "--every", "5m")


def test_update_refuses_bad_input_naming_the_flag_and_value(cli: Cli) -> None:
    cli.json(*CREATE)
    assert bad(cli, "update", "job") == (
        "nothing to update: give at least one flag to change, e.g. --every 5m or --cmd CMD")
    assert bad(cli, "update", "job", "--every", "0") == "--every: interval everyMs must be > 0, got '0'"
    assert bad(cli, "update", "job", "--every", "1m", "--cron", "* * * * *") == (
        "choose exactly one schedule: --at, --every, --cron, or --dynamic")
    assert bad(cli, "update", "job", "--attempts", "x") == "--attempts must be a positive integer, got 'x'"
    assert bad(cli, "update", "job", "--overlap", "never") == (
        "--overlap must be skip, allow, or replace, got 'never'")
    assert bad(cli, "update", "job", "--prompt", "hi") == (
        "--prompt applies to agent loops, not a command loop, got 'hi'")
    assert bad(cli, "update", "job", "--cmd", " ") == "--cmd must not be empty, got ' '"
    assert bad(cli, "update", "job", "--retry-max-delay", "1m") == (
        "--retry-max-delay requires --retry-backoff exponential, got '1m'")
    assert bad(cli, "update", "job", "--pool", "none") == (
        "--pool 'none' does not exist (create it with: loopsq pool set none --limit N)")
    assert bad(cli, "update", "job", "--timezone", "Mars/Base") == "--timezone: unknown timezone: Mars/Base"
    assert bad(cli, "update", "job", "--jitter", "1m", "--at", "2026-02-01T00:00:00Z") == (
        "jitterMs applies to interval and cron schedules, got a once schedule")


def test_updating_an_unknown_or_archived_loop_says_so_as_other_commands_do(cli: Cli) -> None:
    result = cli.run("update", "nope", "--every", "1m")
    assert (result.exit_code, result.stderr) == (1, "error: loop not found: nope\n")
    assert cli.run("pause", "nope").stderr == result.stderr
    cli.json(*CREATE)
    cli.ok("archive", "job")
    result = cli.run("update", "job", "--every", "1m")
    assert result.stderr == "error: loop is archived; unarchive it before updating: job\n"


def test_an_agent_loop_gets_a_new_prompt_and_model(cli: Cli) -> None:
    created = cli.json("create", "agent", "bot", "--every", "1h", "--provider", "claude", "--prompt", "old")
    cli.json("update", "bot", "--prompt", "new", "--model", "opus")
    target = stored(cli, created["id"])["target"]
    assert (target["prompt"], target["model"], target["provider"]) == ("new", "opus", "claude")
