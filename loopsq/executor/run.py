"""Execute one command or agent target as its own process group and report the outcome (reference §4.4).

``execute_target`` builds the spec, checks the executable, spawns the child in a new session and hands it to the
``Supervisor``, which runs everything in the calling thread. ``preflight_target`` does the same checks without
spawning anything.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from loopsq.domain.agent_output import NO_OUTPUT_ERROR, produced_no_output
from loopsq.domain.codewith_exec import ExecEventReader, judge
from loopsq.domain.limits import MAX_CWD_LENGTH
from loopsq.domain.text import shown
from loopsq.domain.timeutil import now, to_iso
from loopsq.errors import ExecutionError, LoopsqError
from loopsq.executor.output import DEFAULT_MAX_OUTPUT_BYTES
from loopsq.executor.result import ExecutorResult, SpawnInfo
from loopsq.executor.spec import RunMetadata, build_spec, check_executable
from loopsq.executor.supervisor import OnOutput, Supervisor
from loopsq.executor.watchdog import pdeathsig_preexec, watchdog
from loopsq.system.procs import hostname, process_start_time

log = logging.getLogger(__name__)

OnSpawn = Callable[[SpawnInfo], None]


def preflight_target(
    target: Mapping[str, Any], metadata: RunMetadata, *, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Check that a target could start now: resolve its account and find its executable (§4.3).

    Args:
        target: a validated command or agent target.
        metadata: the run identifiers (they only shape the env).
        env: the base environment; ``os.environ`` when None.

    Returns:
        ``{"command": ..., "accountProfile"?: ..., "accountTool"?: ...}``.

    Raises:
        ExecutionError: ``working directory ...`` (see ``check_cwd``), ``Executable not found in PATH: <cmd>`` or
            the account error (§6).
    """
    spec = build_spec(target, metadata, env=env)
    check_cwd(spec.cwd)
    check_executable(spec)
    report = {"command": spec.command}
    if spec.account_profile:
        report["accountProfile"] = spec.account_profile
    if spec.account_tool:
        report["accountTool"] = spec.account_tool
    return report


def preflights_each_run(target: Mapping[str, Any]) -> bool:
    """Whether the target asks for a preflight before every run (``preflight: {beforeRun: true}``, 0.3.16+)."""
    preflight = target.get("preflight")
    return isinstance(preflight, Mapping) and preflight.get("beforeRun") is True


def preflight_label(metadata: RunMetadata) -> str:
    """``runtime`` for a loop run, ``workflow step <id>`` for a step (the reference's two messages)."""
    return f"workflow step {metadata.workflow_step_id}" if metadata.workflow_step_id else "runtime"


def check_cwd(cwd: str | None) -> None:
    """Check that a target's working directory can be entered here (what the child's ``chdir`` needs).

    Raises:
        ExecutionError: ``working directory not found: <dir>``, ``working directory is not a directory: <dir>`` or
            ``working directory is not accessible: <dir>`` (no search permission).
    """
    if not cwd:
        return
    if not os.path.exists(cwd):
        raise ExecutionError(f"working directory not found: {shown(cwd, MAX_CWD_LENGTH)}")
    if not os.path.isdir(cwd):
        raise ExecutionError(f"working directory is not a directory: {shown(cwd, MAX_CWD_LENGTH)}")
    if not os.access(cwd, os.X_OK):
        raise ExecutionError(f"working directory is not accessible: {shown(cwd, MAX_CWD_LENGTH)}")


def execute_target(
    target: Mapping[str, Any],
    metadata: RunMetadata,
    *,
    env: Mapping[str, str] | None = None,
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    cancel: threading.Event | None = None,
    on_spawn: OnSpawn | None = None,
    on_output: OnOutput | None = None,
) -> ExecutorResult:
    """Run a command or agent target to completion and report how it ended.

    The child leads its own process group; a timeout, idle timeout or cancel sends SIGTERM to the group, SIGKILL
    2 s later, and SIGKILL again once the child has exited so that no background grandchild survives. After a
    natural exit, processes the child left behind are not killed (a target may start a daemon on purpose); their
    output is read for at most 250 ms more. Should this process die before the child exits (SIGKILL included),
    the group dies with it (``loopsq.executor.watchdog``). Both callbacks run in the calling thread (a slow ``on_output`` slows
    the reading of the pipes); an exception from either is logged and the run goes on.

    Args:
        target: a validated command or agent target.
        metadata: the run identifiers, exported as ``LOOPS_*`` variables.
        env: the base environment; ``os.environ`` when None.
        max_output_bytes: bytes kept per stream (the tail); the rest is counted in a ``[truncated N bytes]`` line.
        cancel: set it (from any thread) to stop the target; the group is signalled within 100 ms.
        on_spawn: called once with the child's pid, start time and host, right after it starts.
        on_output: called with ``("stdout" | "stderr", chunk)`` for every raw chunk read.

    Returns:
        The result. It never raises for a target that cannot start: an account failure, a missing executable or
        a spawn error give status ``failed`` with the message as error and ``durationMs`` 0. A target with
        ``preflight.beforeRun`` is preflighted first; a failure there is ``runtime preflight failed: <msg>``
        (``workflow step <id> preflight failed: <msg>`` for a workflow step). An agent that exits 0 having said
        nothing (``agent_output.produced_no_output``) fails with ``agent produced no output``.
    """
    if preflights_each_run(target):
        try:
            preflight_target(target, metadata, env=env)
        except LoopsqError as exc:
            return _not_started("failed", f"{preflight_label(metadata)} preflight failed: {exc.message}")
    try:
        spec = build_spec(target, metadata, env=env)
        executable = check_executable(spec)
    except LoopsqError as exc:
        return _not_started("failed", exc.message)
    if cancel is not None and cancel.is_set():
        return _not_started("cancelled", "cancelled")
    events = ExecEventReader() if spec.codewith_exec else None
    if events is not None:
        on_output = _reading_events(events, on_output)
    guard = watchdog()
    # Without a watchdog (it could not start), the kernel's parent-death signal at least takes the leader along.
    preexec = None if guard.ensure() else pdeathsig_preexec()
    started = now()
    started_mono = time.monotonic()
    try:
        proc = subprocess.Popen(
            list(spec.argv),
            executable=executable,
            cwd=spec.cwd,
            env=spec.env,
            stdin=subprocess.DEVNULL if spec.stdin_text is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
        )
    except OSError as exc:
        return _not_started("failed", f"failed to start {spec.command}: {exc}", started)
    guard.register(proc.pid)
    try:
        if on_spawn is not None:
            _report_spawn(on_spawn, proc.pid)
        supervisor = Supervisor(spec, proc, max_output_bytes, cancel, on_output, started_mono)
        supervisor.run()
    finally:
        guard.unregister(proc.pid)
    finished = now()
    status, error = supervisor.outcome()
    stdout = supervisor.stdout.text()
    if status == "succeeded" and target.get("type") == "agent" and produced_no_output(
            str(target.get("provider")), stdout):
        status, error = "failed", NO_OUTPUT_ERROR  # (OpenLoops 0.4.40) an exit 0 that said nothing is no success
    returncode = proc.returncode
    result_text = None
    if events is not None:
        events.finish()
        verdict = events.outcome()
        result_text = verdict.result_text
        if supervisor.reason is None and returncode is not None and returncode >= 0:
            # It ended by itself: its events say whether it did the work (an exit 0 without a completed turn
            # did nothing), and their message beats a bare exit code.
            error = judge(returncode, verdict)
            status = "failed" if error is not None else "succeeded"
    return ExecutorResult(
        status=status,
        exit_code=returncode if returncode is not None and returncode >= 0 else None,
        stdout=stdout,
        stderr=supervisor.stderr.text(),
        error=error,
        pid=proc.pid,
        started_at=to_iso(started),
        finished_at=to_iso(finished),
        duration_ms=int((time.monotonic() - started_mono) * 1000),
        result_text=result_text,
    )


def _reading_events(events: ExecEventReader, on_output: OnOutput | None) -> OnOutput:
    """``on_output`` that also hands stdout to the codewith event reader. A failing ``on_output`` is dropped here
    (as the supervisor would drop it), so that the reader keeps reading."""
    inner = [on_output]

    def read(stream: str, chunk: bytes) -> None:
        if stream == "stdout":
            events.feed(chunk)
        callback = inner[0]
        if callback is not None:
            try:
                callback(stream, chunk)
            except Exception:
                log.exception("on_output callback failed; live output disabled")
                inner[0] = None

    return read


def _not_started(status: str, error: str, started: datetime | None = None) -> ExecutorResult:
    stamp = to_iso(started if started is not None else now())
    return ExecutorResult(
        status=status,
        exit_code=None,
        stdout="",
        stderr="",
        error=error,
        pid=None,
        started_at=stamp,
        finished_at=stamp,
        duration_ms=0,
    )


def _report_spawn(on_spawn: OnSpawn, pid: int) -> None:
    try:
        on_spawn(SpawnInfo(pid=pid, start_time=process_start_time(pid), host=hostname()))
    except Exception:
        # The child is running: abandoning it here would leave it unsupervised. The caller can still cancel.
        log.exception("on_spawn callback failed for pid %d", pid)
