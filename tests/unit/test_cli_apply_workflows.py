"""``loopsq apply -f`` and ``loopsq export`` with workflow specs (issue 31, point 1): workflows by active name,
edited in place (id kept); loops name them by name; applying twice changes nothing and appends nothing; export
round-trips; one bad spec changes nothing; prune archives only the owner's workflows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.cli_helpers import Cli, make_cli
from tests.unit.test_cli_update import bad
from tests.unit.test_cli_workflows import SPEC

HOURLY = {"type": "interval", "everyMs": 3_600_000}
FLOW = {"name": "nightly", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}},
                                     {"id": "b", "dependsOn": ["a"], "target": {"type": "command",
                                                                                "command": "echo", "args": ["b"]}}]}
RUNS_FLOW = {"name": "etl", "schedule": HOURLY, "target": {"type": "workflow", "workflowId": "nightly"}}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def write(path: Path, loops: list[dict[str, Any]], workflows: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"loops": loops, "workflows": workflows}))
    return str(path)


def changes(cli: Cli) -> list[str]:
    return [fields["type"] for _, fields in cli.redis.xrange("loopsq:changes")]


def test_workflows_are_created_then_unchanged_then_edited_in_place(cli: Cli, tmp_path: Path) -> None:
    path = write(tmp_path / "specs.json", [RUNS_FLOW], [FLOW])
    assert cli.ok("apply", "-f", path, "--dry-run") == "create workflow nightly\ncreate etl\n"
    assert cli.redis.keys("loopsq:workflow*") == []
    assert cli.json("apply", "-f", path) == [
        {"action": "create", "kind": "workflow", "name": "nightly", "changes": []},
        {"action": "create", "kind": "loop", "name": "etl", "changes": []}]
    flow = cli.json("workflows", "show", "nightly")
    assert cli.json("show", "etl")["target"]["workflowId"] == flow["id"]  # the name, stored as the id
    before = cli.state()
    assert cli.ok("apply", "-f", path) == "unchanged workflow nightly\nunchanged etl\n"
    assert cli.state() == before  # nothing written, nothing appended to the change stream
    edited = {**FLOW, "maxParallel": 2, "steps": [FLOW["steps"][0]]}
    write(tmp_path / "specs.json", [RUNS_FLOW], [edited])
    assert cli.ok("apply", "-f", path, "--dry-run") == (
        "update workflow nightly (maxParallel, steps)\nunchanged etl\n")
    assert cli.state() == before
    assert cli.ok("apply", "-f", path) == "update workflow nightly (maxParallel, steps)\nunchanged etl\n"
    after = cli.json("workflows", "show", "nightly")
    assert (after["id"], after["createdAt"], after["status"]) == (flow["id"], flow["createdAt"], "active")
    assert (after["maxParallel"], [step["id"] for step in after["steps"]]) == (2, ["a"])
    assert changes(cli).count("workflow_updated") == 1
    assert cli.ok("apply", "-f", path) == "unchanged workflow nightly\nunchanged etl\n"


def test_export_round_trips_workflows_and_the_loops_that_run_them(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "wf.json").write_text(json.dumps(SPEC))
    cli.ok("workflows", "create", str(tmp_path / "wf.json"), "--tag", "team:x")
    cli.ok("create", "workflow", "morning", "--workflow", "repo-morning", "--every", "1h")
    cli.ok("create", "command", "plain", "--every", "5m", "--cmd", "echo a")
    exported = json.loads(cli.ok("export"))
    assert [flow["name"] for flow in exported["workflows"]] == ["repo-morning"]
    assert "id" not in exported["workflows"][0] and "status" not in exported["workflows"][0]
    assert exported["loops"][0]["target"]["workflowId"] == "repo-morning"  # by name: portable
    path = tmp_path / "exported.json"
    path.write_text(json.dumps(exported))
    before = cli.state()
    assert cli.ok("apply", "-f", str(path)) == "unchanged workflow repo-morning\nunchanged morning\nunchanged plain\n"
    assert cli.state() == before
    assert json.loads(cli.ok("export", "repo-morning")) == {"loops": [], "workflows": exported["workflows"]}
    result = cli.run("export", "nothing")
    assert (result.exit_code, result.stderr) == (1, 'error: no loop or workflow is named "nothing"\n')


def test_one_bad_workflow_spec_changes_nothing_and_names_the_file_and_the_workflow(cli: Cli, tmp_path: Path) -> None:
    broken = {"name": "broken", "steps": [{"id": "a", "dependsOn": ["zz"],
                                           "target": {"type": "command", "command": "true"}}]}
    path = write(tmp_path / "s.json", [RUNS_FLOW], [FLOW, broken])
    assert bad(cli, "apply", "-f", path) == f'{path}: workflow "broken": step a depends on missing step zz'
    write(tmp_path / "s.json", [], [{**FLOW, "schedule": HOURLY}])
    assert bad(cli, "apply", "-f", path) == f'{path}: workflow "nightly": unknown workflow field: "schedule"'
    write(tmp_path / "s.json", [], [FLOW, FLOW])
    assert bad(cli, "apply", "-f", path) == f'{path}: workflow "nightly": workflow name given twice: "nightly"'
    write(tmp_path / "s.json", [RUNS_FLOW], [])
    assert bad(cli, "apply", "-f", path) == (
        f'{path}: loop "etl": target.workflowId must name a stored workflow or one of this apply\'s, got "nightly"')
    write(tmp_path / "s.json", [], [{**FLOW, "pool": "gpu"}])
    assert bad(cli, "apply", "-f", path).startswith(f'{path}: workflow "nightly": workflow.pool ')


def test_prune_archives_only_the_owners_workflows(cli: Cli, tmp_path: Path) -> None:
    path = write(tmp_path / "s.json", [], [FLOW, {**FLOW, "name": "other"}])
    cli.ok("apply", "-f", path, "--owner", "repo1")
    (tmp_path / "wf.json").write_text(json.dumps(SPEC))
    cli.ok("workflows", "create", str(tmp_path / "wf.json"))
    assert cli.json("workflows", "show", "other")["tags"] == {"apply.owner": "repo1"}
    write(tmp_path / "s.json", [], [FLOW])
    assert cli.ok("apply", "-f", path, "--owner", "repo1", "--prune") == (
        "unchanged workflow nightly\nprune workflow other\n")
    assert sorted(flow["name"] for flow in cli.json("workflows", "list")) == ["nightly", "repo-morning"]
    assert cli.ok("apply", "-f", path, "--owner", "repo1", "--prune") == "unchanged workflow nightly\n"


def test_a_directory_may_hold_a_workflow_file_as_workflows_create_takes_it(cli: Cli, tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "prompt.md").write_text("Summarise the day.\n")
    (specs / "a-flow.json").write_text(json.dumps({
        "name": "agentic", "steps": [{"id": "s", "target": {"type": "agent", "provider": "codex",
                                                            "promptFile": "prompt.md"}}]}))
    (specs / "b-loops.yaml").write_text("loops:\n  - name: daily\n    schedule: {type: interval, everyMs: 60000}\n"
                                        "    target: {type: workflow, workflowId: agentic}\n")
    assert cli.ok("apply", "-f", str(specs)) == "create workflow agentic\ncreate daily\n"
    assert cli.json("workflows", "show", "agentic")["steps"][0]["target"]["prompt"] == "Summarise the day.\n"
    assert cli.ok("apply", "-f", str(specs)) == "unchanged workflow agentic\nunchanged daily\n"
