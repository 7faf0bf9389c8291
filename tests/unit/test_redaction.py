"""Public output shapes: exact redaction strings, nothing else changed, inputs never mutated."""

from __future__ import annotations

import copy
from typing import Any

from loopsq.domain.redaction import (
    public_event,
    public_loop,
    public_run,
    public_step_run,
    public_workflow,
    public_workflow_run,
    redact,
)

PROMPT_100 = "p" * 80 + "q" * 20


def test_redact_hides_everything_by_default() -> None:
    assert redact("abcdef") == "[redacted 6 chars]"


def test_redact_keeps_the_visible_prefix_and_counts_the_rest() -> None:
    assert redact("abcdef", 2) == "ab... [redacted 4 chars]"
    assert redact(PROMPT_100, 80) == "p" * 80 + "... [redacted 20 chars]"


def test_redact_leaves_text_no_longer_than_the_visible_part_unchanged() -> None:
    assert redact("x" * 80, 80) == "x" * 80
    assert redact("abc", 5) == "abc"
    assert redact("") == ""


def test_public_loop_hides_command_env_and_keeps_everything_else() -> None:
    loop = {
        "id": "a",
        "name": "n",
        "target": {"type": "command", "command": "deploy", "env": {"TOKEN": "s3cret"}, "args": ["x"]},
        "schedule": {"type": "once", "at": "2024-01-01T00:00:00.000Z"},
    }
    original = copy.deepcopy(loop)
    shown = public_loop(loop)
    assert shown == {
        **original,
        "target": {"type": "command", "command": "deploy", "env": "[redacted]", "args": ["x"]},
    }
    assert loop == original


def test_public_loop_leaves_env_absent_when_the_command_has_none() -> None:
    loop = {"id": "a", "target": {"type": "command", "command": "true"}}
    assert public_loop(loop) == loop


def test_public_loop_shows_the_first_80_prompt_chars_of_an_agent() -> None:
    loop: dict[str, Any] = {
        "id": "a",
        "target": {"type": "agent", "provider": "claude", "prompt": PROMPT_100},
    }
    assert public_loop(loop)["target"] == {
        "type": "agent",
        "provider": "claude",
        "prompt": "p" * 80 + "... [redacted 20 chars]",
    }
    assert loop["target"]["prompt"] == PROMPT_100


def test_public_loop_leaves_a_workflow_target_alone() -> None:
    loop = {"id": "a", "target": {"type": "workflow", "workflowId": "w", "input": {"k": "v"}}}
    assert public_loop(loop) == loop


def test_public_run_replaces_output_with_its_length_and_keeps_the_error() -> None:
    run = {"id": "r", "stdout": "hello", "stderr": "oops!!", "error": "exit code 1", "exitCode": 1}
    original = copy.deepcopy(run)
    assert public_run(run) == {
        "id": "r",
        "stdout": "[redacted 5 chars]",
        "stderr": "[redacted 6 chars]",
        "error": "exit code 1",
        "exitCode": 1,
    }
    assert run == original


def test_public_run_shows_output_when_asked() -> None:
    run = {"id": "r", "stdout": "hello", "stderr": "oops"}
    assert public_run(run, show_output=True) == run


def test_public_run_keeps_absent_output_absent_and_drops_empty_output() -> None:
    assert public_run({"id": "r"}) == {"id": "r"}
    assert public_run({"id": "r", "stdout": "", "stderr": "x"}) == {"id": "r", "stderr": "[redacted 1 chars]"}


def test_public_step_run_redacts_like_a_run() -> None:
    step = {"id": "s", "stepId": "build", "stdout": "abc", "error": "exit code 2"}
    assert public_step_run(step) == {
        "id": "s",
        "stepId": "build",
        "stdout": "[redacted 3 chars]",
        "error": "exit code 2",
    }
    assert public_step_run(step, show_output=True) == step


def test_public_workflow_redacts_each_step_prompt_and_env() -> None:
    spec: dict[str, Any] = {
        "id": "w",
        "name": "deploy",
        "steps": [
            {"id": "think", "target": {"type": "agent", "provider": "codex", "prompt": PROMPT_100}},
            {"id": "short", "target": {"type": "agent", "provider": "codex", "prompt": "hi"}},
            {"id": "ship", "target": {"type": "command", "command": "ship", "env": {"K": "v"}}},
            {"id": "plain", "target": {"type": "command", "command": "true"}},
        ],
    }
    original = copy.deepcopy(spec)
    shown = public_workflow(spec)
    assert [step["target"] for step in shown["steps"]] == [
        {"type": "agent", "provider": "codex", "prompt": "p" * 80 + "... [redacted 20 chars]"},
        {"type": "agent", "provider": "codex", "prompt": "hi"},
        {"type": "command", "command": "ship", "env": "[redacted]"},
        {"type": "command", "command": "true"},
    ]
    assert spec == original


def test_public_workflow_run_is_an_unchanged_copy() -> None:
    run = {"id": "wr", "error": "step build failed", "status": "failed"}
    shown = public_workflow_run(run)
    assert shown == run and shown is not run


def test_public_event_redacts_sensitive_payload_keys_at_any_depth_and_keeps_errors_and_reasons() -> None:
    event = {
        "id": "e",
        "eventType": "step_failed",
        "payload": {
            "error": "exit code 2",
            "reason": "cancelled by user",
            "stdout": "12345",
            "env": {"TOKEN": "x"},
            "steps": [{"prompt": "do it", "stderr": None, "exitCode": 2}],
            "nested": {"inner": {"stderr": "", "prompt": 7}},
        },
    }
    original = copy.deepcopy(event)
    assert public_event(event) == {
        "id": "e",
        "eventType": "step_failed",
        "payload": {
            "error": "exit code 2",
            "reason": "cancelled by user",
            "stdout": "[redacted 5 chars]",
            "env": "[redacted]",
            "steps": [{"prompt": "[redacted 5 chars]", "stderr": None, "exitCode": 2}],
            "nested": {"inner": {"stderr": "", "prompt": "[redacted]"}},
        },
    }
    assert event == original


def test_public_event_without_a_payload_is_unchanged() -> None:
    event = {"id": "e", "eventType": "created"}
    assert public_event(event) == event
