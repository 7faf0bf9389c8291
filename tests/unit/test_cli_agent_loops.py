"""Agent loops at the reference's later level, from the command line (issue 18): archive, unarchive (restore) and
rename; prompt files; timeouts; the agent option flags with the reference's messages; --preflight-each-run;
--no-retry. Bad input is one line, exit 2, and writes nothing."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from loopsq.system.prompt_files import PROMPT_FILE_MAX_BYTES
from tests.unit.cli_helpers import Cli, make_cli

ID = r"[0-9a-f]{12}"
AGENT = ("create", "agent", "bot", "--every", "1h", "--provider")


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


# -- archive, unarchive, rename ----------------------------------------------------------------------------------
def test_archive_pauses_an_active_loop_hides_it_and_unarchive_restores_it(cli: Cli) -> None:
    created = cli.json("create", "command", "nightly", "--every", "1h", "--cmd", "true")
    cli.ok("create", "command", "other", "--every", "1h", "--cmd", "true")
    out = cli.ok("archive", "nightly")
    assert out == f"{created['id']} archived (was active)\n"
    shown = cli.json("show", "nightly")
    assert (shown["status"], shown["archivedAt"], shown["archivedFromStatus"]) == (
        "paused", "2026-01-01T00:00:00.000Z", "active")
    assert shown["nextRunAt"] == created["nextRunAt"]
    assert [loop["name"] for loop in cli.json("list")] == ["other"]
    assert [loop["name"] for loop in cli.json("list", "--archived")] == ["nightly"]
    assert sorted(loop["name"] for loop in cli.json("list", "--all")) == ["nightly", "other"]
    assert cli.ok("list", "--archived") == (f"{created['id']}  paused   next={created['nextRunAt']}  nightly"
                                            "  [archived]\n")
    assert cli.ok("unarchive", "nightly") == f"{created['id']} active\n"
    restored = cli.json("show", "nightly")
    assert restored["status"] == "active" and "archivedAt" not in restored and "archivedFromStatus" not in restored
    assert restored["nextRunAt"] == created["nextRunAt"]


def test_restore_is_unarchive_and_a_paused_loop_comes_back_paused(cli: Cli) -> None:
    cli.ok("create", "command", "n", "--every", "1h", "--cmd", "true")
    cli.ok("pause", "n")
    assert re.fullmatch(rf"{ID} archived \(was paused\)\n", cli.ok("archive", "n"))
    assert re.fullmatch(rf"{ID} paused\n", cli.ok("restore", "n"))


def test_an_archived_loop_is_not_run_paused_resumed_or_stopped_and_says_how_to_go_on(cli: Cli) -> None:
    cli.ok("create", "command", "n", "--every", "1h", "--cmd", "true")
    cli.ok("archive", "n")
    message = "loop is archived; unarchive it before running: n"
    assert bad(cli, "run-now", "n", "--local") == message
    assert bad(cli, "trigger", "n") == message
    assert bad(cli, "resume", "n") == "loop is archived; unarchive it before resuming: n"
    assert bad(cli, "pause", "n") == "loop is archived; unarchive it before pausing: n"
    assert bad(cli, "stop", "n") == "loop is archived; unarchive it before stopping: n"
    assert bad(cli, "archive", "n") == "loop is already archived: n"
    cli.ok("unarchive", "n")
    assert bad(cli, "unarchive", "n") == "loop is not archived: n"


def test_rename_moves_the_name_and_history_follows_the_id(cli: Cli) -> None:
    created = cli.json("create", "command", "old", "--every", "1h", "--cmd", "true")
    cli.ok("run-now", "old", "--local")
    assert cli.ok("rename", "old", "new") == f"{created['id']} renamed old -> new\n"
    assert cli.json("show", "new")["id"] == created["id"]
    assert cli.run("show", "old").exit_code == 1
    assert cli.redis.hgetall("loopsq:loop-names") == {"new": created["id"]}
    runs = cli.json("runs", "new")
    assert [run["loopId"] for run in runs] == [created["id"]]  # the run made under the old name
    assert cli.ok("rename", created["id"], "new") == f"{created['id']} renamed new -> new\n"  # a no-op
    types = [f["type"] for _, f in cli.redis.xrange("loopsq:changes")]
    assert types.count("loop_renamed") == 1


def test_rename_refuses_an_empty_or_taken_name_and_changes_nothing(cli: Cli) -> None:
    cli.ok("create", "command", "a", "--every", "1h", "--cmd", "true")
    other = cli.json("create", "command", "b", "--every", "1h", "--cmd", "true")
    assert bad(cli, "rename", "a", "  ") == 'loop name must not be empty, got "  "'
    assert bad(cli, "rename", "a", "b") == "loop name already exists: b"
    assert bad(cli, "rename", "a", other["id"]) == f"loop name already exists: {other['id']}"
    assert cli.run("rename", "nope", "c").stderr == "error: loop not found: nope\n"


# -- prompt files ------------------------------------------------------------------------------------------------
def test_a_prompt_file_is_read_at_creation_and_stored_with_its_source(cli: Cli, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "review.md").write_text("Review the diff.\n")
    monkeypatch.chdir(tmp_path)
    loop = cli.json(*AGENT, "claude", "--prompt-file", "review.md")
    assert loop["target"]["promptSource"] == {"type": "file", "path": str(tmp_path / "review.md")}
    stored = json.loads(cli.redis.get(f"loopsq:loop:{loop['id']}"))
    assert stored["target"]["prompt"] == "Review the diff.\n"
    (tmp_path / "review.md").write_text("changed later")  # read once, at creation
    assert json.loads(cli.redis.get(f"loopsq:loop:{loop['id']}"))["target"]["prompt"] == "Review the diff.\n"


def test_a_missing_unreadable_empty_or_huge_prompt_file_gets_one_clear_error(cli: Cli, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert bad(cli, *AGENT, "claude", "--prompt-file", "nope.md") == (
        "--prompt-file: cannot read 'nope.md': No such file or directory")
    (tmp_path / "dir").mkdir()
    assert bad(cli, *AGENT, "claude", "--prompt-file", "dir") == "--prompt-file: cannot read 'dir': Is a directory"
    (tmp_path / "empty.md").write_text(" \n")
    assert bad(cli, *AGENT, "claude", "--prompt-file", "empty.md") == "--prompt-file: 'empty.md' is empty"
    (tmp_path / "big.md").write_bytes(b"x" * (PROMPT_FILE_MAX_BYTES + 1))
    assert bad(cli, *AGENT, "claude", "--prompt-file", "big.md") == (
        f"--prompt-file: 'big.md' is larger than {PROMPT_FILE_MAX_BYTES} bytes")
    (tmp_path / "bin.md").write_bytes(b"ok\xff")
    assert bad(cli, *AGENT, "claude", "--prompt-file", "bin.md") == "--prompt-file: 'bin.md' is not UTF-8 text (byte 2)"
    if os.geteuid() != 0:  # root reads anything
        (tmp_path / "secret.md").write_text("x")
        (tmp_path / "secret.md").chmod(0)
        assert bad(cli, *AGENT, "claude", "--prompt-file", "secret.md") == (
            "--prompt-file: cannot read 'secret.md': Permission denied")
    assert bad(cli, *AGENT, "claude", "--prompt", "x", "--prompt-file", "empty.md") == (
        "choose exactly one of --prompt or --prompt-file")
    assert bad(cli, *AGENT, "claude") == "choose exactly one of --prompt or --prompt-file"


def test_a_spec_prompt_file_resolves_against_the_spec_files_directory(cli: Cli, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    specs = tmp_path / "specs"
    (specs / "prompts").mkdir(parents=True)
    (specs / "prompts" / "review.md").write_text("Review it.")
    spec = {"name": "wf", "steps": [{"id": "review", "target": {"type": "agent", "provider": "codex",
                                                                 "promptFile": "prompts/review.md"}}]}
    (specs / "wf.json").write_text(json.dumps(spec))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    created = cli.json("workflows", "create", str(specs / "wf.json"))
    target = created["steps"][0]["target"]
    assert target["promptSource"] == {"type": "file", "path": str(specs / "prompts" / "review.md")}
    assert "promptFile" not in target
    stored = json.loads(cli.redis.get(f"loopsq:workflow:{created['id']}"))
    assert stored["steps"][0]["target"]["prompt"] == "Review it."
    spec["steps"][0]["target"]["promptFile"] = "prompts/missing.md"
    (specs / "bad.json").write_text(json.dumps(spec))
    assert bad(cli, "workflows", "validate", str(specs / "bad.json")) == (
        "workflow.steps[0].target.promptFile: cannot read 'prompts/missing.md': No such file or directory")


# -- timeouts ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("word", ["none", "unlimited", "null", "never", "off", "false", "NONE"])
def test_every_no_timeout_word_means_no_timeout(cli: Cli, word: str) -> None:
    loop = cli.json("create", "command", "c", "--every", "1h", "--cmd", "true", "--timeout", word)
    assert loop["target"]["timeoutMs"] is None
    wf = cli.json("create", "agent", "a", "--every", "1h", "--provider", "claude", "--prompt", "p", "--timeout", word)
    assert wf["target"]["timeoutMs"] is None


def test_agents_default_to_no_timeout_commands_to_thirty_minutes_and_the_value_is_stored(cli: Cli) -> None:
    agent = cli.json(*AGENT, "claude", "--prompt", "p")
    command = cli.json("create", "command", "c", "--every", "1h", "--cmd", "true")
    assert agent["target"]["timeoutMs"] is None and command["target"]["timeoutMs"] == 1_800_000
    assert cli.json(*AGENT[:2], "b2", *AGENT[3:], "claude", "--prompt", "p", "--timeout", "5m")["target"][
        "timeoutMs"] == 300_000


def test_an_agent_loop_stored_before_the_default_changed_keeps_thirty_minutes() -> None:
    from loopsq.executor import RunMetadata, build_spec

    old = {"type": "agent", "provider": "claude", "prompt": "p"}  # no timeoutMs, as stored before 0.3.55
    assert build_spec(old, RunMetadata(), env={"PATH": "/bin"}).timeout_ms == 1_800_000
    assert build_spec({**old, "timeoutMs": None}, RunMetadata(), env={"PATH": "/bin"}).timeout_ms is None


def test_idle_timeout_is_stored_none_or_zero_stores_null_and_bad_values_are_refused(cli: Cli) -> None:
    loop = cli.json(*AGENT, "claude", "--prompt", "p", "--idle-timeout", "90s")
    assert loop["target"]["idleTimeoutMs"] == 90_000
    for index, off in enumerate(("0", "none", "0s", "off")):
        loop = cli.json(*AGENT[:2], f"off{index}", *AGENT[3:], "claude", "--prompt", "p", "--idle-timeout", off)
        assert "idleTimeoutMs" in loop["target"] and loop["target"]["idleTimeoutMs"] is None
    assert bad(cli, *AGENT[:2], "x", *AGENT[3:], "claude", "--prompt", "p", "--idle-timeout", "soon") == (
        "--idle-timeout: invalid duration: soon")


# -- agent options -----------------------------------------------------------------------------------------------
def test_the_agent_option_flags_are_stored_on_the_target(cli: Cli) -> None:
    loop = cli.json(*AGENT, "codewith", "--prompt", "p", "--variant", "high", "--permission-mode", "bypass",
                    "--sandbox", "read-only", "--add-dir", "/a", "--add-dir", "/b", "--auth-profile", "work")
    assert loop["target"] == {
        "type": "agent", "provider": "codewith", "prompt": "p", "configIsolation": "safe", "promptVia": "stdin",
        "variant": "high", "permissionMode": "bypass", "sandbox": "read-only", "addDirs": ["/a", "/b"],
        "authProfile": "work", "timeoutMs": None, "idleTimeoutMs": 1_800_000,
    }
    assert cli.json(*AGENT[:2], "c", *AGENT[3:], "codex", "--prompt", "p")["target"]["promptVia"] == "stdin"


BAD_AGENT_FLAGS: list[tuple[tuple[str, ...], str]] = [
    (("claude", "--auth-profile", "work"),
     "--auth-profile is currently supported only for --provider codewith, got --provider claude"),
    (("cursor", "--variant", "high"), "--variant is not supported for --provider cursor, got --provider cursor"),
    (("cursor", "--permission-mode", "auto"), "--permission-mode auto is not supported for --provider cursor; use "
     "provider-specific extraArgs for Cursor auto-review, got 'auto'"),
    (("codex", "--permission-mode", "plan"), "--permission-mode supports only default or bypass for --provider codex, "
     "got 'plan'"),
    (("claude", "--permission-mode", "yolo"), "--permission-mode must be default, plan, auto, or bypass, got 'yolo'"),
    (("claude", "--sandbox", "read-only"), "--sandbox is not supported for --provider claude, got --provider claude"),
    (("cursor", "--sandbox", "read-only"), "--sandbox must be enabled or disabled for --provider cursor, got "
     "'read-only'"),
    (("codex", "--sandbox", "enabled"), "--sandbox must be read-only, workspace-write, or danger-full-access for "
     "--provider codex, got 'enabled'"),
    (("codex", "--sandbox", "tight"), "--sandbox must be read-only, workspace-write, danger-full-access, enabled or "
     "disabled, got 'tight'"),
    (("opencode", "--add-dir", "/a", "--model", "m"), "--add-dir is currently supported only for codewith or codex, "
     "got --provider opencode"),
    (("opencode",), "--model is required for --provider opencode; pass a provider/model id such as "
     "openrouter/google/gemini-2.5-flash, got nothing"),
    (("codex", "--agent", "reviewer"), "--agent is not supported for --provider codex, got --provider codex"),
    (("codewith", "--extra-arg", "exec"), "--extra-arg cannot include exec for --provider codewith; loopsq runs "
     "codewith exec --json --ephemeral with its own flags, got 'exec'"),
    (("aicopilot", "--prompt-via", "argv", "--prompt", "--dangerously-skip-permissions"),
     '--prompt must not begin with "-" when passed on argv to --provider aicopilot (its CLI takes no end-of-options '
     "separator); use --prompt-via stdin, got '--dangerously-skip-permissions'"),
    (("claude", "--variant", " "), "--variant must not be empty, got ' '"),
]


@pytest.mark.parametrize(("flags", "message"), BAD_AGENT_FLAGS)
def test_an_option_its_provider_does_not_take_is_refused_naming_flag_and_value(
    cli: Cli, flags: tuple[str, ...], message: str
) -> None:
    args: list[str] = [*AGENT, *flags]
    if "--prompt" not in flags:
        args += ["--prompt", "p"]
    assert bad(cli, *args) == message


def test_a_dash_prompt_is_fine_on_stdin_and_after_the_separator(cli: Cli) -> None:
    for provider in ("aicopilot", "claude"):
        loop = cli.json(*AGENT[:2], provider, *AGENT[3:], provider, "--prompt=--dangerously-skip-permissions")
        assert loop["target"]["promptVia"] == "stdin"
    argv_loop = cli.json(*AGENT[:2], "c3", *AGENT[3:], "claude", "--prompt-via", "argv",
                         "--prompt=--dangerously-skip-permissions")
    assert argv_loop["target"]["promptVia"] == "argv"


# -- preflight on every run, no retry ----------------------------------------------------------------------------
def test_preflight_each_run_is_stored_on_every_kind_of_target(cli: Cli) -> None:
    assert cli.json("create", "command", "c", "--every", "1h", "--cmd", "true", "--preflight-each-run")["target"][
        "preflight"] == {"beforeRun": True}
    assert cli.json(*AGENT, "claude", "--prompt", "p", "--preflight-each-run")["target"]["preflight"] == {
        "beforeRun": True}


def test_a_run_with_preflight_each_run_fails_with_the_runtime_message_when_its_target_went_away(
    cli: Cli, tmp_path: Path
) -> None:
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\nexit 0\n")
    tool.chmod(0o755)
    cli.ok("create", "command", "c", "--every", "1h", "--cmd", str(tool), "--no-shell", "--preflight-each-run")
    cli.ok("create", "command", "d", "--every", "1h", "--cmd", str(tool), "--no-shell")
    tool.unlink()
    out = cli.run("run-now", "c", "--local", "--json")
    assert out.exit_code == 1
    env_path = os.environ.get("PATH", "")
    from loopsq.system.exec_path import normalize_execution_path

    effective = normalize_execution_path(os.environ)
    assert env_path and json.loads(out.stdout)["error"] == (
        f"runtime preflight failed: Executable not found in PATH: {tool}. Effective PATH={effective}")
    plain = json.loads(cli.run("run-now", "d", "--local", "--json").stdout)
    assert plain["error"] == f"Executable not found in PATH: {tool}. Effective PATH={effective}"


def test_run_now_no_retry_marks_the_run_and_leaves_no_retry_pending(cli: Cli) -> None:
    cli.ok("create", "command", "f", "--every", "1h", "--cmd", "exit 3", "--attempts", "3")
    run: dict[str, Any] = json.loads(cli.run("run-now", "f", "--local", "--no-retry", "--json").stdout)
    assert (run["status"], run["noRetry"]) == ("failed", True)
    assert "retryScheduledFor" not in cli.json("show", "f")
    assert cli.json("runs", "f")[0]["noRetry"] is True  # mirrored as a boolean
    retried: dict[str, Any] = json.loads(cli.run("run-now", "f", "--local", "--json").stdout)
    assert retried["status"] == "failed" and "noRetry" not in retried
    assert cli.json("show", "f")["retryScheduledFor"] == retried["scheduledFor"]


def test_archived_loops_are_left_out_of_the_status_counts(cli: Cli) -> None:
    cli.ok("create", "command", "a", "--every", "1h", "--cmd", "true")
    cli.ok("create", "command", "b", "--every", "1h", "--cmd", "true")
    cli.ok("archive", "b")
    assert cli.json("status")["loops"] == {"active": 1}
