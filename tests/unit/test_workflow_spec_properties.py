"""Property tests: validation raises only ValidationError, and execution order is a valid topological order."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loopsq.domain.targets import PROVIDERS, validate_executable_target, validate_target
from loopsq.domain.workflow_spec import execution_order, workflow_body_from_json
from loopsq.errors import ValidationError

EXAMPLES = settings(max_examples=int(os.environ.get("LOOPSQ_FUZZ_EXAMPLES", "300")), deadline=None)

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
# Strategies are built once, at import: building them inside each draw is what makes Hypothesis slow.
ROLL = st.integers(0, 15)
IDS = st.sampled_from(["a", "b", "c", "d"])
TEXTS = st.text(max_size=4)
WORDS = st.sampled_from(["git", "work", "/repo", "x y", ""])
BLANKS = st.sampled_from([" ", ""]) | json_values


def pick(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any] = json_values) -> Any:
    """Draws from ``good`` about fifteen times in sixteen, so that most specs get past the early checks."""
    return draw(bad if draw(ROLL) == 5 else good)


@st.composite
def accounts(draw: st.DrawFn) -> dict[str, Any]:
    account = {"profile": pick(draw, WORDS)}
    if draw(st.booleans()):
        account["tool"] = pick(draw, WORDS)
    return account


FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "args": st.lists(TEXTS, max_size=2),
    "extraArgs": st.lists(TEXTS, max_size=2),
    "cwd": WORDS,
    "model": TEXTS,
    "agent": TEXTS,
    "shell": st.booleans(),
    "continueOnFailure": st.booleans(),
    "env": st.dictionaries(TEXTS, TEXTS, max_size=2),
    "input": st.dictionaries(TEXTS, TEXTS, max_size=2),
    "timeoutMs": st.none() | st.integers(-1, 10**6),
    "idleTimeoutMs": st.integers(-1, 10**6),
    "maxParallel": st.none() | st.integers(-1, 8),
    "version": st.integers() | st.floats(),
    "description": TEXTS,
    "configIsolation": st.sampled_from(["safe", "none"]),
    "promptVia": st.sampled_from(["argv", "stdin"]),
    "account": accounts(),
    "name": TEXTS,
    # The later 0.3.x agent options: every provider x option pair must either validate or get one error.
    "variant": TEXTS,
    "permissionMode": st.sampled_from(["default", "plan", "auto", "bypass", "yolo"]),
    "sandbox": st.sampled_from(["read-only", "workspace-write", "danger-full-access", "enabled", "disabled", "x"]),
    "addDirs": st.lists(TEXTS, max_size=2),
    "authProfile": TEXTS,
    "preflight": st.sampled_from([{"beforeRun": True}, {"beforeRun": "yes"}, {}]),
}
COMMAND_FIELDS = ("args", "cwd", "shell", "env", "timeoutMs", "idleTimeoutMs", "account")
AGENT_FIELDS = ("cwd", "model", "agent", "extraArgs", "timeoutMs", "idleTimeoutMs", "configIsolation", "variant",
                "permissionMode", "sandbox", "addDirs", "authProfile", "preflight")
FIELD_CHOICES = {
    "command": st.lists(st.sampled_from(COMMAND_FIELDS), unique=True, max_size=3),
    "agent": st.lists(st.sampled_from((*AGENT_FIELDS, "promptVia", "account")), unique=True, max_size=3),
    "workflow": st.lists(st.sampled_from(("input", "timeoutMs")), unique=True, max_size=2),
    "step": st.lists(
        st.sampled_from(("continueOnFailure", "timeoutMs", "account", "name")), unique=True, max_size=3
    ),
    "spec": st.lists(st.sampled_from(("description", "version", "maxParallel")), unique=True, max_size=3),
}
TYPES = st.sampled_from(("command", "agent", "workflow"))
EXECUTABLE_TYPES = st.sampled_from(("command", "agent"))
BAD_TYPES = st.sampled_from(("workflow", "job")) | json_values
COMMANDS = st.sampled_from(["git", "bun run", " ls ", ""])
PROVIDER_NAMES = st.sampled_from([*PROVIDERS, "nobody"])


def optional_fields(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    return {name: pick(draw, FIELD_VALUES[name]) for name in draw(FIELD_CHOICES[kind])}


@st.composite
def targets(draw: st.DrawFn, executable_only: bool = False) -> Any:
    kind = pick(draw, EXECUTABLE_TYPES if executable_only else TYPES, BAD_TYPES)
    target: dict[str, Any] = {"type": kind}
    if kind == "command":
        target["command"] = pick(draw, COMMANDS)
    elif kind == "agent":
        target["provider"] = pick(draw, PROVIDER_NAMES)
        target["prompt"] = pick(draw, st.just("go"), BLANKS)
    elif kind == "workflow":
        target["workflowId"] = pick(draw, st.just("w1"), BLANKS)
    if isinstance(kind, str) and kind in FIELD_CHOICES:
        target.update(optional_fields(draw, kind))
    return target if draw(ROLL) != 5 else draw(json_values)


EXECUTABLE_TARGETS = targets(executable_only=True)
STEP_ID_LISTS = st.lists(IDS | json_values, max_size=2)


@st.composite
def steps(draw: st.DrawFn) -> Any:
    step: dict[str, Any] = {"id": pick(draw, IDS), "target": draw(EXECUTABLE_TARGETS)}
    step.update(optional_fields(draw, "step"))
    if draw(st.booleans()):
        step["dependsOn"] = pick(draw, STEP_ID_LISTS)
    return step if draw(ROLL) != 5 else draw(json_values)


STEP_LISTS = st.lists(steps(), min_size=1, max_size=4)
NAMES = st.sampled_from(["wf", " x "])


@st.composite
def spec_like(draw: st.DrawFn) -> Any:
    value: dict[str, Any] = {
        "name": pick(draw, NAMES),
        "steps": pick(draw, STEP_LISTS, st.just([]) | json_values),
    }
    value.update(optional_fields(draw, "spec"))
    return value if draw(ROLL) != 5 else draw(json_values)


@st.composite
def valid_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec whose dependencies form a DAG, with steps declared in a shuffled order."""
    count = draw(st.integers(1, 10))
    ids = [f"s{i}" for i in range(count)]
    declared = []
    for i, step_id in enumerate(ids):
        # Each step depends only on steps created before it, so the graph is acyclic.
        picks = draw(st.lists(st.integers(0, i - 1), max_size=3)) if i else []
        deps = list(dict.fromkeys(ids[pick] for pick in picks))
        declared.append({"id": step_id, "dependsOn": deps, "target": {"type": "command", "command": "true"}})
    return {"name": "wf", "steps": draw(st.permutations(declared))}


def assert_valid_order(body: dict[str, Any]) -> None:
    order = execution_order(body["steps"])
    assert sorted(order) == sorted(step["id"] for step in body["steps"])
    position = {step_id: index for index, step_id in enumerate(order)}
    for step in body["steps"]:
        assert all(position[dep] < position[step["id"]] for dep in step["dependsOn"])


@EXAMPLES
@given(json_values | spec_like())
def test_any_json_like_spec_either_validates_or_raises_a_validation_error(value: Any) -> None:
    try:
        body = workflow_body_from_json(value)
    except ValidationError:
        return
    assert_valid_order(body)


@EXAMPLES
@given(json_values | targets(), st.booleans())
def test_any_json_like_target_either_validates_or_raises_a_validation_error(
    value: Any, workflow: bool
) -> None:
    try:
        result = validate_target(value) if workflow else validate_executable_target(value, "t")
    except ValidationError:
        return
    assert result["type"] in (("command", "agent", "workflow") if workflow else ("command", "agent"))


@EXAMPLES
@given(valid_specs())
def test_every_valid_spec_orders_each_step_after_its_dependencies(value: dict[str, Any]) -> None:
    body = workflow_body_from_json(value)
    assert_valid_order(body)
    # Without dependencies, the order is the declaration order.
    for step in body["steps"]:
        step["dependsOn"] = []
    assert execution_order(body["steps"]) == [step["id"] for step in body["steps"]]
