"""How the CLI speaks when it cannot do what was asked: a group without its subcommand prints click's usage and
help on real lines (exit 2); with ``--json`` an error is one JSON object on stderr."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.cli_helpers import Cli, make_cli


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


@pytest.mark.parametrize(("path", "listed"), [([], "create"), (["create"], "command"), (["workflows"], "validate")])
def test_a_group_without_its_subcommand_prints_its_help_on_real_lines(cli: Cli, path: list[str], listed: str) -> None:
    result = cli.run(*path)
    assert result.exit_code == 2
    assert result.stdout == ""
    usage = " ".join(["loopsq", *path])
    assert result.stderr.startswith(f"Usage: {usage} [OPTIONS] COMMAND [ARGS]...\n\n")
    assert "\nCommands:\n" in result.stderr and f"\n  {listed} " in result.stderr
    assert "\\n" not in result.stderr and "error:" not in result.stderr


@pytest.mark.parametrize("args", [["--json", "show", "nope"], ["show", "nope", "--json"], ["-j", "show", "nope"]])
def test_with_json_a_not_found_error_is_one_json_object_on_stderr(cli: Cli, args: list[str]) -> None:
    result = cli.run(*args)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert json.loads(result.stderr) == {"error": {"code": "not_found", "exitCode": 1,
                                                   "message": "loop not found: nope"}}
    assert result.stderr.count("\n") == 1


def test_with_json_bad_input_and_usage_errors_are_json_too(cli: Cli) -> None:
    bad = cli.run("--json", "create", "command", "x", "--every", "0s", "--cmd", "true")
    assert bad.exit_code == 2
    assert json.loads(bad.stderr) == {"error": {"code": "bad_input", "exitCode": 2,
                                                "message": "--every: interval everyMs must be > 0, got '0s'"}}
    usage = cli.run("--json", "list", "--bogus")
    assert usage.exit_code == 2
    assert json.loads(usage.stderr)["error"] == {"code": "bad_input", "exitCode": 2,
                                                 "message": "No such option '--bogus'."}
    assert cli.state() == {}


def test_without_json_an_error_stays_one_error_line(cli: Cli) -> None:
    result = cli.run("show", "nope")
    assert (result.exit_code, result.stderr) == (1, "error: loop not found: nope\n")


def test_a_json_flag_after_a_double_dash_is_not_the_flag(cli: Cli) -> None:
    from loopsq.cli import _wants_json

    assert _wants_json(["create", "command", "x", "--", "-j"]) is False
    assert _wants_json(["runs", "-j"]) is True
