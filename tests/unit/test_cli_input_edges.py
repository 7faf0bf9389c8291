"""Input a newcomer or a script can give by accident: bytes that are not UTF-8, a FIFO for a file, a password in
a bad Redis URL, dates and durations without their format. Each gets one ``error:`` line and exit 2, never a
traceback or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.cli_helpers import Cli, make_cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


# What Python makes of the byte 0xff in sys.argv (surrogateescape): a lone surrogate.
BAD = b"caf\xe9".decode("utf-8", "surrogateescape")

UTF8_CASES = [
    (("create", "command", BAD, "--every", "1m", "--cmd", "true"), "argument 'caf\\xe9' is not valid UTF-8"),
    (("create", "command", "x", "--every", "1m", f"--cmd={BAD}"), "--cmd value 'caf\\xe9' is not valid UTF-8"),
    (("create", "command", "x", "--every", "1m", "--cmd", BAD), "argument 'caf\\xe9' (after --cmd) is not valid UTF-8"),
    (("show", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("pause", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("resume", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("stop", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("remove", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("archive", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("rename", "a", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("run-now", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("runs", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("logs", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("list", "--name", BAD), "argument 'caf\\xe9' (after --name) is not valid UTF-8"),
    (("workflows", "validate", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("workflows", "run", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("next", BAD), "argument 'caf\\xe9' is not valid UTF-8"),
    (("pool", "set", BAD, "2"), "argument 'caf\\xe9' is not valid UTF-8"),
    ((f"--redis-url=redis://{BAD}",), "--redis-url value 'redis://caf\\xe9' is not valid UTF-8"),
    ((BAD,), "argument 'caf\\xe9' is not valid UTF-8"),
]


@pytest.mark.parametrize(("args", "message"), UTF8_CASES, ids=[str(i) for i in range(len(UTF8_CASES))])
def test_an_argument_that_is_not_utf8_gets_one_error_line_and_exit_2(
        cli: Cli, args: tuple[str, ...], message: str) -> None:
    before = cli.state()
    result = cli.run(*args)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {message}; pass UTF-8 text\n")
    assert cli.state() == before


def test_an_argument_that_is_not_utf8_is_a_json_error_with_json(cli: Cli) -> None:
    result = cli.run("--json", "show", BAD)
    assert result.exit_code == 2
    assert json.loads(result.stderr) == {"error": {
        "code": "bad_input", "exitCode": 2, "message": "argument 'caf\\xe9' is not valid UTF-8; pass UTF-8 text"}}


def test_real_argv_bytes_that_are_not_utf8_get_the_error_line_not_a_traceback(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "loopsq", b"create", b"command", b"caf\xe9", b"--cmd", b"true",
                           b"--every", b"1m"], capture_output=True, timeout=60, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8",
                               "LOOPSQ_DATA_DIR": str(tmp_path), "LOOPSQ_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert (done.returncode, done.stdout, done.stderr) == (
        2, b"", b"error: argument 'caf\\xe9' is not valid UTF-8; pass UTF-8 text\n")


# -- a FIFO for a file -----------------------------------------------------------------------------------------
@pytest.mark.timeout(20)
def test_a_fifo_given_as_a_workflow_spec_file_is_refused_at_once(cli: Cli, tmp_path: Path) -> None:
    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)  # nothing ever writes it: a plain open() would block for good
    before = cli.state()
    for command in ("validate", "create"):
        result = cli.run("workflows", command, str(fifo))
        assert (result.exit_code, result.stdout, result.stderr) == (
            2, "", f"error: workflow file is not a regular file: {fifo} (a FIFO)\n")
    assert cli.state() == before


@pytest.mark.timeout(20)
def test_a_fifo_given_as_a_prompt_file_is_refused_at_once(cli: Cli, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "prompt.md")
    before = cli.state()
    result = cli.run("create", "agent", "bot", "--provider", "claude", "--prompt-file", "prompt.md", "--every", "1h")
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", "error: --prompt-file: cannot read 'prompt.md': not a regular file (a FIFO)\n")
    assert cli.state() == before


@pytest.mark.timeout(20)
def test_a_fifo_given_as_a_step_s_prompt_file_is_refused_at_once(cli: Cli, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "step.md")
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps({"name": "w", "steps": [
        {"id": "a", "target": {"type": "agent", "provider": "claude", "promptFile": "step.md"}}]}))
    result = cli.run("workflows", "validate", str(spec))
    assert (result.exit_code, result.stderr) == (
        2, "error: workflow.steps[0].target.promptFile: cannot read 'step.md': not a regular file (a FIFO)\n")


# -- a once loop before 1970 -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("at", "timezone"), [("1969-12-31T23:59:59.999Z", "UTC"), ("1969-12-31T23:30:00", "UTC"),
                                              ("1970-01-01T00:30:00", "Europe/Paris"), ("0001-01-01", "UTC")])
def test_an_api_once_loop_before_1970_is_refused_as_bad_input(at: str, timezone: str) -> None:
    from datetime import UTC, datetime

    from loopsq.domain.loop_spec import new_loop
    from loopsq.errors import ValidationError

    body = {"name": "x", "schedule": {"type": "once", "at": at}, "timezone": timezone,
            "target": {"type": "command", "command": "true"}}
    with pytest.raises(ValidationError) as info:
        new_loop(body, datetime(2026, 1, 1, tzinfo=UTC))
    assert info.value.message == f'schedule.at must be 1970-01-02 or later, got "{at}"'
    assert info.value.exit_code == 2


def test_a_once_loop_written_the_day_after_the_epoch_is_accepted_and_the_epoch_day_is_not(cli: Cli) -> None:
    # A rule on the date as written, which the API's document can state exactly: no offset puts 1970-01-02 before
    # the epoch, and 1970-01-01 is refused whatever its time.
    assert cli.ok("create", "command", "x", "--cmd", "true", "--at", "1970-01-02T00:00:00Z").startswith(
        "created loop ")
    refused = cli.run("create", "command", "y", "--cmd", "true", "--at", "1970-01-01T12:00:00Z")
    assert (refused.exit_code, refused.stderr) == (
        2, "error: --at must be 1970-01-02 or later, got '1970-01-01T12:00:00Z'\n")
