"""Codewith durable background agents (reference 0.3.60): ``codewith … agent start`` starts the agent and returns
its id; ``agent read <id>`` is then polled until the agent is ``completed``, ``failed`` or ``cancelled``.

The start carries an idempotency key (``idempotency_key``): a re-run of the same run attempt (after a worker
shutdown, say) finds the agent it started instead of starting a second one, while a retry (the next attempt) starts
a new one. A cancel or a timeout stops the agent (``agent stop <id>``). The run's stdout is a JSON summary of the
agent (its id, status, reason, last events); stderr collects what the control commands wrote there.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loopsq.domain.timeutil import now, to_iso
from loopsq.executor.output import BoundedOutput
from loopsq.executor.result import ExecutorResult
from loopsq.executor.spec import CommandSpec

POLL_ENV = "LOOPS_CODEWITH_AGENT_POLL_MS"
DEFAULT_POLL_MS = 2000
MIN_POLL_MS = 100
CONTROL_TIMEOUT_S = 30.0
TERMINAL = ("completed", "failed", "cancelled")

OnStart = Callable[[int], None]


def control_args(auth_profile: str | None, command: str, agent_id: str) -> list[str]:
    """``[--auth-profile P] agent read|logs|stop [--limit 20] <id>``."""
    return [*(["--auth-profile", auth_profile] if auth_profile else []), "agent", command,
            *(["--limit", "20"] if command == "logs" else []), agent_id]


def poll_interval_s(env: Mapping[str, str]) -> float:
    """``LOOPS_CODEWITH_AGENT_POLL_MS`` (at least 100 ms; 2000 when unset or not a number), in seconds."""
    try:
        value = float(env.get(POLL_ENV) or os.environ.get(POLL_ENV) or DEFAULT_POLL_MS)
    except ValueError:
        value = DEFAULT_POLL_MS
    return max(MIN_POLL_MS, value if value > 0 else DEFAULT_POLL_MS) / 1000


def _field(value: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


class DurableAgent:
    """Drives one codewith durable agent from its start to its end (in the calling thread)."""

    def __init__(self, spec: CommandSpec, executable: str, cancel: threading.Event | None, max_output_bytes: int,
                 on_start: OnStart | None) -> None:
        self.spec = spec
        self.executable = executable
        self.cancel = cancel
        self.on_start = on_start
        self.stderr = BoundedOutput(max_output_bytes)
        self.max_output_bytes = max_output_bytes
        self.started = now()
        self.started_mono = time.monotonic()
        self.start_json: dict[str, Any] = {}
        self.last_read: dict[str, Any] = {}
        self.pid: int | None = None

    def _control(self, args: Sequence[str], *, report: bool = False) -> tuple[int | None, str, str | None]:
        """Run one control command: (exit code, stdout, error). ``report``: tell ``on_start`` its pid."""
        try:
            proc = subprocess.Popen([self.executable, *args], cwd=self.spec.cwd, env=dict(self.spec.env),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            return None, "", f"failed to start {self.spec.command}: {exc}"
        if report:
            self.pid = proc.pid
            if self.on_start is not None:
                self.on_start(proc.pid)
        try:
            out, err = proc.communicate(timeout=CONTROL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            self.stderr.feed(err)
            return None, out.decode("utf-8", "replace"), f"codewith {' '.join(args[-3:])} timed out"
        self.stderr.feed(err)
        return proc.returncode, out.decode("utf-8", "replace"), None

    def _json(self, text: str, label: str) -> dict[str, Any]:
        try:
            value = json.loads(text or "{}")
        except ValueError as exc:
            raise _Failed(f"{label} did not return JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise _Failed(f"{label} did not return JSON: not an object")
        return value

    def _summary(self, logs: dict[str, Any] | None = None) -> str:
        agent = _field(self.last_read, "agent") or _field(self.start_json, "agent") or {}
        events = logs.get("data") if isinstance(logs, dict) else None
        summary = {
            "codewithAgent": {key: agent.get(key) for key in ("agentId", "status", "statusReason", "threadId", "pid",
                                                                "exitCode") if isinstance(agent, dict)
                              and agent.get(key) is not None},
            "statusSnapshot": _field(self.last_read, "statusSnapshot"),
            "events": [{k: e.get(k) for k in ("seq", "eventType", "createdAt")} for e in events
                       if isinstance(e, dict)] if isinstance(events, list) else None,
        }
        out = BoundedOutput(self.max_output_bytes)
        out.feed(json.dumps({k: v for k, v in summary.items() if v is not None}, indent=2).encode())
        return out.text()

    def _result(self, status: str, error: str | None, exit_code: int | None, stdout: str) -> ExecutorResult:
        return ExecutorResult(status=status, exit_code=exit_code, stdout=stdout, stderr=self.stderr.text(),
                              error=error, pid=self.pid, started_at=to_iso(self.started), finished_at=to_iso(now()),
                              duration_ms=int((time.monotonic() - self.started_mono) * 1000))

    def run(self) -> ExecutorResult:
        """Start the agent, wait for its end, and report it."""
        code, out, error = self._control(self.spec.args, report=True)
        if error is not None or code != 0:
            return self._result("failed", error or f"codewith agent start exited with code {code}", code, out)
        try:
            self.start_json = self._json(out, "codewith agent start")
            agent_id = _field(self.start_json, "agent", "agentId")
            if not isinstance(agent_id, str) or not agent_id:
                raise _Failed("codewith agent start did not return agent.agentId")
            return self._wait(agent_id)
        except _Failed as exc:
            return self._result("failed", exc.message, None, self._summary() if self.start_json else out)

    def _wait(self, agent_id: str) -> ExecutorResult:
        auth = self.spec.auth_profile
        poll_s = poll_interval_s(self.spec.env)
        deadline = None if self.spec.timeout_ms is None else self.started_mono + self.spec.timeout_ms / 1000
        while True:
            if self.cancel is not None and self.cancel.is_set():
                self._control(control_args(auth, "stop", agent_id))
                return self._result("cancelled", "cancelled", None, self._summary())
            code, out, error = self._control(control_args(auth, "read", agent_id))
            if error is not None or code != 0:
                return self._result("failed", error or f"codewith agent read exited with code {code}", code,
                                    self._summary())
            self.last_read = self._json(out, "codewith agent read")
            status = _field(self.last_read, "agent", "status") or _field(self.last_read, "statusSnapshot", "status")
            if status in TERMINAL:
                logs_code, logs_out, _ = self._control(control_args(auth, "logs", agent_id))
                logs = None
                if logs_code == 0:
                    try:
                        logs = self._json(logs_out, "codewith agent logs")
                    except _Failed:
                        logs = None
                if status == "completed":
                    return self._result("succeeded", None, 0, self._summary(logs))
                reason = _field(self.last_read, "agent", "statusReason")
                return self._result("failed", str(reason) if reason else f"codewith agent {status}", 1,
                                    self._summary(logs))
            if deadline is not None and time.monotonic() >= deadline:
                self._control(control_args(auth, "stop", agent_id))
                return self._result("timed_out", f"timed out after {self.spec.timeout_ms}ms", None, self._summary())
            wait_s = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
            if self.cancel is not None:
                self.cancel.wait(wait_s)
            else:
                time.sleep(wait_s)


class _Failed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
