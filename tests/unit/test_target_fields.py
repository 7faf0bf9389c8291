"""A target holds only the fields of its type: an unknown one is refused with one line naming it, by the server
(``targets._validate``) and by the create schemas (``additionalProperties: false``). (That the schemas' targets,
the later agent options included, are accepted: ``test_web_schemathesis``'s share of generated bodies created.)"""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopsq.domain.targets import validate_executable_target, validate_target
from loopsq.errors import ValidationError
from loopsq.web import body_schemas

TARGETS = {
    "command": ("CommandTarget", {"type": "command", "command": "true"}),
    "agent": ("AgentTarget", {"type": "agent", "provider": "claude", "prompt": "look"}),
    "workflow": ("WorkflowTarget", {"type": "workflow", "workflowId": "wf1"}),
}


def component(name: str) -> dict[str, Any]:
    parts = body_schemas.components()
    return {**parts[name], "components": {"schemas": parts}}


@pytest.mark.parametrize("kind", list(TARGETS))
def test_an_unknown_target_field_is_refused_naming_it_by_the_server_and_the_schema(kind: str) -> None:
    name, target = TARGETS[kind]
    wrong = {**target, "timeoutMS": 5}
    with pytest.raises(ValidationError) as caught:
        validate_target(wrong)
    assert caught.value.message == f"target.timeoutMS is not a known field of a {kind} target"
    assert not jsonschema.Draft202012Validator(component(name)).is_valid(wrong)
    assert jsonschema.Draft202012Validator(component(name)).is_valid(target)


def test_a_steps_unknown_target_field_names_the_step() -> None:
    with pytest.raises(ValidationError) as caught:
        validate_executable_target({"type": "command", "command": "true", "colour": "red"}, "workflow.steps[2].target")
    assert caught.value.message == "workflow.steps[2].target.colour is not a known field of a command target"


def server_accepts_prompt(prompt: str) -> bool:
    try:
        validate_target({"type": "agent", "provider": "claude", "prompt": prompt})
    except ValidationError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=8), st.text(alphabet=" \t\n\u00a0\u200b\u3000\x16\x00x", max_size=6),
                 st.builds(lambda head, n: f"{head}[redacted {n} chars]", st.sampled_from(["", "ab... ", "ab..."]),
                           st.integers(0, 99))))
def test_the_prompt_pattern_is_the_servers_rule(prompt: str) -> None:
    pattern = body_schemas.patterns()["prompt"]
    assert (re.fullmatch(pattern.removeprefix("^").removesuffix("$"), prompt) is not None) == \
        server_accepts_prompt(prompt)
