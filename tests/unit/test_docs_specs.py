"""docs/workflows.md and docs/schedules.md stay true: every JSON example validates, and every field the
validators accept is documented."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain import targets
from loopsq.domain.schedules import Schedule, initial_next_run
from loopsq.domain.workflow_spec import execution_order, workflow_body_from_json

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _examples(name: str) -> list[Any]:
    text = (DOCS / name).read_text()
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, re.S)]


def test_every_workflow_example_validates_and_has_an_execution_order() -> None:
    examples = _examples("workflows.md")
    assert len(examples) == 3
    for example in examples:
        body = workflow_body_from_json(example)
        assert execution_order(body["steps"])


def test_the_complete_workflow_example_shows_every_field_it_documents() -> None:
    complete = _examples("workflows.md")[0]
    body = workflow_body_from_json(complete)
    assert body["maxParallel"] == 2 and body["version"] == 1
    assert execution_order(body["steps"]) == ["status", "lint", "review"]
    kinds = {step["target"]["type"] for step in body["steps"]}
    assert kinds == {"command", "agent"}


def _documented_fields(name: str) -> set[str]:
    return set(re.findall(r"^\| `([A-Za-z]+)`", (DOCS / name).read_text(), re.M))


@pytest.mark.parametrize("kind", ["command", "agent"])
def test_every_target_field_the_validator_accepts_is_documented(kind: str) -> None:
    accepted = {field for field, _ in targets._EXTRA_CHECKS[kind]}
    assert accepted - _documented_fields("workflows.md") == set()


def test_the_step_and_top_level_fields_are_documented() -> None:
    documented = _documented_fields("workflows.md")
    assert {"id", "target", "dependsOn", "continueOnFailure", "timeoutMs", "account", "name", "version",
            "maxParallel", "steps", "description"} <= documented


def test_a_step_command_with_spaces_needs_shell_as_the_page_says() -> None:
    spec = {"name": "w", "steps": [{"id": "a", "target": {"type": "command", "command": "make test"}}]}
    with pytest.raises(Exception, match="must be an executable without spaces when shell is false"):
        workflow_body_from_json(spec)


def test_every_schedule_example_builds_and_has_a_first_slot() -> None:
    examples = _examples("schedules.md")
    assert {e["type"] for e in examples} == {"once", "interval", "cron", "dynamic"}
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for example in examples:
        schedule = Schedule.from_dict(example)
        assert initial_next_run(schedule, start, "Europe/Berlin") is not None


def test_the_schedule_defaults_are_the_documented_ones() -> None:
    assert Schedule.from_dict({"type": "dynamic"}).min_interval_ms == 60_000
    assert Schedule.from_dict({"type": "interval", "everyMs": 1000}).anchor == "fixed_rate"
