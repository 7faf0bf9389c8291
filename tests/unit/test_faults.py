"""Fault injection is off in production: ``LOOPSQ_FAULT`` is honoured only with ``LOOPSQ_TEST_FAULTS=1``, and a
process where it is on (or set but ignored) says so when it starts."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest

from loopsq.engine import faults

CRASH = "from loopsq.engine.faults import crash_point; crash_point('after_claim'); print('survived')"


def run_crash_point(**env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("LOOPSQ_FAULT", "LOOPSQ_TEST_FAULTS")}
    return subprocess.run([sys.executable, "-c", CRASH], env={**base, **env}, capture_output=True, text=True,
                          timeout=60)


def test_a_stray_loopsq_fault_without_the_test_switch_is_ignored() -> None:
    done = run_crash_point(LOOPSQ_FAULT="after_claim")
    assert (done.returncode, done.stdout) == (0, "survived\n")


def test_loopsq_fault_with_loopsq_test_faults_1_kills_the_process_at_that_point() -> None:
    done = run_crash_point(LOOPSQ_FAULT="after_claim", LOOPSQ_TEST_FAULTS="1")
    assert (done.returncode, done.stdout) == (-signal.SIGKILL, "")
    other = run_crash_point(LOOPSQ_FAULT="after_finalize", LOOPSQ_TEST_FAULTS="1")
    assert (other.returncode, other.stdout) == (0, "survived\n")


@pytest.mark.parametrize("switch", ["0", "yes", ""])
def test_only_the_exact_value_1_turns_faults_on(monkeypatch: pytest.MonkeyPatch, switch: str) -> None:
    monkeypatch.setenv("LOOPSQ_FAULT", "after_claim")
    monkeypatch.setenv("LOOPSQ_TEST_FAULTS", switch)
    assert faults.active_fault() is None
    monkeypatch.setenv("LOOPSQ_TEST_FAULTS", "1")
    assert faults.active_fault() == "after_claim"


def test_a_process_with_faults_on_warns_loudly_at_start(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("loopsq.test-faults")
    monkeypatch.delenv("LOOPSQ_FAULT", raising=False)
    with caplog.at_level(logging.WARNING):
        faults.warn_if_enabled(log)
    assert caplog.messages == []
    monkeypatch.setenv("LOOPSQ_FAULT", "after_spawn")
    monkeypatch.delenv("LOOPSQ_TEST_FAULTS", raising=False)
    with caplog.at_level(logging.WARNING):
        faults.warn_if_enabled(log)
    monkeypatch.setenv("LOOPSQ_TEST_FAULTS", "1")
    with caplog.at_level(logging.WARNING):
        faults.warn_if_enabled(log)
    assert caplog.messages == [
        "LOOPSQ_FAULT=after_spawn is set but ignored: fault injection needs LOOPSQ_TEST_FAULTS=1 (tests only)",
        "!!! FAULT INJECTION IS ON: LOOPSQ_FAULT=after_spawn with LOOPSQ_TEST_FAULTS=1; this process will SIGKILL "
        "itself at after_spawn. This is for tests only; never set these in production !!!",
    ]
