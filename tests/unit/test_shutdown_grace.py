"""The worker's default grace fits the process manager's kill timeout: LOOPSQ_KILL_TIMEOUT, else 30 s on Heroku,
else honcho's 5 s; the grace ends 2.5 s before it (the target's SIGTERM-to-SIGKILL escalation, then the record)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.ops.shutdown import grace_for, kill_timeout_ms


@pytest.mark.parametrize(
    ("env", "kill", "source", "grace"),
    [
        ({}, 5000, "LOOPSQ_KILL_TIMEOUT unset (honcho's)", 2500),
        ({"DYNO": "web.1"}, 30_000, "DYNO is set (Heroku)", 27_500),
        ({"LOOPSQ_KILL_TIMEOUT": "30s"}, 30_000, "LOOPSQ_KILL_TIMEOUT", 27_500),
        ({"LOOPSQ_KILL_TIMEOUT": "10s", "DYNO": "worker.1"}, 10_000, "LOOPSQ_KILL_TIMEOUT", 7500),
        ({"LOOPSQ_KILL_TIMEOUT": "2s"}, 2000, "LOOPSQ_KILL_TIMEOUT", 500),
        ({"LOOPSQ_KILL_TIMEOUT": ""}, 5000, "LOOPSQ_KILL_TIMEOUT unset (honcho's)", 2500),
    ],
)
def test_the_grace_is_derived_from_the_kill_timeout(env: dict[str, str], kill: int, source: str, grace: int) -> None:
    assert kill_timeout_ms(env) == (kill, source)
    assert grace_for(kill) == grace


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("soon", "LOOPSQ_KILL_TIMEOUT: invalid duration: soon"),
        ("0s", "LOOPSQ_KILL_TIMEOUT must be greater than zero, got '0s'"),
        # A bare number would be milliseconds (30 ms: no grace at all), where a process manager means seconds.
        ("30", "LOOPSQ_KILL_TIMEOUT needs a unit (a bare number would be milliseconds): write 30s, got '30'"),
        ("2.5", "LOOPSQ_KILL_TIMEOUT needs a unit (a bare number would be milliseconds): write 2.5s, got '2.5'"),
    ],
)
def test_a_bad_kill_timeout_stops_the_worker_before_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             value: str, message: str) -> None:
    monkeypatch.setenv("LOOPSQ_KILL_TIMEOUT", value)
    monkeypatch.setenv("LOOPSQ_REDIS_URL", "redis://127.0.0.1:9/0")  # never reached
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    result = CliRunner().invoke(cli, ["worker"], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {message}\n")
    assert not (tmp_path / "data").exists()
