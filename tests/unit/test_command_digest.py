"""``commandDigest`` (OpenLoops 0.5.5): the command line a loop's runs start and ``cmd:sha256:<hex>`` of exactly what
runs (argv, working directory, stdin prompt, the names of the variables the target gets), from ``build_spec``."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain import timeutil
from loopsq.domain.models import Loop
from loopsq.executor import build_spec, execute_target
from loopsq.executor.digest import PLACEHOLDERS, command_fields, resolve_command
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from tests.unit.cli_helpers import Cli, make_cli
from tests.unit.test_executor_agents import install_fake

SHELL = {"type": "command", "command": "echo hi", "shell": True, "env": {"TOKEN": "s3cret"}, "timeoutMs": 60_000}
CODEX = {"type": "agent", "provider": "codex", "prompt": "review the diff", "promptVia": "stdin", "model": "m1",
         "configIsolation": "safe"}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def digest(target: dict[str, Any]) -> str:
    return resolve_command(target).digest


def test_the_digest_is_stable_and_is_sha256_of_the_documented_canonical_json(monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve_command(SHELL)
    monkeypatch.setenv("SOME_WORKER_VARIABLE", "x")  # the worker's own environment is not part of it
    assert resolve_command(dict(SHELL)) == first
    assert re.fullmatch(r"cmd:sha256:[0-9a-f]{64}", first.digest)
    document = {"account": None, "argv": ["/bin/sh", "-c", "echo hi"], "cwd": None, "stdin": None,
                "envKeys": ["LOOPS_ATTEMPT", "LOOPS_CONTROL_FILE", "LOOPS_LOOP_ID", "LOOPS_LOOP_NAME", "LOOPS_RUN_ID",
                            "LOOPS_SCHEDULED_FOR", "PATH", "TOKEN"]}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert first.digest == "cmd:sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert (first.line, first.env_keys) == ("/bin/sh -c 'echo hi'", tuple(document["envKeys"]))


@pytest.mark.parametrize("change", [
    {"command": "echo hi!"}, {"shell": False, "command": "echo"}, {"args": ["x"]}, {"cwd": "/repo"},
    {"env": {"TOKEN": "s3cret", "OTHER": "1"}}, {"env": {"TOKEN2": "s3cret"}}, {"env": None},
    {"account": {"profile": "work", "tool": "codex"}},
])
def test_the_digest_changes_when_the_argv_the_cwd_or_the_variable_names_change(change: dict[str, Any]) -> None:
    changed = {k: v for k, v in {**SHELL, **change}.items() if v is not None}
    assert digest(changed) != digest(SHELL)


@pytest.mark.parametrize("change", [
    {"model": "m2"}, {"extraArgs": ["--fast"]}, {"prompt": "review the diff!"}, {"promptVia": "argv"},
    {"configIsolation": "none"}, {"variant": "high"}, {"sandbox": "read-only"},
])
def test_an_agent_digest_changes_with_its_options_and_its_prompt_on_argv_or_stdin(change: dict[str, Any]) -> None:
    assert digest({**CODEX, **change}) != digest(CODEX)


def test_the_account_a_run_is_routed_through_is_part_of_it() -> None:
    home = {**SHELL, "account": {"profile": "home", "tool": "claude"}}
    assert digest(home) != digest({**home, "account": {"profile": "work", "tool": "claude"}})
    assert digest(home) != digest({**home, "account": {"profile": "home", "tool": "codex"}})


@pytest.mark.parametrize("change", [
    {"env": {"TOKEN": "another secret"}}, {"timeoutMs": None}, {"idleTimeoutMs": 5000}, {"x": 1},
    {"preflight": {"beforeRun": True}},
])
def test_values_and_what_is_not_run_leave_the_digest_as_it_was(change: dict[str, Any]) -> None:
    assert digest({**SHELL, **change}) == digest(SHELL)  # (an env value, timeouts, unknown keys)


def test_the_command_line_and_the_variable_names_are_what_a_run_gets(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    install_fake(bin_dir, "codex", "fake_provider.py")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_RECORD_DIR": str(tmp_path), "HOME": str(tmp_path)}
    target = {**CODEX, "env": {"API_KEY": "k"}}
    resolved = resolve_command(target)
    assert execute_target(target, PLACEHOLDERS, env=env).status == "succeeded"
    record = json.loads((tmp_path / "codex.json").read_text())
    assert ["codex", *record["argv"]] == shlex.split(resolved.line)
    assert record["stdin"] == "review the diff"
    assert set(resolved.env_keys) <= set(record["env"])
    assert list(build_spec(target, PLACEHOLDERS, env=env).argv) == shlex.split(resolved.line)


def test_a_prompt_on_argv_is_redacted_in_the_line_as_show_redacts_it_but_hashed_whole() -> None:
    prompt = "x" * 200
    resolved = resolve_command({**CODEX, "promptVia": "argv", "prompt": prompt})
    assert resolved.line.endswith(" -- '" + "x" * 80 + "... [redacted 120 chars]'")
    assert prompt not in resolved.line
    assert resolved.digest != digest({**CODEX, "promptVia": "argv", "prompt": prompt + "y"})


def test_a_workflow_target_has_no_command_and_one_that_cannot_run_says_why() -> None:
    assert command_fields({"type": "workflow", "workflowId": "w1"}) == {}
    assert command_fields({"type": "agent", "provider": "codex", "prompt": "  "}) == {
        "commandError": "agent prompt must have a visible character (it is blank); nothing was started"}


def test_show_prints_the_command_line_its_variable_names_and_its_digest(cli: Cli) -> None:
    cli.ok("create", "command", "c", "--cmd", "echo hi", "--every", "1m", "--env", "TOKEN=s3cret")
    shown = cli.json("show", "c")
    loop = Loop.from_json(str(cli.redis.get(Keys().loop(shown["id"]))))
    assert shown["commandLine"] == "/bin/sh -c 'echo hi'"
    assert "TOKEN" in shown["commandEnvKeys"] and "s3cret" not in json.dumps(shown)
    assert shown["commandDigest"] == digest(loop.target)
    assert list(shown)[-3:] == ["commandEnvKeys", "commandDigest", "historyWindow"]


def test_show_says_why_a_stored_target_cannot_run(cli: Cli) -> None:
    cli.ok("create", "agent", "a", "--provider", "codex", "--prompt", "p", "--every", "1m")
    store = LoopStore(cli.redis)
    loop = store.require("a")
    store.remove(loop.id, timeutil.now())
    store.create(loop.with_changes(target={**loop.target, "prompt": " "}))  # as stored before the check
    shown = cli.json("show", "a")
    assert shown["commandError"] == "agent prompt must have a visible character (it is blank); nothing was started"
    assert "commandDigest" not in shown
