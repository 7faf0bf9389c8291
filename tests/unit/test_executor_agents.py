"""Agent targets run against fake provider executables that record argv, cwd, env and stdin (§4.1, 0.3.3)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from loopsq.executor import PROVIDER_EXECUTABLES, RunMetadata, execute_target, preflight_target
from loopsq.executor.spec import agent_args

FAKES = Path(__file__).resolve().parents[1] / "fakes"
PROVIDERS = sorted(PROVIDER_EXECUTABLES)

CLAUDE_SAFE = ["--safe-mode", "--setting-sources", "local", "--no-session-persistence"]
CODE_EXEC = ["exec", "--json", "--ephemeral", "--ask-for-approval", "never", "--sandbox", "workspace-write"]


def install_fake(bin_dir: Path, name: str, script: str) -> Path:
    """Copy a fake from tests/fakes into ``bin_dir`` under ``name``, runnable by this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!{sys.executable} -S\n" + (FAKES / script).read_text())
    path.chmod(0o755)
    return path


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    """An env with every provider executable faked in a bin dir first on PATH, recording into tmp_path/rec."""
    bin_dir = tmp_path / "bin"
    for executable in PROVIDER_EXECUTABLES.values():
        install_fake(bin_dir, executable, "fake_provider.py")
    install_fake(bin_dir, "accounts", "fake_accounts.py")
    record_dir = tmp_path / "rec"
    record_dir.mkdir()
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_RECORD_DIR": str(record_dir), "HOME": str(tmp_path)}


def run_agent(env: dict[str, str], provider: str, **fields: Any) -> dict[str, Any]:
    target = {"type": "agent", "provider": provider, "prompt": "fix the bug", **fields}
    result = execute_target(target, RunMetadata(loop_id="l1", run_id="r1"), env=env)
    assert result.status == "succeeded", result
    record_file = Path(env["FAKE_RECORD_DIR"]) / f"{PROVIDER_EXECUTABLES[provider]}.json"
    record: dict[str, Any] = json.loads(record_file.read_text())
    return record


EXPECTED_SAFE_MINIMAL = {
    "claude": [*CLAUDE_SAFE, "-p", "--output-format", "json", "fix the bug"],
    "cursor": ["-p", "fix the bug"],
    "codewith": [*CODE_EXEC, "--ignore-rules", "fix the bug"],
    "codex": [*CODE_EXEC, "--ignore-rules", "fix the bug"],
    "aicopilot": ["run", "--format", "json", "--pure", "fix the bug"],
    "opencode": ["run", "--format", "json", "--pure", "fix the bug"],
}


def expected_none_full(provider: str, cwd: str) -> list[str]:
    tail = ["--model", "m-1", "--agent", "reviewer", "--verbose", "two words", "fix the bug"]
    return {
        "claude": ["-p", "--output-format", "json", *tail],
        "cursor": ["-p", *tail],
        "codewith": [*CODE_EXEC, "--cd", cwd, *tail],
        "codex": [*CODE_EXEC, "--cd", cwd, "--model", "m-1", "--verbose", "two words", "fix the bug"],
        "aicopilot": ["run", "--format", "json", "--dir", cwd, *tail],
        "opencode": ["run", "--format", "json", "--dir", cwd, *tail],
    }[provider]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_provider_receives_the_exact_safe_argv_with_stdin_from_dev_null(
    fake_env: dict[str, str], provider: str
) -> None:
    record = run_agent(fake_env, provider)
    assert record["argv"] == EXPECTED_SAFE_MINIMAL[provider]
    assert record["stdinPath"] == "/dev/null"
    assert record["stdin"] == ""


@pytest.mark.parametrize("provider", PROVIDERS)
def test_provider_receives_model_agent_extra_args_and_cwd_without_isolation(
    fake_env: dict[str, str], provider: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "repo"
    workdir.mkdir()
    record = run_agent(
        fake_env,
        provider,
        configIsolation="none",
        model="m-1",
        agent="reviewer",
        extraArgs=["--verbose", "two words"],
        cwd=str(workdir),
    )
    assert record["argv"] == expected_none_full(provider, str(workdir))
    assert record["cwd"] == str(workdir)  # the spawn cwd as well as the --cd/--dir flag


@pytest.mark.parametrize("provider", PROVIDERS)
def test_prompt_via_stdin_reaches_stdin_and_not_argv(fake_env: dict[str, str], provider: str) -> None:
    record = run_agent(fake_env, provider, promptVia="stdin")
    assert record["argv"] == EXPECTED_SAFE_MINIMAL[provider][:-1]
    assert record["stdin"] == "fix the bug"
    assert record["stdinPath"].startswith("pipe:")


def test_large_prompt_via_stdin_is_written_whole_while_output_is_read(fake_env: dict[str, str]) -> None:
    prompt = "é" * 600_000 + "end"  # 1.2 MB: far beyond a pipe buffer
    record = run_agent(fake_env, "claude", promptVia="stdin", prompt=prompt)
    assert record["stdin"] == prompt


def test_provider_that_never_reads_its_stdin_prompt_still_succeeds(fake_env: dict[str, str]) -> None:
    fake_env["FAKE_SKIP_STDIN"] = "1"
    record = run_agent(fake_env, "codex", promptVia="stdin", prompt="x" * 2_000_000)
    assert record["stdin"] == ""


def test_empty_prompt_via_stdin_gives_immediate_eof(fake_env: dict[str, str]) -> None:
    assert run_agent(fake_env, "opencode", promptVia="stdin", prompt="")["stdin"] == ""


def test_agent_env_carries_run_metadata(fake_env: dict[str, str]) -> None:
    env = run_agent(fake_env, "cursor")["env"]
    assert env["LOOPS_LOOP_ID"] == "l1"
    assert env["LOOPS_RUN_ID"] == "r1"
    assert "LOOPS_LOOP_NAME" not in env


def test_agent_account_tool_defaults_to_the_provider(fake_env: dict[str, str], tmp_path: Path) -> None:
    profile = tmp_path / "codex-home"
    profile.mkdir()
    fake_env |= {"FAKE_ACCOUNTS_STDOUT": f'export CODEX_HOME="{profile}"\n', "OPENAI_API_KEY": "inherited"}
    env = run_agent(fake_env, "codex", account={"profile": "team"})["env"]
    assert env["CODEX_HOME"] == str(profile)
    assert env["LOOPS_ACCOUNT_PROFILE"] == "team"
    assert env["LOOPS_ACCOUNT_TOOL"] == "codex"
    assert "OPENAI_API_KEY" not in env


def test_provider_exit_code_is_reported(fake_env: dict[str, str]) -> None:
    fake_env |= {"FAKE_EXIT": "4", "FAKE_STDOUT": '{"ok":false}'}
    result = execute_target(
        {"type": "agent", "provider": "claude", "prompt": "p"}, RunMetadata(), env=fake_env
    )
    assert (result.status, result.exit_code, result.error) == ("failed", 4, "process exited with code 4")
    assert result.stdout == '{"ok":false}'


def test_missing_provider_executable_fails_without_spawning(tmp_path: Path) -> None:
    result = execute_target(
        {"type": "agent", "provider": "cursor", "prompt": "p"}, RunMetadata(), env={"PATH": str(tmp_path)}
    )
    assert result.to_dict() == {
        "status": "failed",
        "stdout": "",
        "stderr": "",
        "error": "Executable not found in PATH: cursor-agent",
        "startedAt": result.started_at,
        "finishedAt": result.started_at,
        "durationMs": 0,
    }


def test_preflight_of_an_agent_names_its_executable(fake_env: dict[str, str]) -> None:
    target = {"type": "agent", "provider": "cursor", "prompt": "p"}
    assert preflight_target(target, RunMetadata(), env=fake_env) == {"command": "cursor-agent"}


def test_agent_args_is_what_the_provider_receives(fake_env: dict[str, str]) -> None:
    target = {"type": "agent", "provider": "aicopilot", "prompt": "fix the bug", "model": "m"}
    assert run_agent(fake_env, "aicopilot", model="m")["argv"] == agent_args(target)
