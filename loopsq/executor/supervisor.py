"""Drive one spawned child to its end in the calling thread: output, stdin, deadlines, group kills.

One poll(2) set watches the child's stdout and stderr pipes, its stdin (when the prompt goes through stdin) and a
pidfd that becomes readable when the child exits, so the common case costs no helper thread. The timeout, the
idle timeout, the SIGTERM-then-SIGKILL escalation and the cancel event are deadlines of the same loop (the
cancel event is polled every 100 ms while the child runs).

What the child writes is scrubbed of secrets as it is read (``domain.scrub``: the known secret shapes and the
target's own env values), before it is kept or handed to ``on_output`` (the live stream): a line goes through once
it is complete (an open PEM private-key block once its END line came), so no secret is ever cut in two.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from loopsq.domain.scrub import Scrubber, StreamScrubber
from loopsq.executor.output import BoundedOutput
from loopsq.executor.spec import CommandSpec
from loopsq.system.procs import kill_process_group

log = logging.getLogger(__name__)

READ_CHUNK = 65_536
KILL_GRACE_S = 2.0  # SIGTERM, then SIGKILL this long after (reference §4.4 step 8)
CANCEL_POLL_S = 0.1
# After the child exits, how long to keep reading pipes still held open by processes it left behind.
DRAIN_GRACE_S = 0.25
_NO_PIDFD_POLL_S = 0.05

_PIDFD = "pid"
_STDIN = "stdin"

OnOutput = Callable[[str, bytes], None]


def signal_name(signum: int) -> str:
    """Return the conventional name of a signal number (``SIGTERM``), or ``SIG<n>`` for an unnamed one."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


class Supervisor:
    """Drives one spawned child to its end: reads its output, feeds its stdin, applies deadlines and kills."""

    def __init__(
        self,
        spec: CommandSpec,
        proc: subprocess.Popen[bytes],
        max_output_bytes: int,
        cancel: threading.Event | None,
        on_output: OnOutput | None,
        started_mono: float,
    ) -> None:
        self.spec = spec
        self.proc = proc
        self.cancel = cancel
        self.on_output = on_output
        self.stdout = BoundedOutput(max_output_bytes)
        self.stderr = BoundedOutput(max_output_bytes)
        scrubber = Scrubber(spec.secrets)
        self.scrubbers = {"stdout": StreamScrubber(scrubber), "stderr": StreamScrubber(scrubber)}
        self.reason: str | None = None  # why we signalled the group: "timeout" | "idle" | "cancel"
        self.deadline = None if spec.timeout_ms is None else started_mono + spec.timeout_ms / 1000
        self.idle_s = None if not spec.idle_timeout_ms else spec.idle_timeout_ms / 1000
        self.last_output = started_mono
        self.kill_at: float | None = None
        self.exited_at: float | None = None
        # Plain poll(2), not epoll or the selectors module: nothing to create or close per run and the least
        # Python work per wakeup, since at most four fds are watched (this is the per-run hot path).
        self.poller = select.poll()
        self.roles: dict[int, str] = {}  # fd -> _PIDFD | "stdout" | "stderr" | _STDIN
        self.open_streams = 0
        self.pidfd: int | None = None
        self.stdin_data = memoryview(b"")
        self.stdin_registered = False

    def run(self) -> None:
        """Supervise the child until it has exited and its pipes are drained; always reaps it."""
        proc = self.proc
        try:
            self._register()
            self._loop()
            for stream, scrubber in self.scrubbers.items():
                self._keep(stream, scrubber.finish())
        finally:
            if proc.returncode is None:
                # Only reached through an exception (e.g. KeyboardInterrupt): never leave the group behind.
                kill_process_group(proc.pid, signal.SIGKILL)
                proc.wait()
            self._close()

    def _register(self) -> None:
        proc = self.proc
        try:
            self.pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            self.pidfd = None  # no pidfd (old kernel): fall back to polling with waitid(WNOWAIT)
        if self.pidfd is not None:
            self._watch(self.pidfd, _PIDFD, select.POLLIN)
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            if pipe is not None:
                self._watch(pipe.fileno(), name, select.POLLIN)
                self.open_streams += 1
        if proc.stdin is not None:
            self.stdin_data = memoryview((self.spec.stdin_text or "").encode("utf-8"))
            if self.stdin_data:
                os.set_blocking(proc.stdin.fileno(), False)
                self._watch(proc.stdin.fileno(), _STDIN, select.POLLOUT)
                self.stdin_registered = True
            else:
                proc.stdin.close()

    def _watch(self, fd: int, role: str, events: int) -> None:
        self.poller.register(fd, events)
        self.roles[fd] = role

    def _unwatch(self, fd: int) -> None:
        self.poller.unregister(fd)
        del self.roles[fd]

    def _loop(self) -> None:
        while True:
            t = time.monotonic()
            if self.exited_at is None:
                if self.pidfd is None and self._has_exited():
                    self._child_exited(t)
                    continue
                self._apply_deadlines(t)
            elif self.open_streams == 0 or t >= self.exited_at + DRAIN_GRACE_S:
                return
            wake = self._next_wakeup(t)
            # Rounded up to whole milliseconds so that a deadline is never polled for in a busy loop.
            events = self.poller.poll(None if wake is None else max(0, math.ceil((wake - t) * 1000)))
            if not events:
                continue
            t = time.monotonic()
            for fd, _ in events:
                role = self.roles.get(fd)
                if role == _PIDFD:
                    self._child_exited(t)
                elif role == _STDIN:
                    self._write_stdin()
                elif role is not None:
                    self._read(fd, role, t)

    def _apply_deadlines(self, t: float) -> None:
        if self.reason is None:
            if self.cancel is not None and self.cancel.is_set():
                self._terminate("cancel", t)
            elif self.deadline is not None and t >= self.deadline:
                self._terminate("timeout", t)
            elif self.idle_s is not None and t >= self.last_output + self.idle_s:
                self._terminate("idle", t)
        elif self.kill_at is not None and t >= self.kill_at:
            kill_process_group(self.proc.pid, signal.SIGKILL)
            self.kill_at = None

    def _next_wakeup(self, t: float) -> float | None:
        if self.exited_at is not None:
            return self.exited_at + DRAIN_GRACE_S
        times: list[float] = []
        if self.pidfd is None:
            times.append(t + _NO_PIDFD_POLL_S)
        if self.reason is None:
            if self.cancel is not None:
                times.append(t + CANCEL_POLL_S)
            if self.deadline is not None:
                times.append(self.deadline)
            if self.idle_s is not None:
                times.append(self.last_output + self.idle_s)
        elif self.kill_at is not None:
            times.append(self.kill_at)
        return min(times) if times else None

    def _terminate(self, reason: str, t: float) -> None:
        self.reason = reason
        kill_process_group(self.proc.pid, signal.SIGTERM)
        self.kill_at = t + KILL_GRACE_S

    def _has_exited(self) -> bool:
        # WNOWAIT leaves the child a zombie, so its pid (and group id) cannot be reused before we signal the group.
        try:
            info = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def _child_exited(self, t: float) -> None:
        if self.reason is not None:
            # The child is a zombie until reaped, so the group id is still ours: kill what it left behind.
            kill_process_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.exited_at = t
        if self.pidfd is not None:
            self._unwatch(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None
        self._close_stdin()

    def _read(self, fd: int, stream: str, t: float) -> None:
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            self._unwatch(fd)
            self.open_streams -= 1
            return
        self.last_output = t
        self._keep(stream, self.scrubbers[stream].feed(chunk))

    def _keep(self, stream: str, chunk: bytes) -> None:
        """Keep a scrubbed chunk and hand it to ``on_output``."""
        if not chunk:
            return
        (self.stdout if stream == "stdout" else self.stderr).feed(chunk)
        if self.on_output is not None:
            try:
                self.on_output(stream, chunk)
            except Exception:
                log.exception("on_output callback failed; live output disabled for pid %d", self.proc.pid)
                self.on_output = None

    def _write_stdin(self) -> None:
        stdin = self.proc.stdin
        if stdin is None or not self.stdin_registered:
            return  # a stale event: the child's exit, handled earlier in the same batch, closed stdin
        try:
            written = os.write(stdin.fileno(), self.stdin_data[:READ_CHUNK])
        except BlockingIOError:
            return
        except BrokenPipeError:
            # The child does not read its prompt (or exited): as the reference, ignore EPIPE.
            written = len(self.stdin_data)
        self.stdin_data = self.stdin_data[written:]
        if not self.stdin_data:
            self._close_stdin()

    def _close_stdin(self) -> None:
        stdin = self.proc.stdin
        if stdin is None or stdin.closed:
            return
        if self.stdin_registered:
            self._unwatch(stdin.fileno())
            self.stdin_registered = False
        with contextlib.suppress(BrokenPipeError):
            stdin.close()

    def _close(self) -> None:
        self._close_stdin()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()

    def outcome(self) -> tuple[str, str | None]:
        """Return ``(status, error)`` from why the child ended."""
        if self.reason == "timeout":
            return "timed_out", f"timed out after {self.spec.timeout_ms}ms"
        if self.reason == "idle":
            return "timed_out", f"idle timed out after {self.spec.idle_timeout_ms}ms without stdout/stderr"
        if self.reason == "cancel":
            return "cancelled", "cancelled"
        code = self.proc.returncode
        if code is not None and code < 0:
            return "failed", f"terminated by {signal_name(-code)}"
        if code:
            return "failed", f"process exited with code {code}"
        return "succeeded", None
