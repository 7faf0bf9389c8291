"""Agent targets run against fake provider executables that record argv, cwd, env and stdin: every provider x
option combination of 0.3.60 (§11.2) with its exact argv and stdin, the options a provider refuses with their
messages, the end-of-options separator before a prompt on argv (issue 15), and codewith's one-shot ``exec --json``
(OpenLoops 0.4.9): its events decide the run's outcome and usage, a durable-mode target stored before runs that way."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain.targets import validate_target
from loopsq.errors import ValidationError
from loopsq.executor import PROVIDER_EXECUTABLES, RunMetadata, execute_target, preflight_target
from loopsq.executor.spec import agent_args

FAKES = Path(__file__).resolve().parents[1] / "fakes"
PROVIDERS = sorted(PROVIDER_EXECUTABLES)
P = "fix the bug"
DASH = "--dangerously-skip-permissions"
SAFE = ["--safe-mode", "--setting-sources", "local", "--no-session-persistence"]
CLAUDE = ["-p", "--output-format", "json"]
CODEX = ["--ask-for-approval", "never", "exec", "--json", "--ephemeral"]
CODEX_TAIL = ["--skip-git-repo-check", "--ignore-rules"]
RUN = ["run", "--format", "json"]
WORKDIR = "<workdir>"  # replaced by the test's directory
META = RunMetadata(loop_id="l1", run_id="r1", attempt=1)


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
    target = {"type": "agent", "provider": provider, "prompt": P, **fields}
    result = execute_target(target, META, env=env)
    assert result.status == "succeeded", result
    record_file = Path(env["FAKE_RECORD_DIR"]) / f"{PROVIDER_EXECUTABLES[provider]}.json"
    record: dict[str, Any] = json.loads(record_file.read_text())
    return record


def calls(env: dict[str, str], executable: str) -> list[dict[str, Any]]:
    path = Path(env["FAKE_RECORD_DIR"]) / f"{executable}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# The option cases; each provider's row says what its CLI receives (argv, stdin) or why it is refused.
CASES: dict[str, dict[str, Any]] = {
    "minimal": {},
    "stdin": {"promptVia": "stdin"},
    "full-none": {"configIsolation": "none", "model": "m-1", "extraArgs": ["--verbose", "two words"],
                  "cwd": WORKDIR},
    "agent": {"agent": "reviewer"},
    "variant": {"variant": "high"},
    "permission-default": {"permissionMode": "default"},
    "permission-plan": {"permissionMode": "plan"},
    "permission-auto": {"permissionMode": "auto"},
    "permission-bypass": {"permissionMode": "bypass"},
    "sandbox-read-only": {"sandbox": "read-only"},
    "sandbox-workspace-write": {"sandbox": "workspace-write"},
    "sandbox-danger-full-access": {"sandbox": "danger-full-access"},
    "sandbox-enabled": {"sandbox": "enabled"},
    "sandbox-disabled": {"sandbox": "disabled"},
    "add-dirs": {"addDirs": ["/a", "/b c"]},
    "auth-profile": {"authProfile": "work"},
    "dash-prompt": {"prompt": DASH},
    "dash-prompt-stdin": {"prompt": DASH, "promptVia": "stdin"},
}


def refused(provider: str, field: str, reason: str, got: str | None = None) -> str:
    return f"target.{field} {reason}, got {got if got is not None else f'provider {json.dumps(provider)}'}"


def _rows(provider: str) -> dict[str, tuple[list[str], str] | str]:
    """case -> (argv, stdin) or the validation message; ``WORKDIR`` stands for the case's cwd."""
    if provider == "claude":
        return {
            "minimal": ([*SAFE, *CLAUDE, "--", P], ""),
            "stdin": ([*SAFE, *CLAUDE], P),
            "full-none": ([*CLAUDE, "--model", "m-1", "--verbose", "two words", "--", P], ""),
            "agent": ([*SAFE, *CLAUDE, "--agent", "reviewer", "--", P], ""),
            "variant": ([*SAFE, *CLAUDE, "--effort", "high", "--", P], ""),
            "permission-default": ([*SAFE, *CLAUDE, "--", P], ""),
            "permission-plan": ([*SAFE, "--permission-mode", "plan", *CLAUDE, "--", P], ""),
            "permission-auto": ([*SAFE, "--permission-mode", "auto", *CLAUDE, "--", P], ""),
            "permission-bypass": ([*SAFE, "--permission-mode", "bypassPermissions", *CLAUDE, "--", P], ""),
            **{f"sandbox-{s}": refused("claude", "sandbox", "is not supported for provider claude")
               for s in ("read-only", "workspace-write", "danger-full-access", "enabled", "disabled")},
            "add-dirs": refused("claude", "addDirs", "is currently supported only for codewith or codex"),
            "auth-profile": refused("claude", "authProfile", "is currently supported only for provider codewith"),
            "dash-prompt": ([*SAFE, *CLAUDE, "--", DASH], ""),
            "dash-prompt-stdin": ([*SAFE, *CLAUDE], DASH),
        }
    if provider == "cursor":
        on = ["--sandbox", "enabled"]
        return {
            "minimal": (["-p", *on, "--", P], ""),
            "stdin": (["-p", *on], P),
            "full-none": (["-p", "--model", "m-1", "--verbose", "two words", "--", P], ""),
            "agent": (["-p", *on, "--agent", "reviewer", "--", P], ""),
            "variant": refused("cursor", "variant", "is not supported for provider cursor"),
            "permission-default": (["-p", *on, "--", P], ""),
            "permission-plan": (["-p", "--mode", "plan", *on, "--", P], ""),
            "permission-auto": refused("cursor", "permissionMode", "auto is not supported for provider cursor; use "
                                       "provider-specific extraArgs for Cursor auto-review", '"auto"'),
            "permission-bypass": (["-p", "--force", *on, "--", P], ""),
            **{f"sandbox-{s}": refused("cursor", "sandbox", "must be enabled or disabled for provider cursor",
                                       json.dumps(s)) for s in ("read-only", "workspace-write", "danger-full-access")},
            "sandbox-enabled": (["-p", "--sandbox", "enabled", "--", P], ""),
            "sandbox-disabled": (["-p", "--sandbox", "disabled", "--", P], ""),
            "add-dirs": refused("cursor", "addDirs", "is currently supported only for codewith or codex"),
            "auth-profile": refused("cursor", "authProfile", "is currently supported only for provider codewith"),
            "dash-prompt": (["-p", *on, "--", DASH], ""),
            "dash-prompt-stdin": (["-p", *on], DASH),
        }
    if provider == "codex":
        def codex(sandbox: str = "workspace-write", *, head: tuple[str, ...] = (), tail: tuple[str, ...] = ()
                  ) -> list[str]:
            return [*head, *CODEX, "--sandbox", sandbox, *CODEX_TAIL, *tail]
        return {
            "minimal": ([*codex(), "--", P], ""),
            "stdin": (codex(), P),
            "full-none": ([*CODEX, "--sandbox", "workspace-write", "--skip-git-repo-check", "--cd", WORKDIR,
                           "--model", "m-1", "--verbose", "two words", "--", P], ""),
            "agent": refused("codex", "agent", "is not supported for provider codex"),
            "variant": ([*codex(head=("-c", 'model_reasoning_effort="high"')), "--", P], ""),
            "permission-default": ([*codex(), "--", P], ""),
            "permission-plan": refused("codex", "permissionMode", "supports only default or bypass for provider codex",
                                       '"plan"'),
            "permission-auto": refused("codex", "permissionMode", "supports only default or bypass for provider codex",
                                       '"auto"'),
            "permission-bypass": ([*codex("danger-full-access"), "--", P], ""),
            **{f"sandbox-{s}": ([*codex(s), "--", P], "") for s in ("read-only", "workspace-write",
                                                                  "danger-full-access")},
            **{f"sandbox-{s}": refused("codex", "sandbox", "must be read-only, workspace-write, or danger-full-access"
                                       " for provider codex", json.dumps(s)) for s in ("enabled", "disabled")},
            "add-dirs": ([*codex(tail=("--add-dir", "/a", "--add-dir", "/b c")), "--", P], ""),
            "auth-profile": refused("codex", "authProfile", "is currently supported only for provider codewith"),
            "dash-prompt": ([*codex(), "--", DASH], ""),
            "dash-prompt-stdin": (codex(), DASH),
        }
    if provider == "codewith":
        # codex's exec --json argv, with codewith's --auth-profile before the subcommand.
        def cw(sandbox: str = "workspace-write", *, head: tuple[str, ...] = (), tail: tuple[str, ...] = ()
               ) -> list[str]:
            return [*head, *CODEX, "--sandbox", sandbox, *CODEX_TAIL, *tail]
        return {
            "minimal": ([*cw(), "--", P], ""),
            "stdin": (cw(), P),
            "full-none": ([*CODEX, "--sandbox", "workspace-write", "--skip-git-repo-check", "--cd", WORKDIR,
                           "--model", "m-1", "--verbose", "two words", "--", P], ""),
            "agent": refused("codewith", "agent", "is not supported for provider codewith"),
            "variant": ([*cw(head=("-c", 'model_reasoning_effort="high"')), "--", P], ""),
            "permission-default": ([*cw(), "--", P], ""),
            "permission-plan": refused("codewith", "permissionMode", "supports only default or bypass for provider "
                                       "codewith", '"plan"'),
            "permission-auto": refused("codewith", "permissionMode", "supports only default or bypass for provider "
                                       "codewith", '"auto"'),
            "permission-bypass": ([*cw("danger-full-access"), "--", P], ""),
            **{f"sandbox-{s}": ([*cw(s), "--", P], "") for s in ("read-only", "workspace-write", "danger-full-access")},
            **{f"sandbox-{s}": refused("codewith", "sandbox", "must be read-only, workspace-write, or "
                                       "danger-full-access for provider codewith", json.dumps(s))
               for s in ("enabled", "disabled")},
            "add-dirs": ([*cw(tail=("--add-dir", "/a", "--add-dir", "/b c")), "--", P], ""),
            "auth-profile": ([*cw(head=("--auth-profile", "work")), "--", P], ""),
            "dash-prompt": ([*cw(), "--", DASH], ""),
            "dash-prompt-stdin": (cw(), DASH),
        }
    # opencode (which needs a model: every case carries one) and aicopilot (no separator).
    sep = ["--"] if provider == "opencode" else []
    model = ["--model", "or/m"] if provider == "opencode" else []
    rows: dict[str, tuple[list[str], str] | str] = {
        "minimal": ([*RUN, "--pure", *model, *sep, P], ""),
        "stdin": ([*RUN, "--pure", *model], P),
        "full-none": ([*RUN, "--dir", WORKDIR, "--model", "m-1", "--verbose", "two words", *sep, P], ""),
        "agent": ([*RUN, "--pure", *model, "--agent", "reviewer", *sep, P], ""),
        "variant": ([*RUN, "--pure", *model, "--variant", "high", *sep, P], ""),
        "permission-default": ([*RUN, "--pure", *model, *sep, P], ""),
        "permission-plan": refused(provider, "permissionMode", f"supports only default or bypass for provider "
                                   f"{provider}", '"plan"'),
        "permission-auto": refused(provider, "permissionMode", f"supports only default or bypass for provider "
                                   f"{provider}", '"auto"'),
        "permission-bypass": ([*RUN, "--pure", "--dangerously-skip-permissions", *model, *sep, P], ""),
        **{f"sandbox-{s}": refused(provider, "sandbox", f"is not supported for provider {provider}")
           for s in ("read-only", "workspace-write", "danger-full-access", "enabled", "disabled")},
        "add-dirs": refused(provider, "addDirs", "is currently supported only for codewith or codex"),
        "auth-profile": refused(provider, "authProfile", "is currently supported only for provider codewith"),
        "dash-prompt-stdin": ([*RUN, "--pure", *model], DASH),
    }
    rows["dash-prompt"] = ([*RUN, "--pure", *model, "--", DASH], "") if provider == "opencode" else refused(
        "aicopilot", "prompt", 'must not begin with "-" when passed on argv to provider aicopilot (its CLI takes no '
        'end-of-options separator); use promptVia "stdin"', json.dumps(DASH))
    return rows


MATRIX = [(provider, case) for provider in PROVIDERS for case in CASES]


def test_the_matrix_covers_every_provider_and_every_case() -> None:
    for provider in PROVIDERS:
        assert set(_rows(provider)) == set(CASES), provider


@pytest.mark.parametrize(("provider", "case"), MATRIX)
def test_each_provider_and_option_gives_the_0360_argv_and_stdin_or_its_refusal(
    fake_env: dict[str, str], tmp_path: Path, provider: str, case: str
) -> None:
    fields = dict(CASES[case])
    if provider == "opencode":
        fields.setdefault("model", "or/m")
    workdir = tmp_path / "repo"
    workdir.mkdir()
    if fields.get("cwd") == WORKDIR:
        fields["cwd"] = str(workdir)
    target = {"type": "agent", "provider": provider, "prompt": P, **fields}
    expected = _rows(provider)[case]
    if isinstance(expected, str):
        with pytest.raises(ValidationError) as info:
            validate_target(target)
        assert info.value.message == expected
        return
    validate_target(target)  # a valid target, as stored
    argv, stdin = expected
    result = execute_target(target, META, env=fake_env)
    assert result.status == "succeeded", result
    record = json.loads((Path(fake_env["FAKE_RECORD_DIR"]) / f"{PROVIDER_EXECUTABLES[provider]}.json").read_text())
    assert record["argv"] == [str(workdir) if arg == WORKDIR else arg for arg in argv]
    assert record["stdin"] == stdin
    if stdin:
        assert record["stdinPath"].startswith("pipe:")
    else:
        assert record["stdinPath"] == "/dev/null"
    if "cwd" in fields:
        assert record["cwd"] == str(workdir)  # the spawn cwd as well as the --cd/--dir flag


def test_the_matrix_is_what_agent_args_builds() -> None:
    target = {"type": "agent", "provider": "aicopilot", "prompt": P, "model": "m"}
    assert agent_args(target) == [*RUN, "--pure", "--model", "m", P]


def test_a_prompt_that_looks_like_an_option_stays_a_prompt_after_the_separator(fake_env: dict[str, str]) -> None:
    """Issue 15: ``--prompt '--dangerously-skip-permissions'`` never reaches a CLI as a bare flag."""
    for provider in ("claude", "cursor", "codex", "opencode"):
        extra = {"model": "or/m"} if provider == "opencode" else {}
        argv = run_agent(fake_env, provider, prompt=DASH, **extra)["argv"]
        assert argv[-2:] == ["--", DASH], provider
        assert argv.count(DASH) == 1


def test_aicopilot_refuses_a_dash_prompt_on_argv_even_for_a_stored_target_and_starts_nothing(
    fake_env: dict[str, str]
) -> None:
    target = {"type": "agent", "provider": "aicopilot", "prompt": "-x"}
    result = execute_target(target, META, env=fake_env)
    assert result.status == "failed"
    assert result.error == ('target.prompt must not begin with "-" when passed on argv to provider aicopilot (its CLI '
                            'takes no end-of-options separator); use promptVia "stdin", got "-x"')
    assert calls(fake_env, "aicopilot") == []


def test_opencode_requires_a_model() -> None:
    with pytest.raises(ValidationError) as info:
        validate_target({"type": "agent", "provider": "opencode", "prompt": P})
    assert info.value.message == ("target.model is required for provider opencode; pass a provider/model id such "
                                  "as openrouter/google/gemini-2.5-flash, got null")


@pytest.mark.parametrize("bad", ["exec", "--ephemeral", "-o", "--dangerously-bypass-approvals-and-sandbox"])
def test_codewith_extra_args_cannot_repeat_or_change_the_exec_flags_loopsq_passes(bad: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_target({"type": "agent", "provider": "codewith", "prompt": P, "extraArgs": ["--x", bad]})
    assert info.value.message == (f"target.extraArgs cannot include {bad} for provider codewith; loopsq runs "
                                  f"codewith exec --json --ephemeral with its own flags, got {json.dumps(bad)}")


def test_large_prompt_via_stdin_is_written_whole_while_output_is_read(fake_env: dict[str, str]) -> None:
    prompt = "é" * 600_000 + "end"  # 1.2 MB: far beyond a pipe buffer
    record = run_agent(fake_env, "claude", promptVia="stdin", prompt=prompt)
    assert record["stdin"] == prompt


def test_provider_that_never_reads_its_stdin_prompt_still_succeeds(fake_env: dict[str, str]) -> None:
    fake_env["FAKE_SKIP_STDIN"] = "1"
    record = run_agent(fake_env, "codex", promptVia="stdin", prompt="x" * 2_000_000)
    assert record["stdin"] == ""


@pytest.mark.parametrize("prompt", ["", "  \n\t", "\u200b\u200b", "[redacted 1200 chars]",
                                    "Review the repo... [redacted 40 chars]"])
def test_a_stored_agent_target_with_a_blank_or_redacted_prompt_fails_without_starting_the_agent(
        fake_env: dict[str, str], prompt: str) -> None:
    # A target stored before the create-time check (or written by hand): the agent is never started with nothing to do.
    result = execute_target({"type": "agent", "provider": "opencode", "prompt": prompt, "model": "m",
                             "promptVia": "stdin"}, META, env=fake_env)
    assert (result.status, result.pid, result.exit_code) == ("failed", None, None)
    assert result.error is not None and result.error.startswith("agent prompt ")
    assert result.error.endswith("; nothing was started")
    assert calls(fake_env, "opencode") == []


CLAUDE_SAID_NOTHING = json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": " \n"})
CODEX_SAID_NOTHING = "\n".join(json.dumps(e) for e in (
    {"type": "thread.started", "thread_id": "t"}, {"type": "turn.started"},
    {"type": "turn.completed", "usage": {"input_tokens": 10, "output_tokens": 0}}))
OPENCODE_SAID_NOTHING = "\n".join(json.dumps(e) for e in (
    {"type": "step_start", "part": {"type": "step-start"}},
    {"type": "step_finish", "part": {"type": "step-finish", "tokens": {"input": 5, "output": 0}}}))


@pytest.mark.parametrize(("provider", "stdout"), [
    ("claude", ""), ("claude", " \n\n"), ("claude", CLAUDE_SAID_NOTHING), ("codex", CODEX_SAID_NOTHING),
    ("opencode", OPENCODE_SAID_NOTHING), ("aicopilot", OPENCODE_SAID_NOTHING), ("cursor", ""), ("cursor", "\n"),
])
def test_an_agent_run_that_exits_0_having_said_nothing_fails_with_agent_produced_no_output(
        fake_env: dict[str, str], provider: str, stdout: str) -> None:
    fake_env["FAKE_STDOUT"] = stdout
    result = execute_target({"type": "agent", "provider": provider, "prompt": P, "model": "m"}, META, env=fake_env)
    assert (result.status, result.exit_code, result.error) == ("failed", 0, "agent produced no output")
    assert result.stdout == stdout  # kept, to see what it printed


CLAUDE_ANSWERED = json.dumps({"type": "result", "result": "Fixed the build.", "usage": {"output_tokens": 9}})
CODEX_ANSWERED = CODEX_SAID_NOTHING + "\n" + json.dumps(
    {"type": "item.completed", "item": {"id": "i", "type": "agent_message", "text": "Nothing to change."}})
OPENCODE_ANSWERED = OPENCODE_SAID_NOTHING + "\n" + json.dumps({"type": "text", "part": {"type": "text", "text": "ok"}})


@pytest.mark.parametrize(("provider", "stdout"), [
    ("claude", CLAUDE_ANSWERED), ("claude", "plain text, not json"), ("claude", json.dumps({"type": "result"})),
    ("codex", CODEX_ANSWERED), ("codex", json.dumps({"type": "turn.started"})), ("codex", "{\"msg\": 1}"),
    ("opencode", OPENCODE_ANSWERED), ("cursor", "done\n"), ("aicopilot", '{"type": "unknown"}'),
])
def test_an_agent_run_that_said_something_or_printed_a_shape_not_recognised_succeeds(
        fake_env: dict[str, str], provider: str, stdout: str) -> None:
    fake_env["FAKE_STDOUT"] = stdout
    result = execute_target({"type": "agent", "provider": provider, "prompt": P, "model": "m"}, META, env=fake_env)
    assert (result.status, result.error) == ("succeeded", None)


def test_a_command_target_that_prints_nothing_still_succeeds(fake_env: dict[str, str]) -> None:
    result = execute_target({"type": "command", "command": "true"}, META, env=fake_env)
    assert (result.status, result.stdout) == ("succeeded", "")


def test_an_agent_that_prints_nothing_and_fails_keeps_its_own_failure(fake_env: dict[str, str]) -> None:
    fake_env |= {"FAKE_STDOUT": "", "FAKE_EXIT": "2"}
    result = execute_target({"type": "agent", "provider": "claude", "prompt": P}, META, env=fake_env)
    assert (result.status, result.error) == ("failed", "process exited with code 2")


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
    result = execute_target({"type": "agent", "provider": "claude", "prompt": "p"}, RunMetadata(), env=fake_env)
    assert (result.status, result.exit_code, result.error) == ("failed", 4, "process exited with code 4")
    assert result.stdout == '{"ok":false}'


def test_missing_provider_executable_fails_without_spawning_and_shows_the_effective_path(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "HOME": "/nonexistent-home"}
    result = execute_target({"type": "agent", "provider": "cursor", "prompt": "p"}, RunMetadata(), env=env)
    path = (f"{tmp_path}:/nonexistent-home/.local/bin:/nonexistent-home/.bun/bin:/nonexistent-home/.cargo/bin:"
            "/nonexistent-home/.npm-global/bin:/nonexistent-home/bin:/opt/homebrew/bin:/usr/local/bin:/usr/bin:/bin:"
            "/usr/sbin:/sbin")
    if result.status == "failed":
        assert result.error == f"Executable not found in PATH: agent. Effective PATH={path}"
        assert result.duration_ms == 0 and result.pid is None
    else:  # pragma: no cover - a Cursor CLI installed in a system bin directory of this machine
        pytest.skip("an `agent` executable is installed system-wide here")


def test_preflight_of_an_agent_names_its_executable(fake_env: dict[str, str]) -> None:
    target = {"type": "agent", "provider": "cursor", "prompt": "p"}
    assert preflight_target(target, RunMetadata(), env=fake_env) == {"command": "agent"}
