"""Tests of account routing (§6) against a fake ``accounts`` CLI: parsing, profile directories, exact messages."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from loopsq.errors import ExecutionError
from loopsq.executor import RunMetadata, build_spec, execute_target, preflight_target, resolve_account_env
from loopsq.executor.accounts import PROFILE_DIR_VARS, parse_export_value, parse_exports

FAKES = Path(__file__).resolve().parents[1] / "fakes"


def install_fake(bin_dir: Path, name: str, script: str) -> Path:
    """Copy a fake from tests/fakes into ``bin_dir`` under ``name``, runnable by this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!{sys.executable} -S\n" + (FAKES / script).read_text())
    path.chmod(0o755)
    return path


@pytest.fixture
def profile_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "profiles" / "work"
    directory.mkdir(parents=True)
    return directory


@pytest.fixture
def accounts_env(tmp_path: Path) -> dict[str, str]:
    """An env whose PATH holds the fake ``accounts`` (plus /bin for the fake providers' needs)."""
    bin_dir = tmp_path / "bin"
    install_fake(bin_dir, "accounts", "fake_accounts.py")
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_ACCOUNTS_LOG": str(tmp_path / "accounts.log")}


def logged_calls(env: dict[str, str]) -> list[list[str]]:
    return [json.loads(line) for line in Path(env["FAKE_ACCOUNTS_LOG"]).read_text().splitlines()]


def resolve_error(account: dict[str, Any], hint: str | None, env: dict[str, str]) -> str:
    with pytest.raises(ExecutionError) as info:
        resolve_account_env(account, hint, env)
    return info.value.message


def test_success_returns_every_export_plus_the_loops_account_variables(
    accounts_env: dict[str, str], profile_dir: Path
) -> None:
    accounts_env["FAKE_ACCOUNTS_STDOUT"] = (
        f'export CLAUDE_CONFIG_DIR="{profile_dir}"\n'
        "export ANTHROPIC_API_KEY='sk-1'\n"
        "  export COUNT=1  \n"
        "export FLAG=true\n"
        "# comment line\n"
        "not an export\n"
        "export RAW=plain value\n"
    )
    env = resolve_account_env({"profile": "work"}, "claude", accounts_env)
    assert env == {
        "CLAUDE_CONFIG_DIR": str(profile_dir),
        "ANTHROPIC_API_KEY": "sk-1",
        "COUNT": "1",
        "FLAG": "true",
        "RAW": "plain value",
        "LOOPS_ACCOUNT_PROFILE": "work",
        "LOOPS_ACCOUNT_TOOL": "claude",
    }
    assert logged_calls(accounts_env) == [["env", "work", "--tool", "claude"]]


def test_account_tool_wins_over_the_provider_hint(accounts_env: dict[str, str], profile_dir: Path) -> None:
    accounts_env["FAKE_ACCOUNTS_STDOUT"] = f"export CODEX_HOME={profile_dir}\n"
    env = resolve_account_env({"profile": "work", "tool": "codex"}, "claude", accounts_env)
    assert env["LOOPS_ACCOUNT_TOOL"] == "codex"
    assert logged_calls(accounts_env) == [["env", "work", "--tool", "codex"]]


@pytest.mark.parametrize(("tool", "variable"), sorted(PROFILE_DIR_VARS.items()))
def test_each_tool_reads_its_own_profile_directory_variable(
    accounts_env: dict[str, str], profile_dir: Path, tool: str, variable: str
) -> None:
    # A first export pointing nowhere proves the tool's own variable is preferred over the fallback.
    accounts_env["FAKE_ACCOUNTS_STDOUT"] = f"export OTHER=/does/not/exist\nexport {variable}={profile_dir}\n"
    assert resolve_account_env({"profile": "work", "tool": tool}, None, accounts_env)[variable] == str(
        profile_dir
    )


def test_unknown_tool_falls_back_to_the_first_export_as_profile_directory(
    accounts_env: dict[str, str], profile_dir: Path
) -> None:
    accounts_env["FAKE_ACCOUNTS_STDOUT"] = f"export GEMINI_HOME={profile_dir}\nexport OTHER=/does/not/exist\n"
    env = resolve_account_env({"profile": "work", "tool": "gemini"}, None, accounts_env)
    assert env["LOOPS_ACCOUNT_TOOL"] == "gemini"


def test_missing_tool_without_a_hint_fails_before_running_accounts(accounts_env: dict[str, str]) -> None:
    message = resolve_error({"profile": "work"}, None, accounts_env)
    assert message == "account.tool is required when no provider tool can be inferred"
    assert not Path(accounts_env["FAKE_ACCOUNTS_LOG"]).exists()


def test_nonzero_exit_reports_the_trimmed_stderr(accounts_env: dict[str, str]) -> None:
    accounts_env |= {"FAKE_ACCOUNTS_EXIT": "2", "FAKE_ACCOUNTS_STDERR": "  unknown profile work\n\n"}
    message = resolve_error({"profile": "work", "tool": "claude"}, None, accounts_env)
    assert message == "accounts env failed for work/claude: unknown profile work"


def test_nonzero_exit_without_stderr_has_no_suffix(accounts_env: dict[str, str]) -> None:
    accounts_env["FAKE_ACCOUNTS_EXIT"] = "1"
    assert resolve_error({"profile": "work"}, "codex", accounts_env) == "accounts env failed for work/codex"


def test_output_without_exports_has_no_profile_directory(accounts_env: dict[str, str]) -> None:
    accounts_env["FAKE_ACCOUNTS_STDOUT"] = "nothing to export\n"
    message = resolve_error({"profile": "work"}, "claude", accounts_env)
    assert message == "accounts env returned no profile directory for work/claude"


def test_profile_directory_that_does_not_exist_is_named(accounts_env: dict[str, str], tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    accounts_env["FAKE_ACCOUNTS_STDOUT"] = f"export CLAUDE_CONFIG_DIR={missing}\n"
    message = resolve_error({"profile": "work"}, "claude", accounts_env)
    assert message == f"account profile directory does not exist for work/claude: {missing}"


def test_accounts_missing_from_path_is_a_spawn_failure(tmp_path: Path) -> None:
    message = resolve_error({"profile": "work", "tool": "claude"}, None, {"PATH": str(tmp_path)})
    assert message.startswith("failed to run accounts env for work/claude: ")


def test_accounts_that_cannot_be_executed_is_a_spawn_failure(tmp_path: Path) -> None:
    # Executable bit set but not a valid program: exec fails with ENOEXEC.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "accounts").write_bytes(b"\x7fELF garbage")
    (bin_dir / "accounts").chmod(0o755)
    message = resolve_error({"profile": "work", "tool": "claude"}, None, {"PATH": str(bin_dir)})
    assert message.startswith("failed to run accounts env for work/claude: [Errno 8] Exec format error")


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ('"quoted"', "quoted"),
        ('"with \\"escape\\" \\u00e9"', 'with "escape" é'),
        ("'single'", "single"),
        ("1", "1"),
        ("1.50", "1.50"),
        ("true", "true"),
        ("null", "null"),
        ("[1, 2]", "[1, 2]"),
        ("bare", "bare"),
        ('"unterminated', "unterminated"),
        ("trailing'", "trailing"),
        ("'mixed\"", "mixed"),
        ("NaN", "NaN"),
        ("", ""),
    ],
)
def test_export_values_are_json_parsed_then_quote_stripped(raw: str, value: str) -> None:
    assert parse_export_value(raw) == value


def test_later_duplicate_exports_win_but_order_is_kept() -> None:
    assert parse_exports("export A=1\nexport B=2\nexport A=3\n") == [("A", "1"), ("B", "2"), ("A", "3")]


def test_export_names_must_be_identifiers() -> None:
    assert parse_exports("export 1A=x\nexport A-B=y\nexport _ok=z\nexportX=w\n") == [("_ok", "z")]


# --- accounts in spec building, preflight and execution ---


def test_agent_account_removes_inherited_auth_keys_and_overlays_the_account_env(
    accounts_env: dict[str, str], profile_dir: Path
) -> None:
    accounts_env |= {
        "FAKE_ACCOUNTS_STDOUT": f"export CLAUDE_CONFIG_DIR={profile_dir}\nexport ANTHROPIC_API_KEY=from-account\n",
        "ANTHROPIC_API_KEY": "inherited",
        "GH_TOKEN": "inherited",
        "XDG_CONFIG_HOME": "/inherited",
        "KEEP_ME": "yes",
    }
    target = {"type": "agent", "provider": "claude", "prompt": "p", "account": {"profile": "work"}}
    spec = build_spec(target, RunMetadata(run_id="r1"), env=accounts_env)
    assert spec.env["ANTHROPIC_API_KEY"] == "from-account"
    assert spec.env["CLAUDE_CONFIG_DIR"] == str(profile_dir)
    assert "GH_TOKEN" not in spec.env
    assert "XDG_CONFIG_HOME" not in spec.env
    assert spec.env["KEEP_ME"] == "yes"
    assert spec.env["LOOPS_ACCOUNT_PROFILE"] == "work"
    assert spec.env["LOOPS_ACCOUNT_TOOL"] == "claude"
    assert spec.env["LOOPS_RUN_ID"] == "r1"
    assert (spec.account_profile, spec.account_tool) == ("work", "claude")


def test_command_account_never_infers_a_tool(accounts_env: dict[str, str]) -> None:
    target = {"type": "command", "command": "true", "account": {"profile": "work"}}
    with pytest.raises(
        ExecutionError, match=r"^account.tool is required when no provider tool can be inferred$"
    ):
        build_spec(target, RunMetadata(), env=accounts_env)


def test_command_account_uses_its_own_tool(accounts_env: dict[str, str], profile_dir: Path) -> None:
    accounts_env["FAKE_ACCOUNTS_STDOUT"] = f"export CODEX_HOME={profile_dir}\n"
    target = {"type": "command", "command": "true", "account": {"profile": "work", "tool": "codex"}}
    assert build_spec(target, RunMetadata(), env=accounts_env).env["LOOPS_ACCOUNT_TOOL"] == "codex"


def test_preflight_reports_the_account_and_fails_on_a_missing_profile(
    accounts_env: dict[str, str], profile_dir: Path
) -> None:
    accounts_env["FAKE_ACCOUNTS_STDOUT"] = f"export CODEX_HOME={profile_dir}\n"
    target = {"type": "command", "command": "true", "account": {"profile": "work", "tool": "codex"}}
    assert preflight_target(target, RunMetadata(), env=accounts_env) == {
        "command": "true",
        "accountProfile": "work",
        "accountTool": "codex",
    }
    accounts_env |= {"FAKE_ACCOUNTS_EXIT": "3", "FAKE_ACCOUNTS_STDERR": "no such profile"}
    with pytest.raises(ExecutionError, match=r"^accounts env failed for work/codex: no such profile$"):
        preflight_target(target, RunMetadata(), env=accounts_env)


def test_account_failure_during_execution_is_a_failed_result_with_nothing_spawned(
    accounts_env: dict[str, str], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    accounts_env |= {"FAKE_ACCOUNTS_EXIT": "1", "FAKE_ACCOUNTS_STDERR": "locked"}
    target = {
        "type": "command",
        "command": f"touch {marker}",
        "shell": True,
        "account": {"profile": "work", "tool": "claude"},
    }
    result = execute_target(target, RunMetadata(), env=accounts_env)
    assert result.status == "failed"
    assert result.error == "accounts env failed for work/claude: locked"
    assert result.duration_ms == 0
    assert result.pid is None
    assert result.started_at == result.finished_at
    assert not marker.exists()


def test_account_env_reaches_the_executed_target(accounts_env: dict[str, str], profile_dir: Path) -> None:
    accounts_env |= {"FAKE_ACCOUNTS_STDOUT": f"export CLAUDE_CONFIG_DIR={profile_dir}\n", "GITHUB_TOKEN": "x"}
    target = {
        "type": "command",
        "command": 'echo "$CLAUDE_CONFIG_DIR|$LOOPS_ACCOUNT_PROFILE|$LOOPS_ACCOUNT_TOOL|${GITHUB_TOKEN-unset}"',
        "shell": True,
        "account": {"profile": "work", "tool": "claude"},
    }
    result = execute_target(target, RunMetadata(), env=accounts_env)
    assert result.stdout == f"{profile_dir}|work|claude|unset\n"
