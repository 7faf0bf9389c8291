"""The create-body schemas say what the validators accept: each pattern against the server's own rule, character by
character, and every bound from ``limits``."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopsq.domain import limits
from loopsq.domain.checks import first_invisible
from loopsq.domain.cron import validate_cron
from loopsq.domain.loop_spec import validate_name
from loopsq.domain.targets import is_non_empty_string
from loopsq.domain.workflow_spec import validate_workflow_name
from loopsq.errors import ValidationError
from loopsq.web import body_schemas

PATTERNS = body_schemas.patterns()
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def server_accepts_name(name: str) -> bool:
    try:
        validate_name(name)
    except ValidationError:
        return False
    return True


def server_accepts_workflow_name(name: str) -> bool:
    try:
        validate_workflow_name(name)
    except ValidationError:
        return False
    return True


def matches(pattern: str, value: str) -> bool:
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), value) is not None


@pytest.mark.parametrize(("pattern", "accepts"), [("loopName", server_accepts_name),
                                                  ("workflowName", server_accepts_workflow_name)])
def test_the_name_patterns_agree_with_the_server_for_every_character(pattern: str, accepts: Any) -> None:
    regex = re.compile(PATTERNS[pattern].removeprefix("^").removesuffix("$"))
    disagree = []
    for span in body_schemas._SCANNED:
        for cp in span:
            if 0xD800 <= cp <= 0xDFFF:
                continue  # no valid Unicode string holds a lone surrogate; the server refuses them anyway
            ch = chr(cp)
            for value in (f"a{ch}b", ch):  # inside a name, and alone (where trimming decides)
                if (regex.fullmatch(value) is not None) != accepts(value):
                    disagree.append((hex(cp), value))
    assert disagree == []
    # The planes the schema builder does not scan hold no control, format or space character: the server and
    # the pattern accept every one of their characters, inside a name and alone.
    rest = [chr(cp) for cp in range(sys.maxunicode + 1) if not any(cp in span for span in body_schemas._SCANNED)]
    assert first_invisible("".join(rest)) is None and not any(ch.isspace() for ch in rest)
    for chunk in range(0, len(rest), 150):
        name = "".join(rest[chunk:chunk + 150])
        assert accepts(name) and regex.fullmatch(name) is not None
    assert accepts(" \n a \t") and regex.fullmatch(" \n a \t") is not None


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12))
def test_the_name_pattern_agrees_with_the_server_on_any_text(name: str) -> None:
    assert matches(PATTERNS["loopName"], name) == server_accepts_name(name)


@settings(max_examples=100, deadline=None)
@given(st.from_regex(PATTERNS["cron"].removesuffix("$") + r"\Z"))
def test_every_expression_the_cron_pattern_admits_is_accepted(expression: str) -> None:
    if len(expression) > limits.MAX_CRON_LENGTH:
        return
    try:
        validate_cron(expression)
    except ValidationError as exc:
        # The only rule a regex cannot say: day-of-month values that no selected month has.
        assert exc.message.startswith("cron expression never matches"), exc.message


@pytest.mark.parametrize("expression", ["* * * * *", "5/15 * * * *", "0 0 1,15 * 1", "0 0 * * 7", "@daily",
                                        "0 23 31 12 0", "*/5 */2 * * *"])
def test_common_expressions_match_the_cron_pattern(expression: str) -> None:
    assert matches(PATTERNS["cron"], expression)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="ascii"), max_size=8))
def test_the_env_key_and_step_id_patterns_are_the_servers(text: str) -> None:
    assert matches(PATTERNS["envKey"], text) == (re.fullmatch(limits.ENV_KEY_PATTERN, text) is not None)
    assert matches(PATTERNS["stepId"], text) == (re.fullmatch(limits.STEP_ID_PATTERN, text) is not None)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=8))
def test_the_non_blank_pattern_is_the_references_non_empty_string_without_nul(text: str) -> None:
    assert matches(PATTERNS["nonBlank"], text) == (is_non_empty_string(text) and "\x00" not in text)


def test_the_bounds_in_the_schemas_are_the_limits() -> None:
    parts = body_schemas.components()
    loop = parts["LoopCreate"]["properties"]
    assert loop["name"]["maxLength"] == limits.MAX_NAME_LENGTH
    assert loop["leaseMs"]["minimum"] == limits.MIN_LEASE_MS
    assert parts["ScheduleInterval"]["properties"]["everyMs"]["minimum"] == limits.MIN_EVERY_MS
    assert parts["ScheduleCron"]["properties"]["expression"]["maxLength"] == limits.MAX_CRON_LENGTH
    command = parts["CommandTarget"]["properties"]
    assert command["command"]["maxLength"] == limits.MAX_COMMAND_LENGTH
    assert command["args"]["anyOf"][0]["maxItems"] == limits.MAX_ARGS
    env = command["env"]["anyOf"][0]
    assert (env["maxProperties"], env["propertyNames"]["pattern"]) == (limits.MAX_ENV_ENTRIES,
                                                                        f"^{limits.ENV_KEY_PATTERN}$")
    assert parts["AgentTarget"]["properties"]["prompt"]["maxLength"] == limits.MAX_PROMPT_LENGTH
    steps = parts["WorkflowCreate"]["properties"]["steps"]
    assert (steps["maxItems"], steps["items"]["properties"]["id"]["maxLength"]) == (limits.MAX_STEPS,
                                                                                    limits.MAX_STEP_ID_LENGTH)


def test_schedules_and_targets_are_discriminated_unions_by_type() -> None:
    parts = body_schemas.components()
    assert parts["Schedule"]["discriminator"] == {"propertyName": "type", "mapping": {
        kind: f"#/components/schemas/Schedule{kind.title()}" for kind in ("once", "interval", "cron", "dynamic")}}
    assert parts["Target"]["discriminator"]["mapping"] == {
        kind: f"#/components/schemas/{kind.title()}Target" for kind in ("command", "agent", "workflow")}
    assert set(parts["StepTarget"]["discriminator"]["mapping"]) == {"command", "agent"}
    for name in ("ScheduleOnce", "CommandTarget", "WorkflowTarget"):
        assert "type" in parts[name]["required"]
