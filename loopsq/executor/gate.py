"""Change gates: a cheap probe (``gate.command``, through ``/bin/sh -c``) that runs before a scheduled slot; the
target runs only when it exits 0.

The probe runs in its own process group, in the target's working directory with the target's environment
(loopsq's own variables dropped, ``LOOPS_*`` run metadata set), its output discarded. Its own timeout defaults
to 60 s (``DEFAULT_GATE_TIMEOUT_MS``); on expiry the whole group is killed. Nothing here raises for a probe
that fails: every way of not exiting 0 is a closed gate with a reason.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loopsq.domain.durations import format_duration
from loopsq.domain.loop_features import DEFAULT_GATE_TIMEOUT_MS
from loopsq.executor.spec import RunMetadata, compose_env
from loopsq.executor.watchdog import pdeathsig_preexec

SHELL = "/bin/sh"


@dataclass(frozen=True)
class GateResult:
    """How a probe ended: ``open`` (exit 0), else the ``reason`` a skipped run records."""

    open: bool
    exit_code: int | None
    reason: str | None = None


def gate_timeout_ms(gate: Mapping[str, Any]) -> int:
    """The probe's own timeout: ``gate.timeoutMs`` or 60 s."""
    return int(gate.get("timeoutMs") or DEFAULT_GATE_TIMEOUT_MS)


def probe(gate: Mapping[str, Any], target: Mapping[str, Any], metadata: RunMetadata, *,
          env: Mapping[str, str] | None = None) -> GateResult:
    """Run the gate's command to its end (or its timeout) and say whether the gate is open.

    Reasons: ``gate closed (exit N)``, ``gate closed (killed by signal N)``, ``gate closed (timed out after
    1m)``, ``gate closed (cannot start: <why>)``.
    """
    timeout_ms = gate_timeout_ms(gate)
    cwd = target.get("cwd") or None
    full_env = compose_env(os.environ if env is None else env, metadata, target_env=target.get("env"))
    try:
        proc = subprocess.Popen([SHELL, "-c", str(gate["command"])], cwd=cwd, env=full_env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=pdeathsig_preexec())
    except OSError as exc:
        return GateResult(False, None, f"gate closed (cannot start: {exc.strerror or exc})")
    try:
        code = proc.wait(timeout=timeout_ms / 1000)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.wait()
        return GateResult(False, None, f"gate closed (timed out after {format_duration(timeout_ms)})")
    _kill_group(proc.pid)  # whatever the probe left running in its group
    if code == 0:
        return GateResult(True, 0)
    if code < 0:
        return GateResult(False, None, f"gate closed (killed by signal {-code})")
    return GateResult(False, code, f"gate closed (exit {code})")


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
