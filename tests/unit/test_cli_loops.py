"""The definition commands: create, list, show, pause, resume, stop, remove; human and JSON output."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from tests.unit.cli_helpers import Cli, make_cli

ID = r"[0-9a-f]{12}"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def test_create_command_prints_the_loop_and_its_next_run_ten_seconds_out(cli: Cli) -> None:
    out = cli.ok("create", "command", "hello", "--every", "10s", "--cmd", "echo hi")
    assert re.fullmatch(rf"created loop {ID} \(hello\) next=2026-01-01T00:00:10\.000Z\n", out)


def test_list_shows_id_status_next_run_and_name(cli: Cli) -> None:
    cli.ok("create", "command", "hello", "--every", "10s", "--cmd", "echo hi")
    out = cli.ok("list")
    assert re.fullmatch(rf"{ID}  active   next=2026-01-01T00:00:10\.000Z  hello\n", out)


def test_json_is_accepted_before_and_after_the_subcommand(cli: Cli) -> None:
    cli.ok("create", "command", "hello", "--every", "10s", "--cmd", "echo hi")
    before = cli.json("list")
    after = json.loads(cli.ok("list", "--json"))
    assert before == after
    assert before[0]["name"] == "hello"
    assert before[0]["schedule"] == {"type": "interval", "everyMs": 10000, "anchor": "fixed_rate"}


def test_created_loop_has_the_reference_defaults_in_camel_case(cli: Cli) -> None:
    loop = cli.json("create", "command", "hello", "--every", "10s", "--cmd", "echo hi")
    assert loop["status"] == "active"
    assert loop["catchUp"] == "latest"
    assert loop["catchUpLimit"] == 50
    assert loop["overlap"] == "skip"
    assert loop["maxAttempts"] == 1
    assert loop["retryDelayMs"] == 60000
    assert loop["leaseMs"] == 1800000
    assert loop["timezone"] == "UTC"
    # The timeout it was created with is stored: a later default would not change this loop.
    assert loop["target"] == {"type": "command", "command": "echo hi", "shell": True, "timeoutMs": 1800000}
    assert loop["createdAt"] == loop["updatedAt"] == "2026-01-01T00:00:00.000Z"
    assert "retryScheduledFor" not in loop and "expiresAt" not in loop


def test_show_finds_a_loop_by_name_or_id_and_redacts_the_prompt(cli: Cli) -> None:
    prompt = "p" * 100
    loop = cli.json("create", "agent", "bot", "--every", "1h", "--provider", "claude", "--prompt", prompt)
    by_name = cli.json("show", "bot")
    by_id = cli.json("show", loop["id"])
    assert by_name == by_id
    assert by_name["target"]["prompt"] == "p" * 80 + "... [redacted 20 chars]"


def test_show_of_an_unknown_loop_is_not_found_with_exit_status_1(cli: Cli) -> None:
    result = cli.run("show", "nope")
    assert result.exit_code == 1
    assert result.stderr == "error: loop not found: nope\n"
    assert result.stdout == ""


def test_pause_resume_stop_print_id_and_status(cli: Cli) -> None:
    loop = cli.json("create", "command", "hello", "--every", "10s", "--cmd", "echo hi")
    assert cli.ok("pause", "hello") == f"{loop['id']} paused\n"
    assert cli.json("show", "hello")["nextRunAt"] == "2026-01-01T00:00:10.000Z"
    assert cli.ok("resume", "hello") == f"{loop['id']} active\n"
    assert cli.ok("stop", "hello") == f"{loop['id']} stopped\n"
    assert "nextRunAt" not in cli.json("show", "hello")


def test_resume_after_stop_schedules_the_next_slot_again(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import UTC, datetime

    cli.ok("create", "command", "hello", "--every", "10s", "--cmd", "echo hi")
    cli.ok("stop", "hello")
    monkeypatch.setattr("loopsq.domain.timeutil.now", lambda: datetime(2026, 1, 1, 1, 0, 0, tzinfo=UTC))
    resumed = cli.json("resume", "hello")
    assert resumed["status"] == "active"
    assert resumed["nextRunAt"] == "2026-01-01T01:00:10.000Z"


def test_remove_deletes_the_definition(cli: Cli) -> None:
    cli.ok("create", "command", "hello", "--every", "10s", "--cmd", "echo hi")
    assert cli.ok("rm", "hello") == "removed\n"
    assert cli.ok("list") == ""
    result = cli.run("remove", "hello")
    assert (result.exit_code, result.stderr) == (1, "error: loop not found: hello\n")


def test_list_filters_by_status(cli: Cli) -> None:
    cli.ok("create", "command", "a", "--every", "10s", "--cmd", "true")
    cli.ok("create", "command", "b", "--every", "20s", "--cmd", "true")
    cli.ok("pause", "b")
    assert [loop["name"] for loop in cli.json("list", "--status", "paused")] == ["b"]
    assert [loop["name"] for loop in cli.json("list")] == ["a", "b"]


def test_agent_loop_stores_the_provider_options(cli: Cli) -> None:
    loop = cli.json(
        "create", "agent", "bot", "--cron", "0 9 * * MON-FRI", "--timezone", "Europe/Berlin",
        "--provider", "codex", "--prompt", "review", "--model", "m1", "--cwd", "/repo",
        "--extra-arg", "--x", "--prompt-via", "stdin", "--account", "work",
    )
    assert loop["target"] == {
        "type": "agent", "provider": "codex", "prompt": "review", "cwd": "/repo", "model": "m1",
        "extraArgs": ["--x"], "configIsolation": "safe", "promptVia": "stdin", "account": {"profile": "work"},
        "timeoutMs": None, "idleTimeoutMs": 1_800_000,
    }
    assert loop["schedule"] == {"type": "cron", "expression": "0 9 * * MON-FRI"}
    assert loop["timezone"] == "Europe/Berlin"
    assert loop["nextRunAt"] == "2026-01-01T08:00:00.000Z"


def test_once_schedule_with_a_bare_time_is_read_in_the_loop_timezone(cli: Cli) -> None:
    loop = cli.json("create", "command", "x", "--at", "2026-06-01T09:30", "--timezone", "America/New_York",
                    "--cmd", "true")
    assert loop["schedule"] == {"type": "once", "at": "2026-06-01T13:30:00.000Z"}
    assert loop["nextRunAt"] == "2026-06-01T13:30:00.000Z"


def test_the_data_dir_is_0700_and_the_database_0600(cli: Cli) -> None:
    cli.ok("create", "command", "hello", "--every", "10s", "--cmd", "echo hi")
    cli.ok("list")
    assert stat.S_IMODE(os.stat(cli.data_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cli.data_dir / "loops.db").st_mode) == 0o600


def test_version_prints_the_package_version(cli: Cli) -> None:
    from loopsq import __version__

    assert cli.ok("--version") == f"{__version__}\n"


def test_env_flags_set_the_target_s_env_which_show_redacts(cli: Cli) -> None:
    cli.ok("create", "command", "c", "--every", "1m", "--cmd", "env", "--env", "A=1", "--env", "TOKEN=s=e=cret",
           "--env", "EMPTY=")
    cli.ok("create", "agent", "a", "--every", "1m", "--provider", "claude", "--prompt", "hi", "--env",
           "ANTHROPIC_API_KEY=k")
    stored = {json.loads(cli.redis.get(k))["name"]: json.loads(cli.redis.get(k)) for k in cli.redis.keys("loopsq:loop:*")
              if cli.redis.type(k) == "string"}
    assert stored["c"]["target"]["env"] == {"A": "1", "TOKEN": "s=e=cret", "EMPTY": ""}
    assert stored["a"]["target"]["env"] == {"ANTHROPIC_API_KEY": "k"}
    assert cli.json("show", "c")["target"]["env"] == "[redacted]"
    assert cli.json("show", "a")["target"]["env"] == "[redacted]"
