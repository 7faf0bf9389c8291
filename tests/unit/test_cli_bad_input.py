"""Bad input: one line naming the field and the value, exit status 2, and nothing written anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.cli_helpers import Cli, make_cli

BASE = ("create", "command", "hello", "--cmd", "echo hi")
TIME_HINT = ("use an ISO-8601 time such as 2026-01-31T09:00, 2026-01-31T09:00:00Z or 2026-01-31 (without an offset: "
             "in --timezone)")


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    cli = make_cli(tmp_path, monkeypatch)
    cli.ok("create", "command", "existing", "--every", "1m", "--cmd", "true")
    return cli


CASES = [
    (BASE, "choose exactly one schedule: --at, --every, --cron, or --dynamic"),
    ((*BASE, "--every", "10s", "--cron", "* * * * *"), "choose exactly one schedule: --at, --every, --cron, or --dynamic"),
    ((*BASE, "--every", "10x"), "--every: invalid duration: 10x"),
    ((*BASE, "--every", "1h30m"), "--every: invalid duration: 1h30m"),
    ((*BASE, "--every", "0"), "--every: interval everyMs must be > 0, got '0'"),
    ((*BASE, "--cron", "* * *"), '--cron: cron must have 5 fields, got 3: "* * *"'),
    ((*BASE, "--cron", "61 * * * *"), '--cron: invalid cron expression: "61 * * * *"'),
    ((*BASE, "--cron", "0 0 31 2 *"), '--cron: cron expression never matches: "0 0 31 2 *"'),
    ((*BASE, "--at", "tomorrow"), f"invalid schedule.at: tomorrow: {TIME_HINT}"),
    ((*BASE, "--at", "tomorrow 9am"), f"invalid schedule.at: tomorrow 9am: {TIME_HINT}"),
    ((*BASE, "--at", "1969-12-31T23:59:59Z"), "--at must be 1970-01-02 or later, got '1969-12-31T23:59:59Z'"),
    ((*BASE, "--at", "1900-01-01", "--timezone", "UTC"), "--at must be 1970-01-02 or later, got '1900-01-01'"),
    ((*BASE, "--every", "5"), "--every must be at least 1s, got '5' (a number without a unit is milliseconds: write "
                              "5s or 5m)"),
    ((*BASE, "--every", "999"), "--every must be at least 1s, got '999' (a number without a unit is milliseconds: "
                                "write 999s or 999m)"),
    ((*BASE, "--every", "5ms"), "--every must be at least 1s, got '5ms'"),
    ((*BASE, "--every", "1m", "--timezone", "Mars/Base"), "--timezone: unknown timezone: Mars/Base"),
    ((*BASE, "--every", "1m", "--catch-up", "sometimes"), "--catch-up must be none, latest, or all, got 'sometimes'"),
    ((*BASE, "--every", "1m", "--catch-up-limit", "0"), "--catch-up-limit must be a positive integer, got '0'"),
    ((*BASE, "--every", "1m", "--overlap", "queue"), "--overlap must be skip, allow, or replace, got 'queue'"),
    ((*BASE, "--every", "1m", "--attempts", "-1"), "--attempts must be a positive integer, got '-1'"),
    ((*BASE, "--every", "1m", "--retry-delay", "0s"), "--retry-delay must be greater than zero, got '0s'"),
    ((*BASE, "--every", "1m", "--retry-delay", "soon"), "--retry-delay: invalid duration: soon"),
    ((*BASE, "--every", "1m", "--lease", "0"), "--lease must be greater than zero, got '0'"),
    ((*BASE, "--every", "1m", "--timeout", "0"), "--timeout must be greater than zero, got '0'"),
    ((*BASE, "--every", "1m", "--retry-backoff", "linear"), "--retry-backoff must be fixed or exponential, got 'linear'"),
    ((*BASE, "--every", "1m", "--retry-max-delay", "1h"),
     "--retry-max-delay requires --retry-backoff exponential, got '1h'"),
    ((*BASE, "--every", "1m", "--expires-at", "never"), f"invalid --expires-at: never: {TIME_HINT}"),
    ((*BASE, "--every", "1m", "--account-tool", "codex"), "--account-tool requires --account"),
    ((*BASE, "--every", "1m", "--no-shell"),
     "--cmd must be an executable without spaces when --no-shell is given; drop --no-shell or use a script, "
     "got 'echo hi'"),
    (("create", "command", " ", "--every", "1m", "--cmd", "true"), 'loop name must not be empty, got " "'),
    (("create", "command", "existing", "--every", "1m", "--cmd", "true"), "loop name already exists: existing"),
    (("create", "agent", "a", "--every", "1m", "--provider", "gpt", "--prompt", "x"),
     "--provider: unsupported provider: gpt (use one of claude, cursor, codewith, aicopilot, opencode, codex)"),
    (("create", "agent", "a", "--every", "1m", "--provider", "claude", "--prompt", "x", "--config-isolation", "max"),
     "--config-isolation must be safe or none, got 'max'"),
    (("create", "agent", "a", "--every", "1m", "--provider", "claude", "--prompt", "x", "--prompt-via", "file"),
     "--prompt-via must be argv or stdin, got 'file'"),
    ((*BASE, "--every", "1m", "--env", "NOEQUALS"),
     "--env must be KEY=VALUE with KEY matching [A-Za-z_][A-Za-z0-9_]*, got 'NOEQUALS'"),
    ((*BASE, "--every", "1m", "--env", "1BAD=x"),
     "--env must be KEY=VALUE with KEY matching [A-Za-z_][A-Za-z0-9_]*, got '1BAD=x'"),
    ((*BASE, "--every", "1m", "--env", "=x"), "--env must be KEY=VALUE with KEY matching [A-Za-z_][A-Za-z0-9_]*, got '=x'"),
    ((*BASE, "--every", "1m", "--env", "A-B=x"),
     "--env must be KEY=VALUE with KEY matching [A-Za-z_][A-Za-z0-9_]*, got 'A-B=x'"),
    ((*BASE, "--every", "1m", "--env", "A=x\0y"), "--env value of A must not contain NUL, got 'A=x\\x00y'"),
    ((*BASE, "--every", "1m", "--env", "A=1", "--env", "A=2"), "--env sets A twice, got 'A=2'"),
    (("create", "agent", "a", "--every", "1m", "--provider", "claude", "--prompt", "x", "--env", "K"),
     "--env must be KEY=VALUE with KEY matching [A-Za-z_][A-Za-z0-9_]*, got 'K'"),
    (("create", "command", "x", "--every", "1m"), "Missing option '--cmd'."),
    ((*BASE, "--every", "1m", "--bogus"), "No such option '--bogus'."),
    (("list", "--status", "gone"), "--status must be one of active, paused, stopped, expired, got 'gone'"),
    (("frobnicate",), "No such command 'frobnicate'."),
    ((*BASE, "--every", "1m", "--keep-runs", "0"), "--keep-runs must be a positive integer, got '0'"),
    ((*BASE, "--every", "1m", "--keep-runs", "-3"), "--keep-runs must be a positive integer, got '-3'"),
    ((*BASE, "--every", "1m", "--keep-runs", "lots"), "--keep-runs must be a positive integer, got 'lots'"),
    ((*BASE, "--every", "1m", "--keep-runs", "2.5"), "--keep-runs must be a positive integer, got '2.5'"),
    (("create", "workflow", "w", "--every", "1m", "--workflow", "x", "--keep-runs", "0"),
     "--keep-runs must be a positive integer, got '0'"),
    (("prune", "--older-than", "soon"), "--older-than: invalid duration: soon"),
    (("prune", "--older-than", "0"), "--older-than must be greater than zero, got '0'"),
    (("prune", "--older-than", "-7d"), "--older-than: invalid duration: -7d"),
    (("prune", "--older-than", "30d", "--loop", "existing", "--older-than", "1h30m"),
     "--older-than: invalid duration: 1h30m"),
    (("prune",), "Missing option '--older-than'."),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a[3:] or a)[:60] for a, _ in CASES])
def test_bad_input_gets_one_line_exit_2_and_writes_nothing(cli: Cli, args: tuple[str, ...], message: str) -> None:
    before = cli.state()
    result = cli.run(*args)
    assert result.stderr == f"error: {message}\n"
    assert result.exit_code == 2
    assert result.stdout == ""
    assert cli.state() == before


def test_bad_input_is_reported_before_redis_is_contacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli = make_cli(tmp_path, monkeypatch)

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("redis must not be contacted for bad input")

    monkeypatch.setattr("loopsq.cli.app.connect", refuse)
    result = cli.run(*BASE, "--every", "10x")
    assert (result.exit_code, result.stderr) == (2, "error: --every: invalid duration: 10x\n")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "workflow file not found: {path}"),
        ("{not json", "workflow file is not valid JSON: {path}: "),
        ("[]", "workflow file must be an object"),
        ('{"name": "w", "steps": []}', "workflow.steps must contain at least one step"),
        ('{"name": "w", "steps": [{"id": "a", "target": {"type": "command", "command": "x"}, "dependsOn": "b"}]}',
         'workflow.steps[0].dependsOn must be an array of step ids, got "b"'),
    ],
)
def test_bad_workflow_files_are_refused_and_nothing_is_stored(
    cli: Cli, tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "wf.json"
    if content is not None:
        path.write_text(content)
    before = cli.state()
    for command in ("validate", "create"):
        result = cli.run("workflows", command, str(path))
        assert result.exit_code == 2, result.stderr
        assert result.stderr.startswith("error: " + message.format(path=path))
        assert result.stderr.count("\n") == 1
    assert cli.state() == before


def test_redis_unreachable_is_one_line_with_the_password_masked_and_exit_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from loopsq.cli import cli as root
    from tests.redis_server import free_port

    port = free_port()
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "d"))
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    result = CliRunner().invoke(root, ["--redis-url", url, "list"])
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: cannot reach Redis at redis://:***@127.0.0.1:{port}/0: ")
    assert result.stderr.count("\n") == 1
    assert "s3cret" not in result.stderr + result.stdout


def test_json_error_output_is_one_json_line_on_stderr(cli: Cli) -> None:
    result = cli.run("--json", "show", "nope")
    assert (result.exit_code, result.stdout, result.stderr.count("\n")) == (1, "", 1)
    assert json.loads(result.stderr) == {"error": {"code": "not_found", "exitCode": 1,
                                                   "message": "loop not found: nope"}}


def test_a_value_with_a_line_break_still_gives_one_error_line(cli: Cli) -> None:
    result = cli.run(*BASE, "--every", "1\ns")
    assert (result.exit_code, result.stderr) == (2, "error: --every: invalid duration: 1\\x0as\n")
