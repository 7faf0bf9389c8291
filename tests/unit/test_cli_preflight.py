"""``--preflight`` refuses a target that cannot start, and stores nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.cli_helpers import Cli, make_cli


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def test_a_missing_executable_is_refused_and_nothing_is_stored(cli: Cli) -> None:
    before = cli.state()
    result = cli.run("create", "command", "x", "--every", "1m", "--cmd", "no-such-binary-xyz", "--no-shell",
                     "--preflight")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: preflight failed: Executable not found in PATH: no-such-binary-xyz")
    assert result.stderr.count("\n") == 1
    assert cli.state() == before


def test_a_present_executable_passes_preflight_and_is_stored(cli: Cli) -> None:
    loop = cli.json("create", "command", "x", "--every", "1m", "--cmd", "true", "--no-shell", "--preflight")
    assert loop["target"] == {"type": "command", "command": "true", "shell": False, "timeoutMs": 1800000}


def test_an_agent_whose_provider_cli_is_missing_is_refused(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    result = cli.run("create", "agent", "bot", "--every", "1h", "--provider", "claude", "--prompt", "hi",
                     "--preflight")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: preflight failed: Executable not found in PATH: claude")


def test_workflow_validate_preflight_names_the_failing_step(cli: Cli, tmp_path: Path) -> None:
    spec = {"name": "w", "steps": [
        {"id": "ok", "target": {"type": "command", "command": "true"}},
        {"id": "bad", "dependsOn": ["ok"], "target": {"type": "command", "command": "no-such-binary-xyz"}},
    ]}
    path = tmp_path / "w.json"
    path.write_text(json.dumps(spec))
    result = cli.run("workflows", "validate", str(path), "--preflight")
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "error: preflight failed for workflow step bad: Executable not found in PATH: no-such-binary-xyz"
    )
    spec["steps"][1]["target"]["command"] = "true"  # type: ignore[index]
    path.write_text(json.dumps(spec))
    out = cli.json("workflows", "validate", str(path), "--preflight")
    assert [p["stepId"] for p in out["preflight"]] == ["ok", "bad"]
