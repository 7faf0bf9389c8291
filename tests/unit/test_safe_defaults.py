"""Safe defaults of new loops (OpenLoops 0.4.0 / 0.4.40): the circuit breaker every new loop gets, written into
the stored loop so that loops stored before keep what they had."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain.loop_spec import new_loop
from loopsq.errors import ValidationError
from tests.unit.cli_helpers import Cli, make_cli

T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVERY = ("--every", "1m")


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def body(**fields: Any) -> dict[str, Any]:
    return {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 60_000},
            "target": {"type": "command", "command": "true"}, **fields}


def bad(cli: Cli, *args: str) -> str:
    before = cli.state()
    result = cli.run(*args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert cli.state() == before
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0].removeprefix("error: ")


# -- the circuit breaker -------------------------------------------------------------------------------------------
def test_every_new_loop_stores_the_default_breaker_of_five_and_zero_turns_it_off(cli: Cli) -> None:
    command = cli.json("create", "command", "c", "--cmd", "true", *EVERY)
    agent = cli.json("create", "agent", "a", "--provider", "codex", "--prompt", "p", *EVERY)
    off = cli.json("create", "command", "off", "--cmd", "true", *EVERY, "--pause-after-failures", "0")
    three = cli.json("create", "command", "three", "--cmd", "true", *EVERY, "--pause-after-failures", "3")
    assert [loop["pauseAfterFailures"] for loop in (command, agent, off, three)] == [5, 5, 0, 3]
    assert cli.json("show", "off")["pauseAfterFailures"] == 0


def test_a_bad_pause_after_failures_is_one_line_naming_the_flag_and_stores_nothing(cli: Cli) -> None:
    assert bad(cli, "create", "command", "c", "--cmd", "true", *EVERY, "--pause-after-failures", "-2") == (
        "--pause-after-failures must be a whole number (0 turns the circuit breaker off), got '-2'")
    assert bad(cli, "create", "command", "c", "--cmd", "true", *EVERY, "--pause-after-failures", "five") == (
        "--pause-after-failures must be a whole number (0 turns the circuit breaker off), got 'five'")


@pytest.mark.parametrize(("value", "stored"), [(None, 5), (0, 0), (0.0, 0), (7, 7)])
def test_the_api_body_takes_pause_after_failures_zero_or_more_and_null_means_the_default(
        value: Any, stored: int) -> None:
    assert new_loop(body(pauseAfterFailures=value), T0).pause_after_failures == stored


@pytest.mark.parametrize("value", [-1, True, "5", 1.5])
def test_a_bad_pause_after_failures_in_a_body_names_the_field_and_the_value(value: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        new_loop(body(pauseAfterFailures=value), T0)
    assert caught.value.message.startswith(
        "pauseAfterFailures must be a whole number (0 turns the circuit breaker off), got ")


# -- the idle timeout of new agent loops ---------------------------------------------------------------------------
@pytest.mark.parametrize(("provider", "idle_ms"), [("codex", 1_800_000), ("claude", 14_400_000),
                                                    ("cursor", 14_400_000), ("codewith", 1_800_000),
                                                    ("aicopilot", 14_400_000)])
def test_a_new_agent_loop_stores_the_default_idle_timeout_of_its_provider(cli: Cli, provider: str,
                                                                          idle_ms: int) -> None:
    loop = cli.json("create", "agent", "a", "--provider", provider, "--prompt", "p", *EVERY)
    assert (loop["target"]["idleTimeoutMs"], loop["target"]["timeoutMs"]) == (idle_ms, None)
    assert cli.json("show", "a")["target"]["idleTimeoutMs"] == idle_ms


def test_an_agent_loop_given_a_timeout_or_an_idle_timeout_keeps_it_and_none_turns_the_idle_timeout_off(
        cli: Cli) -> None:
    timed = cli.json("create", "agent", "timed", "--provider", "codex", "--prompt", "p", *EVERY, "--timeout", "2h")
    unlimited = cli.json("create", "agent", "unlimited", "--provider", "codex", "--prompt", "p", *EVERY,
                         "--timeout", "none")
    idle = cli.json("create", "agent", "idle", "--provider", "codex", "--prompt", "p", *EVERY, "--idle-timeout", "5m")
    off = cli.json("create", "agent", "off", "--provider", "codex", "--prompt", "p", *EVERY, "--idle-timeout", "none")
    assert "idleTimeoutMs" not in timed["target"] and timed["target"]["timeoutMs"] == 7_200_000
    assert "idleTimeoutMs" not in unlimited["target"] and unlimited["target"]["timeoutMs"] is None
    assert idle["target"]["idleTimeoutMs"] == 300_000
    assert off["target"]["idleTimeoutMs"] is None


def test_a_command_loop_gets_no_idle_timeout() -> None:
    assert "idleTimeoutMs" not in new_loop(body(), T0).target


def test_the_api_body_stores_the_default_idle_timeout_and_null_turns_it_off() -> None:
    agent = {"type": "agent", "provider": "codex", "prompt": "p"}
    assert new_loop(body(target=agent), T0).target["idleTimeoutMs"] == 1_800_000
    off = new_loop(body(target={**agent, "idleTimeoutMs": None}), T0).target
    assert "idleTimeoutMs" in off and off["idleTimeoutMs"] is None


def test_an_agent_target_stored_before_the_default_has_no_idle_timeout_when_it_runs() -> None:
    from loopsq.executor import RunMetadata, build_spec

    old = {"type": "agent", "provider": "codex", "prompt": "p", "timeoutMs": None}  # as stored before
    assert build_spec(old, RunMetadata(), env={"PATH": "/bin"}).idle_timeout_ms is None
    new = new_loop(body(target={"type": "agent", "provider": "codex", "prompt": "p"}), T0).target
    assert build_spec(new, RunMetadata(), env={"PATH": "/bin"}).idle_timeout_ms == 1_800_000
    assert build_spec({**new, "idleTimeoutMs": None}, RunMetadata(), env={"PATH": "/bin"}).idle_timeout_ms is None


# -- agent loops must have something to ask ------------------------------------------------------------------------
def test_an_agent_loop_with_a_blank_prompt_is_refused_at_create_and_nothing_is_stored(cli: Cli) -> None:
    agent = ("create", "agent", "a", "--provider", "codex", *EVERY, "--prompt")
    assert bad(cli, *agent, "  ") == "--prompt must be a non-empty string, got '  '"
    assert bad(cli, *agent, "\u200b\n") == (
        "--prompt must have a visible character (it is blank), got '\\u200b\\x0a'")
    assert bad(cli, *agent, "fix it... [redacted 12 chars]") == (
        "--prompt is a redacted copy ('[redacted N chars]', as show prints it): send the full prompt, got "
        "'fix it... [redacted 12 chars]'")


@pytest.mark.parametrize(("prompt", "message"), [
    ("", "target.prompt must be a non-empty string"),
    ("\u200b", 'target.prompt must have a visible character (it is blank), got "\\u200b"'),
    ("[redacted 99 chars]", "target.prompt is a redacted copy ('[redacted N chars]', as show prints it): send the "
                            'full prompt, got "[redacted 99 chars]"'),
])
def test_the_api_body_and_spec_steps_refuse_a_blank_prompt_naming_the_field(prompt: str, message: str) -> None:
    from loopsq.domain.workflow_spec import workflow_body_from_json

    with pytest.raises(ValidationError) as caught:
        new_loop(body(target={"type": "agent", "provider": "codex", "prompt": prompt}), T0)
    assert caught.value.message == message
    with pytest.raises(ValidationError) as step:
        workflow_body_from_json({"name": "w", "steps": [
            {"id": "s", "target": {"type": "agent", "provider": "codex", "prompt": prompt}}]})
    assert step.value.message == message.replace("target.", "workflow.steps[0].target.", 1)
