"""Tests of loopsq.system.procs: process start times, liveness (pid reuse, zombies, EPERM), group kills, host name."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from loopsq.system.procs import hostname, is_process_alive, kill_process_group, process_start_time

UNUSED_PID = 2**22 + 1  # above any pid_max Linux allows, so never a live process


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _wait_exited_unreaped(pid: int) -> None:
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def test_start_time_of_a_running_process_is_the_same_on_every_reading() -> None:
    first = process_start_time(os.getpid())
    assert first is not None
    assert process_start_time(os.getpid()) == first


def test_start_time_of_a_child_is_not_before_its_parents(sleeper: subprocess.Popen[bytes]) -> None:
    child = process_start_time(sleeper.pid)
    parent = process_start_time(os.getpid())
    assert child is not None and parent is not None
    assert child >= parent


def test_start_time_of_a_missing_process_is_none() -> None:
    assert process_start_time(UNUSED_PID) is None
    assert process_start_time(0) is None
    assert process_start_time(-5) is None


def test_running_process_is_alive_with_or_without_its_start_time(sleeper: subprocess.Popen[bytes]) -> None:
    start = process_start_time(sleeper.pid)
    assert is_process_alive(sleeper.pid)
    assert is_process_alive(sleeper.pid, start)


def test_process_with_another_start_time_counts_as_dead_because_its_pid_was_reused(
    sleeper: subprocess.Popen[bytes],
) -> None:
    start = process_start_time(sleeper.pid)
    assert start is not None
    assert not is_process_alive(sleeper.pid, start - 10.0)
    assert not is_process_alive(sleeper.pid, start + 1.0)


def test_zombie_counts_as_dead_until_and_after_it_is_reaped() -> None:
    proc = subprocess.Popen(["true"])
    _wait_exited_unreaped(proc.pid)
    try:
        assert process_start_time(proc.pid) is not None  # still in the process table
        assert not is_process_alive(proc.pid)
    finally:
        proc.wait()
    assert not is_process_alive(proc.pid)


def test_missing_and_non_positive_pids_are_dead() -> None:
    assert not is_process_alive(UNUSED_PID)
    assert not is_process_alive(0)
    assert not is_process_alive(-1)


def test_eperm_from_kill_counts_as_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    # Signalling another user's process fails with EPERM even though it exists. As root nothing answers EPERM,
    # so the kill is stubbed; the /proc lookup that follows is real.
    def refuse(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", refuse)
    assert is_process_alive(os.getpid(), process_start_time(os.getpid()))


def test_eperm_for_a_pid_that_is_gone_by_the_proc_lookup_counts_as_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", refuse)
    assert not is_process_alive(UNUSED_PID)


def test_kill_process_group_signals_every_member_and_reports_delivery() -> None:
    leader = subprocess.Popen(
        [
            sys.executable,
            "-S",
            "-c",
            "import subprocess, sys, time; print(subprocess.Popen(['sleep', '30']).pid, flush=True); time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert leader.stdout is not None
    grandchild = int(leader.stdout.readline())
    try:
        assert kill_process_group(leader.pid, signal.SIGKILL)
        assert leader.wait(timeout=5) == -signal.SIGKILL
        assert _becomes_dead(grandchild)
    finally:
        leader.stdout.close()
        if leader.poll() is None:
            leader.kill()
            leader.wait()


def _becomes_dead(pid: int) -> bool:
    # Delivery of SIGKILL to the orphan is asynchronous; a zombie already counts as dead.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not is_process_alive(pid):
            return True
        time.sleep(0.01)
    return False


def test_kill_process_group_of_a_missing_group_returns_false() -> None:
    assert not kill_process_group(UNUSED_PID, signal.SIGTERM)


def test_kill_process_group_refuses_our_own_group_id_zero() -> None:
    assert not kill_process_group(0, signal.SIGTERM)
    assert not kill_process_group(-1, signal.SIGTERM)


def test_hostname_is_the_systems_host_name() -> None:
    assert hostname() == socket.gethostname()
