"""The CLI's bounds: every text flag over its bound, with a control character, a documented minimum or a page size
out of range gets one ``error:`` line naming the flag and a short escaped prefix, exit 2, and writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopsq.domain.text import shown
from tests.unit.cli_helpers import Cli, make_cli

BASE = ("create", "command", "hello", "--cmd", "echo hi", "--every", "1m")
EVIL = "gpt\x1b[31m" * 20  # an escape sequence that would colour a terminal
AGENT = ("create", "agent", "bot", "--every", "1h", "--provider", "claude", "--prompt", "hi")


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    cli = make_cli(tmp_path, monkeypatch)
    cli.ok("create", "command", "existing", "--every", "1m", "--cmd", "true")
    return cli


def cut(char: str, total: int) -> str:
    """How a message quotes ``char * total``: the first 64 characters and how many more there were."""
    return f"{char * 64}… ({total - 64} more characters)"


CASES = [
    (("create", "command", "n" * 201, "--cmd", "true", "--every", "1m"),
     f'name must be at most 200 characters, got "{cut("n", 201)}"'),
    (("create", "command", "ok1\u200b", "--cmd", "true", "--every", "1m"),
     'name must not contain control, format, bidi or zero-width characters (U+200B at position 4), got "ok1\\u200b"'),
    (("create", "command", "a\u202eb", "--cmd", "true", "--every", "1m"),
     'name must not contain control, format, bidi or zero-width characters (U+202E at position 2), got "a\\u202eb"'),
    (("create", "command", "a\x7f", "--cmd", "true", "--every", "1m"),
     'name must not contain control, format, bidi or zero-width characters (U+007F at position 2), got "a\\x7f"'),
    (("create", "command", "x", "--cmd", "c" * 16_385, "--every", "1m"),
     f"--cmd must be at most 16384 characters, got '{cut('c', 16_385)}'"),
    (("create", "command", "x", "--cmd", "true\x00", "--every", "1m"),
     "--cmd must not contain NUL characters, got 'true\\x00'"),
    ((*BASE, "--cwd", "/" * 4097), f"--cwd must be at most 4096 characters, got '{cut('/', 4097)}'"),
    ((*BASE, "-d", "d" * 4097), f"--description must be at most 4096 characters, got '{cut('d', 4097)}'"),
    ((*BASE, "--timezone", "Z" * 65), f"--timezone must be at most 64 characters, got '{cut('Z', 65)}'"),
    (("create", "command", "x", "--cmd", "true", "--at", "2" * 65),
     f"--at must be at most 64 characters, got '{cut('2', 65)}'"),
    ((*BASE, "--expires-at", "2" * 65), f"--expires-at must be at most 64 characters, got '{cut('2', 65)}'"),
    (("create", "command", "x", "--cmd", "true", "--cron", "* " * 200),
     f'--cron: cron expression must be at most 256 characters, got "{"* " * 32}… (336 more characters)"'),
    (("create", "command", "x", "--cmd", "true", "--every", "9" * 100_000),
     f"--every: invalid duration: {cut('9', 100_000)}"),
    ((*BASE, "--account", "p" * 201), f"--account must be at most 200 characters, got '{cut('p', 201)}'"),
    ((*BASE, "--account", "p", "--account-tool", "t\x00"), "--account-tool must not contain NUL characters, got 't\\x00'"),
    ((*AGENT[:-1], "p" * 32_001), f"--prompt must be at most 32000 characters, got '{cut('p', 32_001)}'"),
    ((*AGENT, "--model", "m" * 201), f"--model must be at most 200 characters, got '{cut('m', 201)}'"),
    ((*AGENT, "--agent", "a\x00"), "--agent must not contain NUL characters, got 'a\\x00'"),
    ((*AGENT, "--extra-arg", "e" * 4097), f"--extra-arg must be at most 4096 characters, got '{cut('e', 4097)}'"),
    ((*AGENT, *["--extra-arg", "e"] * 257), "--extra-arg may be given at most 256 times, got 257"),
    (("create", "agent", "bot", "--every", "1h", "--provider", EVIL, "--prompt", "hi"),
     f"--provider: unsupported provider: {shown(EVIL)} (use one of claude, cursor, codewith, aicopilot, opencode, "
     "codex)"),
    # documented minimums
    (("create", "command", "x", "--cmd", "true", "--every", "1ms"), "--every must be at least 1s, got '1ms'"),
    (("create", "command", "x", "--cmd", "true", "--every", "10"),
     "--every must be at least 1s, got '10' (a number without a unit is milliseconds: write 10s or 10m)"),
    (("create", "command", "x", "--cmd", "true", "--every", "999ms"), "--every must be at least 1s, got '999ms'"),
    ((*BASE, "--lease", "1ms"), "--lease must be at least 5s, got '1ms'"),
    ((*BASE, "--lease", "4.9s"), "--lease must be at least 5s, got '4.9s'"),
    # counts
    ((*BASE, "--attempts", "10001"), "--attempts must be at most 10000, got '10001'"),
    ((*BASE, "--catch-up-limit", "9" * 30), f"--catch-up-limit must be at most 10000, got '{'9' * 30}'"),
    ((*BASE, "--attempts", "²"), "--attempts must be a positive integer, got '²'"),
    ((*BASE, "--pause-after-failures", "-1"),
     "--pause-after-failures must be a whole number (0 turns the circuit breaker off), got '-1'"),
    ((*BASE, "--pause-after-failures", "10001"), "--pause-after-failures must be at most 10000, got '10001'"),
    ((*BASE, "--expires-after-runs", "0"), "--expires-after-runs must be a positive integer, got '0'"),
    ((*BASE, "--expires-after-runs", "10001"), "--expires-after-runs must be at most 10000, got '10001'"),
    # page sizes, as in the API
    (("runs", "--limit", "99999999999999999999"), "--limit must be at most 1000, got '99999999999999999999'"),
    (("runs", "--limit", "1001"), "--limit must be at most 1000, got '1001'"),
    (("runs", "--limit", "0"), "--limit must be a positive integer, got '0'"),
    (("workflows", "runs", "--limit", "1001"), "--limit must be at most 1000, got '1001'"),
    (("workflows", "events", "r1", "--limit", "10001"), "--limit must be at most 10000, got '10001'"),
    # triggers and reasons
    (("trigger", "existing", "--key", "k" * 201), f"--key must be at most 200 characters, got '{cut('k', 201)}'"),
    (("trigger", "existing", "--key", "k\n1"),
     "--key must not contain control, format, bidi or zero-width characters (U+000A at position 2), got 'k\\x0a1'"),
    (("workflows", "cancel", "r1", "--reason", "r" * 501),
     f"--reason must be at most 500 characters, got '{cut('r', 501)}'"),
    (("workflows", "recover", "r1", "--reason", "r" * 501),
     f"--reason must be at most 500 characters, got '{cut('r', 501)}'"),
    (("show", "x" * 1000), f"loop not found: {cut('x', 1000)}"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_flags_get_one_line_naming_the_flag_and_a_short_prefix_and_write_nothing(
        cli: Cli, args: tuple[str, ...], message: str) -> None:
    before = cli.state()
    result = cli.run(*args)
    assert result.stderr == f"error: {message}\n"
    assert result.exit_code == (1 if message.startswith("loop not found") else 2)
    assert result.stdout == ""
    assert cli.state() == before


def test_values_at_the_bounds_are_accepted(cli: Cli) -> None:
    loop = cli.json("create", "command", "n" * 200, "--cmd", "c" * 16_384, "--every", "1s", "--lease", "5s",
                    "-d", "d" * 4096, "--attempts", "10000")
    assert (loop["schedule"]["everyMs"], loop["leaseMs"], loop["maxAttempts"]) == (1000, 5000, 10_000)
    agent = cli.json(*AGENT[:-1], "p" * 32_000, "--extra-arg", "e" * 4096)
    assert agent["target"]["extraArgs"] == ["e" * 4096]
    assert cli.run("runs", "--limit", "500").exit_code == 0
    assert cli.run("trigger", "existing", "--key", "k" * 200).exit_code == 0


def test_the_trigger_key_bound_is_the_apis(cli: Cli) -> None:
    from loopsq.domain.limits import MAX_IDEMPOTENCY_KEY_LENGTH
    from loopsq.web.api import MAX_KEY_LENGTH

    assert MAX_KEY_LENGTH == MAX_IDEMPOTENCY_KEY_LENGTH == 200


def test_preflight_checks_the_working_directory(cli: Cli, tmp_path: Path) -> None:
    before = cli.state()
    missing = tmp_path / "nowhere"
    a_file = tmp_path / "file"
    a_file.write_text("")
    for cwd, problem in ((missing, "working directory not found"), (a_file, "working directory is not a directory")):
        result = cli.run("create", "command", "x", "--every", "1m", "--cmd", "true", "--cwd", str(cwd), "--preflight")
        assert (result.exit_code, result.stderr) == (2, f"error: preflight failed: {problem}: {cwd}\n")
        agent = cli.run(*AGENT, "--cwd", str(cwd), "--preflight")
        assert agent.stderr.startswith(f"error: preflight failed: {problem}: {cwd}\n")
    assert cli.state() == before
    assert cli.json("create", "command", "x", "--every", "1m", "--cmd", "true", "--cwd", str(tmp_path),
                    "--preflight")["target"]["cwd"] == str(tmp_path)


def test_preflight_refuses_a_working_directory_it_cannot_enter(cli: Cli, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o600)
    # Root enters any directory, so there (CI runs as root) the check is made to see what an unprivileged user does.
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, *a, **k: False if str(path) == str(locked) and mode == os.X_OK
                        else real_access(path, mode, *a, **k))
    result = cli.run("create", "command", "x", "--every", "1m", "--cmd", "true", "--cwd", str(locked), "--preflight")
    assert result.stderr == f"error: preflight failed: working directory is not accessible: {locked}\n"


def test_a_workflow_step_cwd_is_preflighted_too(cli: Cli, tmp_path: Path) -> None:
    import json

    path = tmp_path / "w.json"
    path.write_text(json.dumps({"name": "w", "steps": [
        {"id": "a", "target": {"type": "command", "command": "true", "cwd": str(tmp_path / "gone")}}]}))
    result = cli.run("workflows", "validate", str(path), "--preflight")
    assert result.stderr == (f"error: preflight failed for workflow step a: working directory not found: "
                             f"{tmp_path / 'gone'}\n")


def test_spec_files_are_read_with_a_bound(cli: Cli, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.truncate(100 * 1024 * 1024)
    before = cli.state()
    for command in ("validate", "create"):
        result = cli.run("workflows", command, str(big))
        assert (result.exit_code, result.stderr) == (2, f"error: workflow file is larger than 1048576 bytes: "
                                                        f"{big}\n")
        result = cli.run("workflows", command, "/dev/zero")
        assert (result.exit_code, result.stderr) == (2, "error: workflow file is not a regular file: /dev/zero "
                                                        "(a character device)\n")
    assert cli.state() == before
