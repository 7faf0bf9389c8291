"""``loopsq workflows ...`` and workflow loops."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.unit.cli_helpers import Cli, make_cli

ID = r"[0-9a-f]{12}"

SPEC = {
    "name": "repo-morning",
    "description": "optional",
    "version": 1,
    "steps": [
        {"id": "status", "target": {"type": "command", "command": "git", "args": ["status", "--short"], "cwd": "/repo"}},
        {"id": "lint", "dependsOn": ["status"], "continueOnFailure": True, "timeoutMs": 60000,
         "target": {"type": "command", "command": "bun run lint", "shell": True}},
        {"id": "review", "dependsOn": ["status", "lint"], "account": {"profile": "work", "tool": "codex"},
         "target": {"type": "agent", "provider": "codex", "cwd": "/repo",
                    "prompt": "Review the repository status and summarize next actions."}},
    ],
}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(SPEC))
    return path


def test_validate_prints_name_and_step_count_and_stores_nothing(cli: Cli, spec_file: Path) -> None:
    assert cli.ok("workflows", "validate", str(spec_file)) == "valid workflow repo-morning steps=3\n"
    assert cli.redis.keys("*") == []


def test_validate_json_shows_the_normalised_spec_with_id_validation(cli: Cli, spec_file: Path) -> None:
    out = cli.json("workflows", "validate", str(spec_file), "--name", "other")
    assert out["valid"] is True
    assert out["workflow"]["id"] == "validation"
    assert out["workflow"]["name"] == "other"
    assert out["workflow"]["steps"][0]["dependsOn"] == []
    assert out["workflow"]["steps"][0]["continueOnFailure"] is False


def test_create_list_show_archive(cli: Cli, spec_file: Path) -> None:
    out = cli.ok("workflows", "create", str(spec_file))
    match = re.fullmatch(rf"created workflow ({ID}) \(repo-morning\) steps=3\n", out)
    assert match
    wf_id = match.group(1)
    assert cli.ok("workflows", "list") == f"{wf_id}  active    steps=3  repo-morning\n"
    shown = cli.json("workflows", "show", "repo-morning")
    assert shown["id"] == wf_id and shown["status"] == "active" and shown["version"] == 1
    assert cli.ok("workflow", "archive", "repo-morning") == f"{wf_id} archived\n"
    assert cli.ok("workflows", "ls") == ""
    assert cli.ok("workflows", "list", "--status", "archived") == f"{wf_id}  archived  steps=3  repo-morning\n"
    assert cli.json("workflows", "show", wf_id)["status"] == "archived"
    result = cli.run("workflows", "show", "repo-morning")
    assert (result.exit_code, result.stderr) == (1, "error: workflow not found: repo-morning\n")


def test_an_active_name_is_unique_but_an_archived_one_may_be_reused(cli: Cli, spec_file: Path) -> None:
    first = cli.json("workflows", "create", str(spec_file))
    result = cli.run("workflows", "create", str(spec_file))
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: an active workflow is already named repo-morning ({first['id']}); archive it first\n"
    )
    cli.ok("workflows", "archive", first["id"])
    second = cli.json("workflows", "create", str(spec_file))
    assert second["id"] != first["id"]
    assert [w["id"] for w in cli.json("workflows", "list", "--status", "all")] != []


def test_create_workflow_loop_resolves_the_workflow_by_name(cli: Cli, spec_file: Path) -> None:
    spec = cli.json("workflows", "create", str(spec_file))
    out = cli.ok("create", "workflow", "morning", "--workflow", "repo-morning", "--cron", "0 9 * * *",
                 "--timeout", "10m")
    assert re.fullmatch(
        rf"created workflow loop {ID} \(morning\) workflow=repo-morning next=2026-01-01T09:00:00\.000Z\n", out
    )
    loop = cli.json("show", "morning")
    assert loop["target"] == {"type": "workflow", "workflowId": spec["id"], "timeoutMs": 600000}


def test_create_workflow_loop_with_an_unknown_workflow_is_not_found(cli: Cli) -> None:
    before = cli.state()
    result = cli.run("create", "workflow", "w", "--workflow", "nope", "--every", "1m")
    assert (result.exit_code, result.stderr) == (1, "error: workflow not found: nope\n")
    assert cli.state() == before


def test_workflow_show_redacts_long_agent_prompts(cli: Cli, tmp_path: Path) -> None:
    spec = json.loads(json.dumps(SPEC))
    spec["steps"][2]["target"]["prompt"] = "x" * 90
    path = tmp_path / "long.json"
    path.write_text(json.dumps(spec))
    cli.ok("workflows", "create", str(path))
    shown = cli.json("workflows", "show", "repo-morning")
    assert shown["steps"][2]["target"]["prompt"] == "x" * 80 + "... [redacted 10 chars]"
    assert shown["steps"][0]["target"]["command"] == "git"
