"""execute_target with real processes: statuses, process groups, timeouts, idle timeouts, cancels, output bounds."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain.timeutil import from_iso, is_iso
from loopsq.errors import ExecutionError
from loopsq.executor import RunMetadata, SpawnInfo, execute_target, preflight_target
from loopsq.system.procs import hostname, is_process_alive, process_start_time

PY = sys.executable


def sh(script: str, **fields: Any) -> dict[str, Any]:
    return {"type": "command", "command": script, "shell": True, **fields}


def py(code: str, **fields: Any) -> dict[str, Any]:
    return {"type": "command", "command": PY, "args": ["-S", "-c", code], **fields}


def pids_in(text: str) -> list[int]:
    return [int(word) for word in text.split() if word.isdigit()]


def becomes_dead(pid: int, within: float = 1.0) -> bool:
    # Signal delivery to orphans is asynchronous: allow a short, bounded wait. Zombies count as dead.
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not is_process_alive(pid):
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test deliberately leaves running; killed afterwards whatever happens."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if is_process_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


# --- statuses and messages ---


def test_successful_command_reports_output_exit_code_pid_and_timestamps() -> None:
    result = execute_target({"type": "command", "command": "echo", "args": ["hello", "world"]}, RunMetadata())
    assert (result.status, result.exit_code, result.error) == ("succeeded", 0, None)
    assert result.stdout == "hello world\n"
    assert result.stderr == ""
    assert result.pid is not None and result.pid > 0
    assert is_iso(result.started_at) and is_iso(result.finished_at)
    assert from_iso(result.started_at) <= from_iso(result.finished_at)
    assert result.duration_ms >= 0


def test_result_dict_is_camel_case_without_none_values() -> None:
    result = execute_target(sh("echo out; echo err >&2; exit 2"), RunMetadata())
    assert result.to_dict() == {
        "status": "failed",
        "exitCode": 2,
        "stdout": "out\n",
        "stderr": "err\n",
        "error": "process exited with code 2",
        "pid": result.pid,
        "startedAt": result.started_at,
        "finishedAt": result.finished_at,
        "durationMs": result.duration_ms,
    }
    ok = execute_target({"type": "command", "command": "true"}, RunMetadata()).to_dict()
    assert "error" not in ok
    assert ok["exitCode"] == 0


def test_nonzero_exit_is_failed_with_the_exit_code_message() -> None:
    result = execute_target({"type": "command", "command": "false"}, RunMetadata())
    assert (result.status, result.exit_code, result.error) == ("failed", 1, "process exited with code 1")


def test_child_killed_by_a_signal_we_did_not_send_is_terminated_by_that_signal() -> None:
    result = execute_target(sh("kill -TERM $$"), RunMetadata())
    assert (result.status, result.exit_code, result.error) == ("failed", None, "terminated by SIGTERM")
    result = execute_target(sh("kill -KILL $$"), RunMetadata())
    assert result.error == "terminated by SIGKILL"


def normalized() -> str:
    from loopsq.system.exec_path import normalize_execution_path

    return normalize_execution_path(os.environ)


def test_missing_executable_fails_without_spawning() -> None:
    result = execute_target({"type": "command", "command": "no-such-loopsq-cmd"}, RunMetadata())
    assert result.status == "failed"
    assert result.error == f"Executable not found in PATH: no-such-loopsq-cmd. Effective PATH={normalized()}"
    assert (result.pid, result.exit_code, result.duration_ms) == (None, None, 0)


def test_shell_commands_are_not_checked_and_the_shell_reports_127() -> None:
    result = execute_target(sh("no-such-loopsq-cmd"), RunMetadata())
    assert (result.status, result.exit_code) == ("failed", 127)
    assert "no-such-loopsq-cmd" in result.stderr


def test_spawn_error_is_a_failed_result_with_zero_duration(tmp_path: Path) -> None:
    result = execute_target(
        {"type": "command", "command": "true", "cwd": str(tmp_path / "gone")}, RunMetadata()
    )
    assert result.status == "failed"
    assert result.error is not None and result.error.startswith("failed to start true: ")
    assert (result.pid, result.duration_ms) == (None, 0)


def test_preflight_reports_the_command_or_the_missing_executable() -> None:
    assert preflight_target({"type": "command", "command": "true"}, RunMetadata()) == {"command": "true"}
    assert preflight_target(sh("anything at all"), RunMetadata()) == {"command": "anything at all"}
    with pytest.raises(ExecutionError) as info:
        preflight_target({"type": "command", "command": "nope-loopsq"}, RunMetadata())
    assert info.value.message == f"Executable not found in PATH: nope-loopsq. Effective PATH={normalized()}"


# --- spawn: argv, shell, cwd, env, stdin, process group ---


def test_shell_true_runs_command_and_args_joined_by_spaces() -> None:
    result = execute_target(sh("echo", args=["$((1+2))", "b"]), RunMetadata())
    assert result.stdout == "3 b\n"


def test_args_are_passed_verbatim_without_a_shell() -> None:
    result = execute_target({"type": "command", "command": "echo", "args": ["$HOME", "a  b"]}, RunMetadata())
    assert result.stdout == "$HOME a  b\n"


def test_relative_command_runs_from_the_target_cwd(tmp_path: Path) -> None:
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\npwd\n")
    script.chmod(0o755)
    result = execute_target({"type": "command", "command": "./hello.sh", "cwd": str(tmp_path)}, RunMetadata())
    assert (result.status, result.stdout) == ("succeeded", f"{tmp_path}\n")


def test_env_has_the_run_metadata_and_the_target_env() -> None:
    metadata = RunMetadata(loop_id="l1", loop_name="nightly", run_id="r1", workflow_step_id="s1")
    target = sh(
        'echo "$LOOPS_LOOP_ID $LOOPS_LOOP_NAME $LOOPS_RUN_ID $LOOPS_WORKFLOW_STEP_ID $MINE"',
        env={"MINE": "x"},
    )
    result = execute_target(target, metadata, env={"PATH": "/usr/bin:/bin"})
    assert result.stdout == "l1 nightly r1 s1 x\n"
    unset = execute_target(sh('echo "${LOOPS_WORKFLOW_ID-unset}"'), metadata)
    assert unset.stdout == "unset\n"


def test_stdin_is_dev_null_for_commands() -> None:
    result = execute_target(
        {"type": "command", "command": "readlink", "args": ["/proc/self/fd/0"]}, RunMetadata()
    )
    assert result.stdout == "/dev/null\n"


def test_child_leads_its_own_session_and_process_group() -> None:
    result = execute_target(py("import os; print(os.getpgid(0), os.getsid(0))"), RunMetadata())
    assert result.pid is not None
    assert result.stdout.split() == [str(result.pid), str(result.pid)]
    assert os.getpgid(0) != result.pid


def test_on_spawn_reports_pid_start_time_and_host_while_the_child_runs() -> None:
    seen: list[tuple[SpawnInfo, bool]] = []

    def on_spawn(info: SpawnInfo) -> None:
        seen.append((info, is_process_alive(info.pid, info.start_time)))

    result = execute_target(sh("sleep 0.2"), RunMetadata(), on_spawn=on_spawn)
    [(info, alive)] = seen
    assert alive
    assert info.pid == result.pid
    assert info.start_time is not None and info.start_time >= (process_start_time(os.getpid()) or 0)
    assert info.host == hostname()


def test_failing_callbacks_do_not_break_the_run() -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("callback failed")

    result = execute_target(sh("echo a; echo b >&2"), RunMetadata(), on_spawn=boom, on_output=boom)
    assert (result.status, result.stdout, result.stderr) == ("succeeded", "a\n", "b\n")


def test_on_output_receives_raw_chunks_of_each_stream() -> None:
    chunks: list[tuple[str, bytes]] = []
    result = execute_target(
        py("import sys; sys.stdout.write('é' * 5000); sys.stdout.flush(); sys.stderr.write('warn')"),
        RunMetadata(),
        on_output=lambda stream, chunk: chunks.append((stream, chunk)),
    )
    assert b"".join(c for s, c in chunks if s == "stdout").decode() == result.stdout == "é" * 5000
    assert b"".join(c for s, c in chunks if s == "stderr") == b"warn"


def test_normal_exit_returns_promptly_even_if_a_background_child_holds_the_pipes(
    leftovers: list[int],
) -> None:
    started = time.monotonic()
    result = execute_target(sh("sleep 30 & echo $!; echo done"), RunMetadata())
    assert time.monotonic() - started < 1.5
    [background] = pids_in(result.stdout)
    leftovers.append(background)
    assert result.status == "succeeded"
    assert result.stdout.endswith("done\n")
    # Stragglers of a normal exit are left alone (a target may start a daemon on purpose).
    assert is_process_alive(background)


# --- timeouts and the process group kill ---


def test_timeout_kills_the_whole_group_including_background_grandchildren(leftovers: list[int]) -> None:
    result = execute_target(
        sh("sleep 100 & echo $!; sleep 100 & echo $!; wait", timeoutMs=300), RunMetadata(), on_output=None
    )
    grandchildren = pids_in(result.stdout)
    leftovers.extend(grandchildren)
    assert (result.status, result.error) == ("timed_out", "timed out after 300ms")
    assert len(grandchildren) == 2
    assert all(becomes_dead(pid) for pid in grandchildren)


def test_grandchild_ignoring_sigterm_is_killed_once_the_leader_exits(leftovers: list[int]) -> None:
    started = time.monotonic()
    result = execute_target(
        sh("sh -c 'trap \"\" TERM; exec sleep 100' & echo $!; sleep 100", timeoutMs=300), RunMetadata()
    )
    elapsed = time.monotonic() - started
    [grandchild] = pids_in(result.stdout)
    leftovers.append(grandchild)
    assert result.status == "timed_out"
    assert becomes_dead(grandchild)
    assert elapsed < 1.5  # the leader died of SIGTERM: no need to wait for the 2 s SIGKILL


def test_leader_ignoring_sigterm_is_killed_two_seconds_later() -> None:
    started = time.monotonic()
    result = execute_target(sh("trap '' TERM; sleep 100", timeoutMs=300), RunMetadata())
    elapsed = time.monotonic() - started
    assert (result.status, result.error) == ("timed_out", "timed out after 300ms")
    assert 2.3 <= elapsed < 4.0


def test_timed_out_child_that_exits_on_sigterm_keeps_its_exit_code() -> None:
    result = execute_target(sh("trap 'exit 7' TERM; sleep 100 & wait", timeoutMs=300), RunMetadata())
    assert (result.status, result.exit_code, result.error) == ("timed_out", 7, "timed out after 300ms")


def test_null_timeout_lets_the_command_finish() -> None:
    assert execute_target(sh("sleep 0.1", timeoutMs=None), RunMetadata()).status == "succeeded"


def test_idle_timeout_ends_a_silent_target() -> None:
    started = time.monotonic()
    result = execute_target(sh("echo started; sleep 100", idleTimeoutMs=300), RunMetadata())
    assert (result.status, result.error) == ("timed_out", "idle timed out after 300ms without stdout/stderr")
    assert result.stdout == "started\n"
    assert time.monotonic() - started < 1.5


def test_output_on_either_stream_resets_the_idle_timer() -> None:
    code = "import sys, time\nfor i in range(8):\n    print(i, file=sys.stderr if i % 2 else sys.stdout, flush=True)\n    time.sleep(0.1)\n"
    result = execute_target(py(code, idleTimeoutMs=1500), RunMetadata())
    assert result.status == "succeeded"
    assert result.stdout.split() == ["0", "2", "4", "6"]


def test_overall_timeout_wins_over_a_longer_idle_timeout() -> None:
    result = execute_target(sh("sleep 100", timeoutMs=200, idleTimeoutMs=60_000), RunMetadata())
    assert result.error == "timed out after 200ms"


# --- cancellation ---


def test_cancel_stops_the_group_within_a_second_and_reports_cancelled(leftovers: list[int]) -> None:
    cancel = threading.Event()
    set_at: list[float] = []

    def on_output(stream: str, chunk: bytes) -> None:
        if not cancel.is_set():
            set_at.append(time.monotonic())
            cancel.set()

    result = execute_target(
        sh("sleep 100 & echo $!; sleep 100"), RunMetadata(), cancel=cancel, on_output=on_output
    )
    elapsed = time.monotonic() - set_at[0]
    [grandchild] = pids_in(result.stdout)
    leftovers.append(grandchild)
    assert (result.status, result.error, result.exit_code) == ("cancelled", "cancelled", None)
    assert elapsed < 1.5
    assert becomes_dead(grandchild)


def test_cancel_from_another_thread_while_the_child_is_silent() -> None:
    cancel = threading.Event()
    set_at: list[float] = []

    def cancel_soon(info: SpawnInfo) -> None:
        def fire() -> None:
            time.sleep(0.2)
            set_at.append(time.monotonic())
            cancel.set()

        threading.Thread(target=fire, daemon=True).start()

    result = execute_target(sh("sleep 100"), RunMetadata(), cancel=cancel, on_spawn=cancel_soon)
    assert time.monotonic() - set_at[0] < 1.5
    assert result.status == "cancelled"


def test_cancel_is_never_reported_as_terminated_by_sigterm_even_if_the_child_exits_cleanly() -> None:
    cancel = threading.Event()
    result = execute_target(
        sh("trap 'exit 0' TERM; echo ready; sleep 100 & wait"),
        RunMetadata(),
        cancel=cancel,
        on_output=lambda stream, chunk: cancel.set(),
    )
    assert (result.status, result.error, result.exit_code) == ("cancelled", "cancelled", 0)


def test_cancel_set_before_start_spawns_nothing(tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    marker = tmp_path / "ran"
    result = execute_target(sh(f"touch {marker}"), RunMetadata(), cancel=cancel)
    assert (result.status, result.error, result.pid, result.duration_ms) == (
        "cancelled",
        "cancelled",
        None,
        0,
    )
    assert not marker.exists()


# --- bounded output ---


def test_stdout_beyond_the_limit_keeps_a_byte_exact_tail_with_a_cumulative_count() -> None:
    code = "import sys\nfor _ in range(10):\n    sys.stdout.buffer.write(b'a' * 99_999 + b'\\n'); sys.stdout.flush()\nsys.stderr.write('small')"
    result = execute_target(py(code), RunMetadata())
    head, tail = result.stdout.split("\n", 1)
    assert head == "[truncated 737856 bytes]"
    assert len(tail.encode()) == 262_144
    assert result.stderr == "small"


def test_multibyte_character_straddling_the_cut_is_dropped_and_counted() -> None:
    code = "import sys; sys.stdout.buffer.write(b'xxxx' + 'é'.encode() + b'123456789')"
    result = execute_target(py(code), RunMetadata(), max_output_bytes=10)
    assert result.stdout == "[truncated 6 bytes]\n123456789"


def test_both_streams_are_bounded_independently_while_written_concurrently() -> None:
    code = (
        "import sys\n"
        "for _ in range(32):\n"
        "    sys.stdout.buffer.write(b'o' * 65536); sys.stdout.flush()\n"
        "    sys.stderr.buffer.write(b'e' * 65536); sys.stderr.flush()\n"
    )
    result = execute_target(py(code), RunMetadata(), max_output_bytes=1000)
    assert result.stdout == "[truncated 2096152 bytes]\n" + "o" * 1000
    assert result.stderr == "[truncated 2096152 bytes]\n" + "e" * 1000


def test_invalid_utf8_output_is_decoded_with_replacement_characters() -> None:
    result = execute_target(py("import sys; sys.stdout.buffer.write(b'ok\\xff')"), RunMetadata())
    assert result.stdout == "ok\ufffd"


def test_one_gib_of_output_keeps_memory_bounded_and_counts_every_dropped_byte() -> None:
    execute_target({"type": "command", "command": "true"}, RunMetadata())  # warm up imports and allocator
    baseline = rss_bytes()
    peak = baseline
    chunks = 0

    def sample(stream: str, chunk: bytes) -> None:
        nonlocal peak, chunks
        chunks += 1
        if chunks % 256 == 0:
            peak = max(peak, rss_bytes())

    result = execute_target(
        {"type": "command", "command": "head", "args": ["-c", "1073741824", "/dev/zero"]},
        RunMetadata(),
        on_output=sample,
    )
    peak = max(peak, rss_bytes())
    assert result.status == "succeeded"
    assert result.stdout.startswith("[truncated 1073479680 bytes]\n")
    assert len(result.stdout) == len("[truncated 1073479680 bytes]\n") + 262_144
    assert peak - baseline < 32 * 1024 * 1024


def test_without_pidfd_the_child_is_still_supervised_by_polling(
    monkeypatch: pytest.MonkeyPatch, leftovers: list[int]
) -> None:
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    ok = execute_target(sh("echo hi; exit 3"), RunMetadata())
    assert (ok.status, ok.exit_code, ok.stdout) == ("failed", 3, "hi\n")
    result = execute_target(sh("sleep 100 & echo $!; sleep 100", timeoutMs=300), RunMetadata())
    [grandchild] = pids_in(result.stdout)
    leftovers.append(grandchild)
    assert (result.status, result.error) == ("timed_out", "timed out after 300ms")
    assert becomes_dead(grandchild)


def test_workflow_targets_are_refused_as_a_failed_result() -> None:
    result = execute_target({"type": "workflow", "workflowId": "w1"}, RunMetadata())
    assert (result.status, result.pid, result.duration_ms) == ("failed", None, 0)
    assert result.error == "target type cannot be executed as a process: 'workflow'"
