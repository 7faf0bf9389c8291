"""Tests of workflow spec validation (§5.2, in order, exact messages), execution order and spec file loading."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain.limits import MAX_STEPS
from loopsq.domain.workflow_spec import execution_order, load_workflow_file, workflow_body_from_json
from loopsq.errors import ValidationError

REFERENCE_EXAMPLE: dict[str, Any] = {
    "name": "repo-morning",
    "description": "optional",
    "version": 1,
    "steps": [
        {
            "id": "status",
            "target": {"type": "command", "command": "git", "args": ["status", "--short"], "cwd": "/repo"},
        },
        {
            "id": "lint",
            "dependsOn": ["status"],
            "continueOnFailure": True,
            "timeoutMs": 60000,
            "target": {"type": "command", "command": "bun run lint", "shell": True},
        },
        {
            "id": "review",
            "dependsOn": ["status", "lint"],
            "account": {"profile": "work", "tool": "codex"},
            "target": {
                "type": "agent",
                "provider": "codex",
                "cwd": "/repo",
                "prompt": "Review the repository status and summarize next actions.",
            },
        },
    ],
}


def step(step_id: Any, *depends_on: str, **fields: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"id": step_id, "target": {"type": "command", "command": "true"}, **fields}
    if depends_on:
        result["dependsOn"] = list(depends_on)
    return result


def spec(*steps: Any, **fields: Any) -> dict[str, Any]:
    return {"name": "wf", "steps": list(steps), **fields}


def error_of(value: Any, name_override: str | None = None) -> str:
    with pytest.raises(ValidationError) as caught:
        workflow_body_from_json(value, name_override)
    return caught.value.message


# §5.2 checks, one by one


@pytest.mark.parametrize("value", [None, [], "wf", 3, True])
def test_check_1_a_spec_that_is_not_an_object_is_rejected(value: Any) -> None:
    assert error_of(value) == "workflow file must be an object"


@pytest.mark.parametrize("name", [None, "", "  ", 5])
def test_check_2_a_spec_needs_a_non_empty_name(name: Any) -> None:
    assert error_of(spec(step("a"), name=name)) == "workflow.name must be a non-empty string"


def test_check_2_a_name_override_replaces_the_name_in_the_file() -> None:
    assert workflow_body_from_json(spec(step("a"), name=None), "  given ")["name"] == "given"


def test_check_2_an_empty_name_override_is_not_replaced_by_the_file_name() -> None:
    assert error_of(spec(step("a")), "") == "workflow.name must be a non-empty string"


@pytest.mark.parametrize("steps", [None, {"a": {}}, "a"])
def test_check_3_steps_must_be_an_array(steps: Any) -> None:
    assert error_of({"name": "wf", "steps": steps}) == "workflow.steps must be an array"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"description": "d", "version": 3}, {"description": "d", "version": 3}),
        ({"description": 5, "version": "3"}, {"version": 1}),
        ({"version": True}, {"version": 1}),
        ({"version": 2.5}, {"version": 2.5}),
        ({"version": float("nan")}, {"version": 1}),
    ],
)
def test_check_4_only_a_string_description_and_a_number_version_are_carried(
    fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    body = workflow_body_from_json(spec(step("a"), **fields))
    assert {key: body[key] for key in ("description", "version") if key in body} == expected


def test_check_5_steps_must_not_be_empty() -> None:
    assert error_of(spec()) == "workflow.steps must contain at least one step"


@pytest.mark.parametrize("raw", [None, [], "a", 1])
def test_check_6_each_step_must_be_an_object(raw: Any) -> None:
    assert error_of(spec(step("a"), raw)) == "workflow.steps[1] must be an object"


@pytest.mark.parametrize("step_id", [None, "", " ", 1])
def test_check_6_each_step_needs_a_non_empty_id(step_id: Any) -> None:
    assert error_of(spec(step(step_id))) == "workflow.steps[0].id must be a non-empty string"


def test_check_6_step_ids_must_be_unique() -> None:
    assert error_of(spec(step("a"), step("b"), step("a"))) == "duplicate workflow step id: a"


def test_check_6_the_step_target_is_validated_with_its_label() -> None:
    assert error_of(spec(step("a"), {"id": "b"})) == "workflow.steps[1].target must be an object"


def test_check_6_a_space_in_a_command_without_shell_is_rejected() -> None:
    bad = step("a", target={"type": "command", "command": "bun run lint"})
    assert error_of(spec(bad)) == (
        "workflow.steps[0].target.command must be an executable without spaces when shell is false; "
        "put flags in args or set shell true"
    )


def test_check_6_workflows_cannot_nest_workflows() -> None:
    nested = step("a", target={"type": "workflow", "workflowId": "w"})
    assert error_of(spec(nested)) == "workflow.steps[0].target.type must be command or agent"


def test_check_7_a_dependency_must_name_a_step() -> None:
    assert error_of(spec(step("a", "ghost"))) == "step a depends on missing step ghost"


def test_check_7_a_step_cannot_depend_on_itself() -> None:
    assert error_of(spec(step("a", "a"))) == "step a cannot depend on itself"


def test_check_8_a_cycle_names_the_step_the_search_re_enters() -> None:
    assert error_of(spec(step("a", "b"), step("b", "a"))) == "workflow dependency cycle includes step a"


def test_check_8_a_longer_cycle_reached_from_an_acyclic_step_names_the_cycle_entry() -> None:
    steps = spec(step("x", "b"), step("b", "c"), step("c", "d"), step("d", "b"))
    assert error_of(steps) == "workflow dependency cycle includes step b"


# order of the checks


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"name": "", "steps": None}, "workflow.name must be a non-empty string"),
        ({"name": "wf", "steps": [], "maxParallel": 0}, "workflow.steps must contain at least one step"),
        (
            spec(step("a"), maxParallel=0, version="x"),
            "workflow.maxParallel must be a positive integer, got 0",
        ),
        (spec(step("a"), "junk"), "workflow.steps[1] must be an object"),
        (spec(step("a", "ghost"), step("")), "workflow.steps[1].id must be a non-empty string"),
        (spec(step("a"), step("a", target=None)), "duplicate workflow step id: a"),
        (
            spec(step("a", "a", target={}), step("b")),
            "workflow.steps[0].target.type must be command or agent",
        ),
        (spec(step("a", "a"), step("b", "ghost")), "step a cannot depend on itself"),
        (spec(step("a", "b"), step("b", "a"), step("c", "c")), "step c cannot depend on itself"),
        (
            spec(step("a", dependsOn="b"), step("b", "ghost")),
            'workflow.steps[0].dependsOn must be an array of step ids, got "b"',
        ),
        (
            spec(step("a", continueOnFailure=1), step("b", target=None)),
            "workflow.steps[0].continueOnFailure must be a boolean, got 1",
        ),
    ],
)
def test_a_spec_with_two_problems_reports_the_earlier_check(value: Any, message: str) -> None:
    assert error_of(value) == message


# loopsq's extra checks


def test_depends_on_as_a_string_is_named_instead_of_split_into_characters() -> None:
    bad = step("b", dependsOn="a")
    assert (
        error_of(spec(step("a"), bad)) == 'workflow.steps[1].dependsOn must be an array of step ids, got "a"'
    )


def test_depends_on_with_a_non_string_item_is_rejected() -> None:
    message = error_of(spec(step("a"), step("b", dependsOn=["a", 1])))
    assert message == 'workflow.steps[1].dependsOn must be an array of step ids, got ["a", 1]'


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"continueOnFailure": "yes"}, 'continueOnFailure must be a boolean, got "yes"'),
        ({"timeoutMs": 0}, "timeoutMs must be a positive integer or null, got 0"),
        ({"timeoutMs": "1m"}, 'timeoutMs must be a positive integer or null, got "1m"'),
        ({"account": []}, "account must be an object with a profile, got []"),
        ({"account": {"profile": ""}}, 'account.profile must be a non-empty string, got ""'),
        ({"account": {"profile": "p", "tool": 1}}, "account.tool must be a non-empty string, got 1"),
    ],
)
def test_optional_step_fields_are_type_checked(fields: dict[str, Any], message: str) -> None:
    assert error_of(spec(step("a", **fields))) == f"workflow.steps[0].{message}"


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2"])
def test_max_parallel_must_be_a_positive_integer(value: Any) -> None:
    expected = f"workflow.maxParallel must be a positive integer, got {json.dumps(value)}"
    assert error_of(spec(step("a"), maxParallel=value)) == expected


def test_a_whole_float_is_the_integer_it_holds_as_json_schema_says() -> None:
    assert workflow_body_from_json(spec(step("a"), maxParallel=2.0))["maxParallel"] == 2


def test_max_parallel_defaults_to_one_and_is_carried_when_given() -> None:
    assert workflow_body_from_json(spec(step("a")))["maxParallel"] == 1
    assert workflow_body_from_json(spec(step("a"), maxParallel=None))["maxParallel"] == 1
    assert workflow_body_from_json(spec(step("a"), maxParallel=4))["maxParallel"] == 4


# normalisation


def test_the_reference_example_validates_and_normalises() -> None:
    original = copy.deepcopy(REFERENCE_EXAMPLE)
    body = workflow_body_from_json(REFERENCE_EXAMPLE)
    assert original == REFERENCE_EXAMPLE, "the input must not be mutated"
    expected_steps = copy.deepcopy(REFERENCE_EXAMPLE["steps"])
    expected_steps[0].update(dependsOn=[], continueOnFailure=False)
    expected_steps[2].update(continueOnFailure=False)
    # Each target keeps the defaults it was created with (0.3.55/0.3.60/0.4.0): commands 30 min, agents no timeout,
    # the idle timeout of their provider (codex: 30 min without output) and their prompt on stdin.
    for index in (0, 1):
        expected_steps[index]["target"]["timeoutMs"] = 1_800_000
    expected_steps[2]["target"].update(timeoutMs=None, idleTimeoutMs=1_800_000, promptVia="stdin")
    assert body == {
        "name": "repo-morning",
        "description": "optional",
        "version": 1,
        "maxParallel": 1,
        "steps": expected_steps,
    }
    assert execution_order(body["steps"]) == ["status", "lint", "review"]


def test_the_name_is_trimmed_and_unknown_top_level_fields_are_dropped() -> None:
    body = workflow_body_from_json(spec(step("a"), name="  wf \n", owner="me"))
    assert body == {
        "name": "wf",
        "version": 1,
        "maxParallel": 1,
        "steps": [
            {
                "id": "a",
                "target": {"type": "command", "command": "true", "timeoutMs": 1_800_000},
                "dependsOn": [],
                "continueOnFailure": False,
            }
        ],
    }


def test_the_name_is_trimmed_of_javascript_whitespace() -> None:
    assert workflow_body_from_json(spec(step("a"), name="\u00a0wf\u3000"))["name"] == "wf"


def test_unknown_and_informational_step_fields_are_kept_as_they_are() -> None:
    extra = {"name": "Step A", "description": "d", "retry": {"times": 2}}
    body = workflow_body_from_json(spec(step("a", **extra)))
    assert {key: body["steps"][0][key] for key in extra} == extra


def test_null_depends_on_continue_on_failure_and_account_count_as_absent() -> None:
    result = workflow_body_from_json(spec(step("a", dependsOn=None, continueOnFailure=None, account=None)))
    assert result["steps"][0] == {
        "id": "a",
        "target": {"type": "command", "command": "true", "timeoutMs": 1_800_000},
        "dependsOn": [],
        "continueOnFailure": False,
    }


def test_a_null_step_timeout_is_kept_as_no_timeout() -> None:
    assert workflow_body_from_json(spec(step("a", timeoutMs=None)))["steps"][0]["timeoutMs"] is None


# execution order


def test_a_diamond_runs_the_root_first_and_the_join_last() -> None:
    steps = [step("root"), step("left", "root"), step("right", "root"), step("join", "left", "right")]
    assert execution_order(steps) == ["root", "left", "right", "join"]


def test_independent_steps_keep_their_declaration_order() -> None:
    assert execution_order([step("c"), step("a"), step("b")]) == ["c", "a", "b"]


def test_dependencies_declared_after_their_dependents_are_moved_before_them() -> None:
    steps = [step("deploy", "build", "test"), step("test", "build"), step("build")]
    assert execution_order(steps) == ["build", "test", "deploy"]


def test_dependencies_are_visited_in_their_listed_order() -> None:
    steps = [step("z", "y", "x"), step("x"), step("y")]
    assert execution_order(steps) == ["y", "x", "z"]


def test_a_five_thousand_step_chain_is_ordered_without_recursion_errors() -> None:
    count = 5000
    steps = [step(f"s{i}", f"s{i + 1}") for i in range(count - 1)] + [step(f"s{count - 1}")]
    assert execution_order(steps) == [f"s{i}" for i in reversed(range(count))]


def test_a_spec_of_the_most_steps_is_accepted_and_one_more_is_refused() -> None:
    assert MAX_STEPS == 100
    chain = [step(f"s{i}", f"s{i + 1}") for i in range(MAX_STEPS - 1)] + [step(f"s{MAX_STEPS - 1}")]
    body = workflow_body_from_json(spec(*chain))
    assert execution_order(body["steps"])[0] == f"s{MAX_STEPS - 1}"
    with pytest.raises(ValidationError, match=r"^workflow.steps must have at most 100 steps, got 101$"):
        workflow_body_from_json(spec(*chain, step("extra")))


def test_execution_order_rejects_a_missing_dependency_and_a_cycle_on_its_own() -> None:
    with pytest.raises(ValidationError, match=r"^step a depends on missing step b$"):
        execution_order([step("a", "b")])
    with pytest.raises(ValidationError, match=r"^workflow dependency cycle includes step a$"):
        execution_order([step("a", "a")])


# spec files


def test_a_spec_file_is_read_and_decoded(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(REFERENCE_EXAMPLE), encoding="utf-8")
    assert load_workflow_file(str(path)) == REFERENCE_EXAMPLE


def test_a_spec_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"name": "x"}')
    assert load_workflow_file(str(path)) == {"name": "x"}


def test_a_missing_spec_file_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(ValidationError, match=r"^workflow file not found: .*nope\.json$"):
        load_workflow_file(str(path))


def test_a_directory_is_reported_as_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        load_workflow_file(str(tmp_path))
    assert caught.value.message == f"workflow file is a directory: {tmp_path}"


def test_an_unreadable_spec_file_is_reported_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A chmod 0 file is still readable by root, so the refusal is simulated.
    path = tmp_path / "wf.json"

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("loopsq.domain.workflow_spec.open_regular_file", refuse)
    with pytest.raises(ValidationError) as caught:
        load_workflow_file(str(path))
    assert caught.value.message == f"workflow file is not readable: {path}: Permission denied"


def test_a_spec_file_that_is_not_utf8_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_bytes(b'{"name": "\xff"}')
    with pytest.raises(ValidationError) as caught:
        load_workflow_file(str(path))
    assert caught.value.message == f"workflow file is not readable: {path}: not UTF-8 text (byte 10)"


def test_invalid_json_is_reported_with_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_text('{\n  "name": "x"\n  "steps": []}', encoding="utf-8")
    with pytest.raises(ValidationError) as caught:
        load_workflow_file(str(path))
    assert caught.value.message == (
        f"workflow file is not valid JSON: {path}: Expecting ',' delimiter (line 3 column 3)"
    )


def test_nan_is_not_accepted_as_json(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_text('{"version": NaN}', encoding="utf-8")
    with pytest.raises(ValidationError) as caught:
        load_workflow_file(str(path))
    assert caught.value.message == f"workflow file is not valid JSON: {path}: NaN is not valid JSON"


def test_absurdly_deep_nesting_is_reported_as_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ValidationError, match="nesting too deep"):
        load_workflow_file(str(path))
