"""Tests of target -> CommandSpec: the §4.1 agent argv table, shell lines, timeouts, env composition, PATH checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from loopsq.errors import ExecutionError, ValidationError
from loopsq.executor import (
    AUTH_ENV_KEYS,
    DEFAULT_TIMEOUT_MS,
    RunMetadata,
    agent_args,
    build_spec,
    check_executable,
    compose_env,
)

BASE_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/home/x"}
SYSTEM_DIRS = "/opt/homebrew/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
HOME_DIRS = "/home/x/.local/bin:/home/x/.bun/bin:/home/x/.cargo/bin:/home/x/.npm-global/bin:/home/x/bin"

CLAUDE_SAFE = ["--safe-mode", "--setting-sources", "local", "--no-session-persistence"]
CODEX = ["--ask-for-approval", "never", "exec", "--json", "--ephemeral", "--sandbox", "workspace-write",
         "--skip-git-repo-check"]


def agent(provider: str, **fields: Any) -> dict[str, Any]:
    return {"type": "agent", "provider": provider, "prompt": "do it", **fields}


FULL = {"model": "m1", "agent": "a1", "extraArgs": ["--x", "y z"], "cwd": "/w"}
NO_AGENT = {"model": "m1", "extraArgs": ["--x", "y z"], "cwd": "/w"}

# (provider, target fields, expected argv after the executable): 0.3.60's argv (§11.2), the prompt on argv after
# "--" (aicopilot: no separator), as a stored target without promptVia has it.
AGENT_ARGV_TABLE: list[tuple[str, dict[str, Any], list[str]]] = [
    ("claude", {}, [*CLAUDE_SAFE, "-p", "--output-format", "json", "--", "do it"]),
    ("claude", {"configIsolation": "safe"}, [*CLAUDE_SAFE, "-p", "--output-format", "json", "--", "do it"]),
    ("claude", {"configIsolation": "none"}, ["-p", "--output-format", "json", "--", "do it"]),
    ("claude", FULL, [*CLAUDE_SAFE, "-p", "--output-format", "json", "--model", "m1", "--agent", "a1", "--x", "y z",
                      "--", "do it"]),
    ("cursor", {}, ["-p", "--sandbox", "enabled", "--", "do it"]),
    ("cursor", {"configIsolation": "none", **FULL}, ["-p", "--model", "m1", "--agent", "a1", "--x", "y z", "--",
                                                     "do it"]),
    ("codewith", {}, [*CODEX, "--ignore-rules", "--", "do it"]),
    ("codewith", {"configIsolation": "none"}, [*CODEX, "--", "do it"]),
    ("codewith", {"authProfile": "p", **NO_AGENT}, ["--auth-profile", "p", *CODEX, "--ignore-rules", "--cd", "/w",
                                                    "--model", "m1", "--x", "y z", "--", "do it"]),
    ("codex", {}, [*CODEX, "--ignore-rules", "--", "do it"]),
    ("codex", {"configIsolation": "none"}, [*CODEX, "--", "do it"]),
    ("codex", NO_AGENT, [*CODEX, "--ignore-rules", "--cd", "/w", "--model", "m1", "--x", "y z", "--", "do it"]),
    ("aicopilot", {}, ["run", "--format", "json", "--pure", "do it"]),
    ("aicopilot", {"configIsolation": "none"}, ["run", "--format", "json", "do it"]),
    ("aicopilot", FULL, ["run", "--format", "json", "--pure", "--dir", "/w", "--model", "m1", "--agent", "a1", "--x",
                         "y z", "do it"]),
    ("opencode", {"model": "m"}, ["run", "--format", "json", "--pure", "--model", "m", "--", "do it"]),
    ("opencode", {"configIsolation": "none", "model": "m"}, ["run", "--format", "json", "--model", "m", "--",
                                                            "do it"]),
    ("opencode", {"configIsolation": "none", **FULL}, ["run", "--format", "json", "--dir", "/w", "--model", "m1",
                                                       "--agent", "a1", "--x", "y z", "--", "do it"]),
]


@pytest.mark.parametrize(("provider", "fields", "expected"), AGENT_ARGV_TABLE)
def test_agent_args_follow_the_0360_argv_with_the_prompt_last(
    provider: str, fields: dict[str, Any], expected: list[str]
) -> None:
    assert agent_args(agent(provider, **fields)) == expected


@pytest.mark.parametrize("provider", ["claude", "cursor", "aicopilot", "opencode", "codex", "codewith"])
def test_prompt_via_stdin_leaves_the_prompt_and_the_separator_out_of_argv_and_puts_it_on_stdin(provider: str) -> None:
    target = agent(provider, promptVia="stdin", model="m")
    argv_target = agent(provider, promptVia="argv", model="m")
    dropped = 1 if provider == "aicopilot" else 2  # the prompt, and "--" where there is one
    assert agent_args(target) == agent_args(argv_target)[:-dropped]
    spec = build_spec(target, RunMetadata(), env=BASE_ENV)
    assert spec.stdin_text == "do it"
    assert "do it" not in spec.argv
    assert build_spec(argv_target, RunMetadata(), env=BASE_ENV).stdin_text is None


def test_codewith_is_one_exec_process_judged_by_its_events() -> None:
    spec = build_spec(agent("codewith", promptVia="stdin"), RunMetadata(run_id="r", attempt=2), env=BASE_ENV)
    assert spec.stdin_text == "do it"
    assert spec.argv == ("codewith", *CODEX, "--ignore-rules")
    assert spec.codewith_exec
    assert not build_spec(agent("codex"), RunMetadata(), env=BASE_ENV).codewith_exec


def test_empty_model_and_agent_are_omitted_as_the_reference_does() -> None:
    assert agent_args(agent("cursor", model="", agent="", extraArgs=[])) == ["-p", "--sandbox", "enabled", "--",
                                                                             "do it"]


def test_agent_spec_uses_the_provider_executable_and_passes_cwd_as_spawn_cwd() -> None:
    spec = build_spec(agent("cursor", cwd="/w"), RunMetadata(), env=BASE_ENV)
    assert spec.command == "agent"
    assert spec.argv == ("agent", "-p", "--sandbox", "enabled", "--", "do it")
    assert spec.cwd == "/w"
    spec = build_spec(agent("codex", cwd="/w"), RunMetadata(), env=BASE_ENV)
    assert spec.cwd == "/w"
    assert spec.argv[spec.argv.index("--cd") + 1] == "/w"


def test_unknown_provider_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="unknown agent provider: 'gpt'"):
        build_spec(agent("gpt"), RunMetadata(), env=BASE_ENV)
    with pytest.raises(ValidationError):
        agent_args(agent("gpt"))


def test_workflow_target_cannot_be_built_as_a_process() -> None:
    with pytest.raises(ValidationError, match="'workflow'"):
        build_spec({"type": "workflow", "workflowId": "w"}, RunMetadata(), env=BASE_ENV)


def test_command_spec_defaults_to_argv_without_shell_and_thirty_minutes_timeout() -> None:
    spec = build_spec(
        {"type": "command", "command": "echo", "args": ["a", "b c"]}, RunMetadata(), env=BASE_ENV
    )
    assert spec.argv == ("echo", "a", "b c")
    assert not spec.shell
    assert spec.timeout_ms == DEFAULT_TIMEOUT_MS == 1_800_000
    assert spec.idle_timeout_ms is None
    assert spec.stdin_text is None
    assert spec.cwd is None


def test_agent_spec_defaults_to_thirty_minutes_timeout_too() -> None:
    assert build_spec(agent("claude"), RunMetadata(), env=BASE_ENV).timeout_ms == 1_800_000


def test_explicit_null_timeout_means_no_timeout() -> None:
    spec = build_spec({"type": "command", "command": "true", "timeoutMs": None}, RunMetadata(), env=BASE_ENV)
    assert spec.timeout_ms is None
    spec = build_spec(agent("claude", timeoutMs=None, idleTimeoutMs=500), RunMetadata(), env=BASE_ENV)
    assert spec.timeout_ms is None
    assert spec.idle_timeout_ms == 500


def test_shell_command_runs_through_sh_with_args_joined_by_spaces() -> None:
    target = {"type": "command", "command": "echo", "args": ["a", "$HOME"], "shell": True}
    spec = build_spec(target, RunMetadata(), env=BASE_ENV)
    assert spec.argv == ("/bin/sh", "-c", "echo a $HOME")
    spec = build_spec({"type": "command", "command": "ls | wc", "shell": True}, RunMetadata(), env=BASE_ENV)
    assert spec.argv == ("/bin/sh", "-c", "ls | wc")


def test_metadata_sets_only_truthy_loops_variables() -> None:
    metadata = RunMetadata(
        loop_id="l1",
        loop_name="nightly",
        run_id="r1",
        scheduled_for="2026-01-01T00:00:00.000Z",
        workflow_id="w1",
        workflow_name="wf",
        workflow_run_id="wr1",
        workflow_step_id="",
    )
    env = compose_env({"HOME": "/h"}, metadata)
    assert env == {
        "HOME": "/h",
        "PATH": "/h/.local/bin:/h/.bun/bin:/h/.cargo/bin:/h/.npm-global/bin:/h/bin:" + SYSTEM_DIRS,
        "LOOPS_LOOP_ID": "l1",
        "LOOPS_LOOP_NAME": "nightly",
        "LOOPS_RUN_ID": "r1",
        "LOOPS_SCHEDULED_FOR": "2026-01-01T00:00:00.000Z",
        "LOOPS_WORKFLOW_ID": "w1",
        "LOOPS_WORKFLOW_NAME": "wf",
        "LOOPS_WORKFLOW_RUN_ID": "wr1",
    }


def test_command_env_overlays_the_base_and_metadata_overlays_both() -> None:
    target = {
        "type": "command",
        "command": "true",
        "env": {"HOME": "/other", "LOOPS_RUN_ID": "fake", "A": "1"},
    }
    spec = build_spec(target, RunMetadata(run_id="r9"), env=BASE_ENV)
    assert spec.env["HOME"] == "/other"
    assert spec.env["A"] == "1"
    # The PATH is normalised with the target's own HOME (its env overlays the base first).
    assert spec.env["PATH"] == ("/usr/bin:/bin:/other/.local/bin:/other/.bun/bin:/other/.cargo/bin:"
                                "/other/.npm-global/bin:/other/bin:/opt/homebrew/bin:/usr/local/bin:/usr/sbin:/sbin")
    assert spec.env["LOOPS_RUN_ID"] == "r9"


def test_agent_targets_get_their_own_env_too_a_loopsq_addition() -> None:
    spec = build_spec(agent("claude", env={"A": "1", "ANTHROPIC_API_KEY": "k"}), RunMetadata(), env=BASE_ENV)
    assert (spec.env["A"], spec.env["ANTHROPIC_API_KEY"]) == ("1", "k")


def test_env_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOME_USER_MARKER", "yes")
    assert build_spec({"type": "command", "command": "true"}, RunMetadata()).env["SOME_USER_MARKER"] == "yes"


SECRETS = {
    "LOOPSQ_REDIS_URL": "redis://:pw@127.0.0.1:7000/0",
    "REDIS_URL": "rediss://:pw@db.example:6380/0",
    "LOOPSQ_API_TOKEN": "t" * 32,
    "LOOPSQ_DATA_DIR": "/srv/loopsq",
    "LOOPSQ_FAULT": "after_claim",
    "LOOPSQ_TEST_FAULTS": "1",
}


@pytest.mark.parametrize("source", ["os.environ", "explicit"])
def test_targets_never_inherit_loopsq_s_own_variables(monkeypatch: pytest.MonkeyPatch, source: str) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KEEP_ME", "1")
    base = None if source == "os.environ" else {**SECRETS, "KEEP_ME": "1", "PATH": "/usr/bin:/bin"}
    for target in ({"type": "command", "command": "true"}, agent("claude")):
        spec = build_spec(target, RunMetadata(run_id="r1"), env=base)
        assert not set(SECRETS) & set(spec.env), sorted(spec.env)
        assert (spec.env["KEEP_ME"], spec.env["LOOPS_RUN_ID"]) == ("1", "r1")


def test_a_loop_passes_one_of_loopsq_s_variables_only_through_its_own_env() -> None:
    target = {"type": "command", "command": "true", "env": {"REDIS_URL": "redis://mine:6379/1"}}
    spec = build_spec(target, RunMetadata(), env={**SECRETS, "PATH": "/bin"})
    assert spec.env["REDIS_URL"] == "redis://mine:6379/1"
    assert "LOOPSQ_REDIS_URL" not in spec.env and "LOOPSQ_API_TOKEN" not in spec.env


def test_auth_keys_are_removed_only_when_an_account_env_is_overlaid() -> None:
    base = {key: "inherited" for key in AUTH_ENV_KEYS} | {"KEEP": "1", "HOME": "/h", "PATH": "/bin"}
    path = "/bin:/h/.local/bin:/h/.bun/bin:/h/.cargo/bin:/h/.npm-global/bin:/h/bin:" + SYSTEM_DIRS.replace(":/bin", "")
    assert compose_env(base, RunMetadata()) == base | {"PATH": path}
    env = compose_env(
        base, RunMetadata(), account_env={"CLAUDE_CONFIG_DIR": "/p", "LOOPS_ACCOUNT_PROFILE": "p"}
    )
    assert env == {"KEEP": "1", "HOME": "/h", "PATH": path, "CLAUDE_CONFIG_DIR": "/p", "LOOPS_ACCOUNT_PROFILE": "p"}


def test_auth_keys_are_the_reference_list() -> None:
    assert AUTH_ENV_KEYS == (
        "CLAUDE_CONFIG_DIR",
        "CODEWITH_HOME",
        "CODEX_HOME",
        "CURSOR_CONFIG_DIR",
        "OPENCODE_CONFIG_DIR",
        "AICOPILOT_CONFIG_DIR",
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "OPENROUTER_API_KEY",
        "GITHUB_TOKEN",
        "GH_TOKEN",
        "XDG_CONFIG_HOME",
        "XDG_DATA_HOME",
        "XDG_STATE_HOME",
        "XDG_CACHE_HOME",
    )


def _tool(directory: Path, name: str) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_executable_is_looked_up_on_the_composed_env_path(tmp_path: Path) -> None:
    _tool(tmp_path, "mytool")
    target = {"type": "command", "command": "mytool"}
    spec = build_spec(target, RunMetadata(), env={"PATH": f"/nonexistent:{tmp_path}"})
    assert check_executable(spec) == str(tmp_path / "mytool")
    spec = build_spec(target, RunMetadata(), env={"PATH": "/usr/bin:/bin", "HOME": "/home/x"})
    with pytest.raises(ExecutionError) as info:
        check_executable(spec)
    assert info.value.message == ("Executable not found in PATH: mytool. Effective PATH=/usr/bin:/bin:"
                                  f"{HOME_DIRS}:/opt/homebrew/bin:/usr/local/bin:/usr/sbin:/sbin")


def test_target_env_path_counts_for_the_executable_check(tmp_path: Path) -> None:
    _tool(tmp_path, "mytool")
    target = {"type": "command", "command": "mytool", "env": {"PATH": str(tmp_path)}}
    assert check_executable(build_spec(target, RunMetadata(), env={"PATH": "/bin"})) is not None


def test_non_executable_file_on_path_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("data")
    spec = build_spec({"type": "command", "command": "plain"}, RunMetadata(), env={"PATH": str(tmp_path)})
    with pytest.raises(ExecutionError, match=r"^Executable not found in PATH: plain\. Effective PATH="):
        check_executable(spec)


def test_command_with_a_slash_must_exist_relative_to_the_target_cwd(tmp_path: Path) -> None:
    _tool(tmp_path, "run.sh")
    target = {"type": "command", "command": "./run.sh", "cwd": str(tmp_path)}
    assert check_executable(build_spec(target, RunMetadata(), env=BASE_ENV)) == "./run.sh"
    absolute = {"type": "command", "command": str(tmp_path / "run.sh")}
    assert check_executable(build_spec(absolute, RunMetadata(), env=BASE_ENV)) == str(tmp_path / "run.sh")
    missing = {"type": "command", "command": "./nope.sh", "cwd": str(tmp_path)}
    with pytest.raises(ExecutionError, match=r"^Executable not found in PATH: \./nope\.sh\. Effective PATH=/usr/bin:"):
        check_executable(build_spec(missing, RunMetadata(), env=BASE_ENV))


def test_shell_commands_skip_the_executable_check() -> None:
    spec = build_spec(
        {"type": "command", "command": "no-such-cmd", "shell": True}, RunMetadata(), env=BASE_ENV
    )
    assert check_executable(spec) is None


def test_missing_agent_executable_is_reported_by_its_executable_name() -> None:
    spec = build_spec(agent("cursor"), RunMetadata(), env={"PATH": os.devnull})
    with pytest.raises(ExecutionError, match=r"^Executable not found in PATH: agent\. Effective PATH="):
        check_executable(spec)
