"""Tests of target validation: the reference's messages and order, then loopsq's extra type checks."""

from __future__ import annotations

from typing import Any

import pytest

from loopsq.domain.targets import PROVIDERS, short_repr, validate_executable_target, validate_target
from loopsq.errors import ValidationError

LABEL = "workflow.steps[0].target"


def error_of(target: Any, label: str = LABEL, *, workflow: bool = False) -> str:
    with pytest.raises(ValidationError) as caught:
        if workflow:
            validate_target(target, label)
        else:
            validate_executable_target(target, label)
    return caught.value.message


def command(**fields: Any) -> dict[str, Any]:
    return {"type": "command", "command": "git", **fields}


def agent(**fields: Any) -> dict[str, Any]:
    return {"type": "agent", "provider": "codex", "prompt": "do it", **fields}


def test_providers_are_the_six_of_the_reference_in_its_order() -> None:
    assert PROVIDERS == ("claude", "cursor", "codewith", "aicopilot", "opencode", "codex")


@pytest.mark.parametrize("target", [None, [], "command", 5, True])
def test_a_target_that_is_not_an_object_is_rejected(target: Any) -> None:
    assert error_of(target) == f"{LABEL} must be an object"


@pytest.mark.parametrize("value", [None, "", "   ", 5, ["git"]])
def test_a_command_target_needs_a_non_empty_command(value: Any) -> None:
    assert error_of(command(command=value)) == f"{LABEL}.command must be a non-empty string"


def test_a_command_with_spaces_needs_shell_true() -> None:
    assert error_of(command(command="bun run lint")) == (
        f"{LABEL}.command must be an executable without spaces when shell is false; "
        "put flags in args or set shell true"
    )


def test_a_command_with_a_tab_inside_counts_as_having_spaces() -> None:
    assert "without spaces" in error_of(command(command="a\tb", shell=False))


def test_javascript_whitespace_such_as_a_no_break_space_counts_as_a_space() -> None:
    assert "without spaces" in error_of(command(command="a\u00a0b"))
    assert error_of(command(command="\u00a0\ufeff")) == f"{LABEL}.command must be a non-empty string"


def test_a_command_with_spaces_is_accepted_when_shell_is_true() -> None:
    assert validate_executable_target(command(command="bun run lint", shell=True), LABEL)["shell"] is True


def test_surrounding_whitespace_of_a_command_is_not_counted_and_is_kept() -> None:
    assert validate_executable_target(command(command=" git "), LABEL)["command"] == " git "


def test_the_space_check_comes_before_the_extra_shell_type_check() -> None:
    assert "without spaces" in error_of(command(command="a b", shell="yes"))


def test_an_agent_target_needs_a_provider_then_a_prompt_then_a_known_provider() -> None:
    assert error_of(agent(provider="", prompt="")) == f"{LABEL}.provider must be a non-empty string"
    assert error_of(agent(provider="nobody", prompt=None)) == f"{LABEL}.prompt must be a non-empty string"
    assert error_of(agent(provider="nobody")) == (
        f"{LABEL}.provider must be one of claude, cursor, codewith, aicopilot, opencode, codex"
    )


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_provider_is_accepted(provider: str) -> None:
    extra = {"model": "openrouter/m"} if provider == "opencode" else {}  # opencode requires a model (0.3.60)
    assert validate_executable_target(agent(provider=provider, **extra), LABEL)["provider"] == provider


@pytest.mark.parametrize("kind", [None, "workflow", "shell", 3])
def test_an_executable_target_must_be_a_command_or_an_agent(kind: Any) -> None:
    assert error_of({"type": kind}) == f"{LABEL}.type must be command or agent"


def test_a_loop_target_may_also_be_a_workflow_and_says_so_when_the_type_is_wrong() -> None:
    assert (
        error_of({"type": "job"}, "target", workflow=True) == "target.type must be command, agent or workflow"
    )


def test_validate_target_uses_target_as_its_default_label() -> None:
    with pytest.raises(ValidationError, match=r"^target must be an object$"):
        validate_target([])


def test_a_workflow_target_needs_a_workflow_id() -> None:
    message = error_of({"type": "workflow", "workflowId": " "}, "target", workflow=True)
    assert message == 'target.workflowId must be a non-empty string, got " "'


def test_a_workflow_target_with_input_and_timeout_is_returned_as_a_copy() -> None:
    target = {"type": "workflow", "workflowId": "abc", "input": {"k": "v"}, "timeoutMs": 5}
    result = validate_target(target)
    assert result == target
    assert result is not target


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"input": ["k"]}, 'target.input must be an object of string values, got ["k"]'),
        ({"input": {"k": 1}}, "target.input.k must be a string, got 1"),
        ({"timeoutMs": 0}, "target.timeoutMs must be a positive integer or null, got 0"),
    ],
)
def test_a_workflow_target_checks_its_input_and_timeout(fields: dict[str, Any], message: str) -> None:
    assert error_of({"type": "workflow", "workflowId": "w", **fields}, "target", workflow=True) == message


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"args": 5}, "args must be an array of strings, got 5"),
        ({"args": ["a", 1]}, 'args must be an array of strings, got ["a", 1]'),
        ({"cwd": ""}, 'cwd must be a non-empty string, got ""'),
        ({"shell": "true"}, 'shell must be a boolean, got "true"'),
        ({"env": "A=1"}, 'env must be an object of string values, got "A=1"'),
        ({"env": {"A": 1}}, "env.A must be a string, got 1"),
        ({"env": {"1A": "x"}}, 'env key must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters), got "1A"'),
        ({"env": {"A B": "x"}}, 'env key must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters), got "A B"'),
        ({"env": {"A": "x\0"}}, 'env.A must not contain NUL characters, got "x\\x00"'),
        ({"timeoutMs": -1}, "timeoutMs must be a positive integer or null, got -1"),
        ({"timeoutMs": True}, "timeoutMs must be a positive integer or null, got true"),
        ({"timeoutMs": 1.5}, "timeoutMs must be a positive integer or null, got 1.5"),
        ({"idleTimeoutMs": "5s"}, 'idleTimeoutMs must be a positive integer or null, got "5s"'),
        ({"account": "work"}, 'account must be an object with a profile, got "work"'),
        ({"account": {"tool": "x"}}, "account.profile must be a non-empty string, got null"),
        ({"account": {"profile": "w", "tool": ""}}, 'account.tool must be a non-empty string, got ""'),
    ],
)
def test_a_command_target_checks_its_optional_fields(fields: dict[str, Any], message: str) -> None:
    assert error_of(command(**fields)) == f"{LABEL}.{message}"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cwd": 1}, "cwd must be a non-empty string, got 1"),
        ({"model": 4}, "model must be a string, got 4"),
        ({"agent": False}, "agent must be a string, got false"),
        ({"extraArgs": "--fast"}, 'extraArgs must be an array of strings, got "--fast"'),
        ({"configIsolation": "strict"}, 'configIsolation must be "safe" or "none", got "strict"'),
        ({"promptVia": "file"}, 'promptVia must be "argv" or "stdin", got "file"'),
        ({"idleTimeoutMs": 0}, "idleTimeoutMs must be a positive integer or null, got 0"),
        ({"account": {"profile": 7}}, "account.profile must be a non-empty string, got 7"),
        ({"env": ["A=1"]}, 'env must be an object of string values, got ["A=1"]'),
        ({"env": {"=": "x"}}, 'env key must match [A-Za-z_][A-Za-z0-9_]* (at most 256 characters), got "="'),
    ],
)
def test_an_agent_target_checks_its_optional_fields(fields: dict[str, Any], message: str) -> None:
    assert error_of(agent(**fields)) == f"{LABEL}.{message}"


def test_extra_checks_run_only_after_the_reference_checks() -> None:
    assert error_of(agent(prompt="", model=5)) == f"{LABEL}.prompt must be a non-empty string"


def test_a_fully_specified_command_target_is_returned_unchanged_with_unknown_keys_kept() -> None:
    target = command(
        args=["status"],
        cwd="/repo",
        shell=False,
        env={"A": "1"},
        timeoutMs=60000,
        idleTimeoutMs=1000,
        account={"profile": "work", "tool": "codex", "note": "x"},
        preflight={"beforeRun": True},
    )
    assert validate_executable_target(target, LABEL) == target


def test_a_fully_specified_agent_target_is_returned_unchanged() -> None:
    target = agent(
        provider="claude",
        cwd="/repo",
        model="m",
        agent="a",
        extraArgs=["--x"],
        timeoutMs=None,
        configIsolation="none",
        promptVia="stdin",
        variant="high",
        permissionMode="plan",
        promptSource={"type": "file", "path": "/p.md"},
        preflight={"beforeRun": True},
    )
    assert validate_executable_target(target, LABEL) == target


def test_optional_fields_given_as_null_are_dropped_but_a_null_timeout_is_kept() -> None:
    result = validate_executable_target(command(args=None, env=None, account=None, timeoutMs=None), LABEL)
    assert result == {"type": "command", "command": "git", "timeoutMs": None}


def test_an_account_without_a_tool_is_accepted_and_a_null_tool_dropped() -> None:
    result = validate_executable_target(command(account={"profile": "p", "tool": None}), LABEL)
    assert result["account"] == {"profile": "p"}


def test_the_returned_target_is_a_copy_that_does_not_alias_the_input_lists() -> None:
    target = command(args=["a"])
    result = validate_executable_target(target, LABEL)
    result["args"].append("b")
    assert target["args"] == ["a"]


def test_values_in_messages_are_a_short_escaped_prefix() -> None:
    assert short_repr("x" * 100) == '"' + "x" * 64 + '… (36 more characters)"'
    assert short_repr("tab\there") == '"tab\\x09here"'
    listed = short_repr(["a\u202e"] * 100_000)
    assert listed.startswith('["a\\u202e", "a\\u202e", ') and listed.endswith("…") and len(listed) < 200


def test_values_json_cannot_encode_are_still_rendered() -> None:
    assert short_repr({1, 2}) == "{1, 2}"
