"""``loopsq apply -f`` and ``loopsq export`` (issue 31, point 1): a plan by name; applying the same files twice
changes nothing and appends nothing; export round-trips; one bad spec changes nothing; operator state wins; prune
removes only the owner's loops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.cli_helpers import Cli, make_cli
from tests.unit.test_cli_update import bad

HOURLY = {"type": "interval", "everyMs": 3_600_000}
TARGET = {"type": "command", "command": "true", "shell": True}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def write(path: Path, loops: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"loops": loops}))
    return str(path)


def changes(cli: Cli) -> list[str]:
    return [fields["type"] for _, fields in cli.redis.xrange("loopsq:changes")]


def test_apply_plans_creates_then_is_idempotent_and_updates_only_what_changed(cli: Cli, tmp_path: Path) -> None:
    specs = [{"name": "etl", "timezone": "UTC", "schedule": HOURLY, "target": TARGET, "tags": {"team": "data"}},
             {"name": "web", "timezone": "UTC", "schedule": HOURLY, "target": TARGET, "maxAttempts": 3}]
    path = write(tmp_path / "loops.json", specs)
    assert cli.ok("apply", "-f", path, "--dry-run") == "create etl\ncreate web\n"
    assert cli.redis.keys("loopsq:loop:*") == []
    assert cli.ok("apply", "-f", path) == "create etl\ncreate web\n"
    assert cli.json("show", "web")["maxAttempts"] == 3
    before = cli.state()
    assert cli.ok("apply", "-f", path) == "unchanged etl\nunchanged web\n"
    assert cli.state() == before  # nothing written, nothing appended to the change stream
    specs[1] = {**specs[1], "schedule": {"type": "interval", "everyMs": 60_000}}
    del specs[1]["maxAttempts"]
    write(tmp_path / "loops.json", specs)
    assert cli.ok("apply", "-f", path, "--dry-run") == "unchanged etl\nupdate web (schedule, maxAttempts)\n"
    assert cli.state() == before
    assert cli.ok("apply", "-f", path) == "unchanged etl\nupdate web (schedule, maxAttempts)\n"
    web = cli.json("show", "web")
    assert (web["schedule"]["everyMs"], web["maxAttempts"]) == (60_000, 1)
    assert changes(cli).count("loop_updated") == 1


def test_export_round_trips_through_apply_unchanged(cli: Cli, tmp_path: Path) -> None:
    cli.ok("create", "command", "a", "--every", "5m", "--cmd", "echo a", "--tag", "team:x", "--attempts", "2",
           "--jitter", "30s", "--budget-runs", "5/day", "--env", "K=v")
    cli.ok("create", "agent", "b", "--cron", "0 9 * * *", "--provider", "claude", "--prompt", "hi")
    exported = cli.ok("export")
    path = tmp_path / "exported.json"
    path.write_text(exported)
    before = cli.state()
    assert cli.ok("apply", "-f", str(path)) == "unchanged a\nunchanged b\n"
    assert cli.state() == before
    assert [loop["name"] for loop in json.loads(cli.ok("export", "b"))["loops"]] == ["b"]


def test_operator_state_wins_unless_the_spec_sets_status(cli: Cli, tmp_path: Path) -> None:
    spec = {"name": "etl", "timezone": "UTC", "schedule": HOURLY, "target": TARGET}
    path = write(tmp_path / "l.json", [spec])
    cli.ok("apply", "-f", path)
    cli.ok("pause", "etl")
    assert cli.ok("apply", "-f", path) == "unchanged etl\n"
    assert cli.json("show", "etl")["status"] == "paused"
    write(tmp_path / "l.json", [{**spec, "status": "active"}])
    assert cli.ok("apply", "-f", path) == "update etl (status)\n"
    assert cli.json("show", "etl")["status"] == "active"


def test_prune_removes_only_the_owners_loops(cli: Cli, tmp_path: Path) -> None:
    spec = {"schedule": HOURLY, "target": TARGET}
    path = write(tmp_path / "l.json", [{"name": "a", **spec}, {"name": "b", **spec}])
    cli.ok("apply", "-f", path, "--owner", "repo1")
    cli.ok("create", "command", "manual", "--every", "1h", "--cmd", "true")
    assert cli.json("show", "a")["tags"] == {"apply.owner": "repo1"}
    write(tmp_path / "l.json", [{"name": "a", **spec}])
    assert cli.ok("apply", "-f", path, "--owner", "repo1", "--prune") == "unchanged a\nprune b\n"
    assert sorted(loop["name"] for loop in cli.json("list")) == ["a", "manual"]
    assert bad(cli, "apply", "-f", path, "--prune") == (
        "--prune requires --owner NAME (only loops an apply created are pruned)")


def test_one_bad_spec_changes_nothing_and_names_the_file_and_the_loop(cli: Cli, tmp_path: Path) -> None:
    good = {"name": "good", "schedule": HOURLY, "target": TARGET}
    path = write(tmp_path / "l.json", [good, {"name": "bad", "schedule": HOURLY, "target": TARGET,
                                               "maxAttempts": 0}])
    assert bad(cli, "apply", "-f", path) == (
        f'{path}: loop "bad": maxAttempts must be a positive integer, got 0')
    write(tmp_path / "l.json", [good, {"name": "x", "schedule": HOURLY, "target": TARGET, "bogus": 1}])
    assert bad(cli, "apply", "-f", path) == f'{path}: loop "x": unknown loop field: "bogus"'
    write(tmp_path / "l.json", [good, good])
    assert bad(cli, "apply", "-f", path) == f'{path}: loop "good": loop name given twice: "good"'
    (tmp_path / "broken.json").write_text("{")
    assert bad(cli, "apply", "-f", str(tmp_path / "broken.json")).startswith(
        f"{tmp_path / 'broken.json'}: not valid JSON: ")


def test_a_directory_of_json_and_yaml_files_is_applied_in_name_order(cli: Cli, tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "b.yaml").write_text("loops:\n  - name: from-yaml\n    schedule: {type: interval, everyMs: 60000}\n"
                                  "    target: {type: command, command: 'true'}\n")
    write(specs / "a.json", [{"name": "from-json", "schedule": HOURLY, "target": TARGET}])
    (specs / "notes.txt").write_text("ignored")
    assert cli.ok("apply", "-f", str(specs)) == "create from-json\ncreate from-yaml\n"
    assert cli.json("show", "from-yaml")["schedule"]["everyMs"] == 60_000
