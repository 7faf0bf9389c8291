"""Tags (issue 31, point 3): ``--tag KEY:VALUE`` on create and update, ``--untag``; ``list --tag`` and
``runs --tag`` keep only what carries every tag given (AND); bounds and characters refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopsq.errors import ValidationError
from tests.unit.cli_helpers import Cli, make_cli
from tests.unit.test_cli_update import bad

FORMAT = "KEY:VALUE, each of [A-Za-z0-9_./-] (key at most 64, value at most 128 characters)"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def names(cli: Cli, *args: str) -> list[str]:
    return sorted(loop["name"] for loop in cli.json("list", *args))


def test_tags_are_stored_sorted_shown_and_filter_list_with_and(cli: Cli) -> None:
    made = cli.json("create", "command", "etl", "--every", "1h", "--cmd", "true", "--tag", "team:data",
                    "--tag", "env:prod")
    assert made["tags"] == {"env": "prod", "team": "data"}
    assert json.loads(cli.redis.get(f"loopsq:loop:{made['id']}"))["tags"] == {"env": "prod", "team": "data"}
    cli.ok("create", "command", "web", "--every", "1h", "--cmd", "true", "--tag", "team:web", "--tag", "env:prod")
    cli.ok("create", "agent", "bot", "--every", "1h", "--provider", "claude", "--prompt", "p", "--tag", "team:data")
    cli.ok("create", "command", "plain", "--every", "1h", "--cmd", "true")
    assert cli.json("show", "etl")["tags"] == {"env": "prod", "team": "data"}
    assert names(cli, "--tag", "team:data") == ["bot", "etl"]
    assert names(cli, "--tag", "env:prod") == ["etl", "web"]
    assert names(cli, "--tag", "env:prod", "--tag", "team:data") == ["etl"]
    assert names(cli, "--tag", "env:dev") == []
    assert names(cli) == ["bot", "etl", "plain", "web"]


def test_runs_tag_keeps_the_runs_of_matching_loops(cli: Cli) -> None:
    cli.ok("create", "command", "etl", "--every", "1h", "--cmd", "true", "--tag", "team:data")
    cli.ok("create", "command", "web", "--every", "1h", "--cmd", "true", "--tag", "team:web")
    cli.ok("run-now", "etl", "--local")
    cli.ok("run-now", "web", "--local")
    assert [r["loopName"] for r in cli.json("runs", "--tag", "team:data")] == ["etl"]
    assert [r["loopName"] for r in cli.json("runs", "--tag", "team:web", "--tag", "x:y")] == []
    assert sorted(r["loopName"] for r in cli.json("runs")) == ["etl", "web"]


def test_update_adds_changes_and_removes_tags(cli: Cli) -> None:
    cli.ok("create", "command", "etl", "--every", "1h", "--cmd", "true", "--tag", "team:data", "--tag", "env:dev")
    assert cli.json("update", "etl", "--tag", "env:prod", "--tag", "tier:1")["tags"] == {
        "env": "prod", "team": "data", "tier": "1"}
    assert cli.json("update", "etl", "--untag", "tier", "--untag", "env")["tags"] == {"team": "data"}
    assert "tags" not in cli.json("update", "etl", "--untag", "team")
    assert names(cli, "--tag", "team:data") == []


def test_bad_tags_are_one_line_naming_the_flag_and_value(cli: Cli) -> None:
    create = ("create", "command", "etl", "--every", "1h", "--cmd", "true")
    assert bad(cli, *create, "--tag", "team") == f"--tag must be {FORMAT}, got 'team'"
    assert bad(cli, *create, "--tag", "team:da ta") == f"--tag must be {FORMAT}, got 'team:da ta'"
    assert bad(cli, *create, "--tag", ":x") == f"--tag must be {FORMAT}, got ':x'"
    assert bad(cli, *create, "--tag", "k:") == f"--tag must be {FORMAT}, got 'k:'"
    assert bad(cli, *create, "--tag", f"{'k' * 65}:v").startswith(f"--tag must be {FORMAT}, got 'kkk")
    long_value = "v" * 129
    assert bad(cli, *create, "--tag", f"k:{long_value}").startswith(f"--tag must be {FORMAT}, got 'k:vvv")
    assert bad(cli, *create, "--tag", "a:1", "--tag", "a:2") == "--tag gives a twice, got 'a:2'"
    many = [arg for i in range(21) for arg in ("--tag", f"k{i}:v")]
    assert bad(cli, *create, *many) == "--tag may be given at most 20 times, got 21"
    assert bad(cli, "list", "--tag", "nope") == f"--tag must be {FORMAT}, got 'nope'"
    assert bad(cli, "runs", "--tag", "a b:c") == f"--tag must be {FORMAT}, got 'a b:c'"
    cli.ok(*create, "--tag", "team:data")
    assert bad(cli, "update", "etl", "--untag", "env") == "--untag names no tag of the loop, got 'env'"
    many = [arg for i in range(20) for arg in ("--tag", f"k{i}:v")]
    assert bad(cli, "update", "etl", *many) == (
        "tags must be an object of at most 20 key: value strings, got 21 tags")


def test_workflows_take_tags_from_the_file_and_the_flag_and_list_filters_them(cli: Cli, tmp_path: Path) -> None:
    spec = {"name": "etl", "tags": {"team": "data", "env": "dev"},
            "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(spec))
    made = cli.json("workflows", "create", str(path), "--tag", "env:prod")
    assert made["tags"] == {"env": "prod", "team": "data"}
    path.write_text(json.dumps({**spec, "name": "other", "tags": None}))
    cli.ok("workflows", "create", str(path))
    assert [w["name"] for w in cli.json("workflows", "list", "--tag", "team:data")] == ["etl"]
    assert [w["name"] for w in cli.json("workflows", "list", "--tag", "env:dev")] == []
    assert sorted(w["name"] for w in cli.json("workflows", "list")) == ["etl", "other"]
    path.write_text(json.dumps({**spec, "name": "bad", "tags": {"a b": "c"}}))
    assert bad(cli, "workflows", "create", str(path)) == (
        'workflow.tags key must be 1 to 64 characters of [A-Za-z0-9_./-], got "a b"')
    path.write_text(json.dumps({**spec, "name": "bad", "tags": ["x"]}))
    assert bad(cli, "workflows", "create", str(path)) == (
        'workflow.tags must be an object of at most 20 key: value strings, got ["x"]')
    assert bad(cli, "workflows", "list", "--tag", "x") == f"--tag must be {FORMAT}, got 'x'"


def test_a_filter_given_two_values_of_one_key_matches_nothing_where_a_flag_is_refused() -> None:
    from loopsq.domain.tags import NO_MATCH, matches, parse_tags

    wanted = parse_tags(["team:a", "team:b"], "tag", filtering=True)
    assert wanted == {"team": NO_MATCH}
    assert not matches({"team": "a"}, wanted) and not matches({"team": "b"}, wanted)
    with pytest.raises(ValidationError, match="tag gives team twice"):
        parse_tags(["team:a", "team:b"], "tag")
