"""A process supervisor: named children with prefixed output, restarts with backoff, staged clean stops.

Each child runs in a session (and so a process group) of its own: a Ctrl-C at the terminal reaches the supervisor
alone, which then stops the children in stages (the app processes first, the Redis they need last), each with
SIGTERM to its group, then SIGKILL to the group after a grace. On Linux each child also gets the parent-death
signal (SIGTERM), so a supervisor killed with SIGKILL leaves no orphans behind. Used by ``loopsq up``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

#: Sets PR_SET_PDEATHSIG, checks the parent did not die meanwhile, then execs the child. Run with ``python -S``.
_LAUNCHER = (
    "import ctypes,os,signal,sys\n"
    "try:\n"
    "    ctypes.CDLL(None,use_errno=True).prctl(1,int(signal.SIGTERM),0,0,0)\n"
    "except Exception:\n"
    "    pass\n"
    "if os.getppid()!=int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execv(sys.argv[2],sys.argv[2:])\n"
)


def describe_exit(returncode: int) -> str:
    """``code N`` or ``signal SIGKILL``."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"code {returncode}"


class Printer:
    """Writes ``<name> | <line>`` lines to one stream, whole lines at a time, from any thread."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self._lock = threading.Lock()

    def line(self, name: str, text: str) -> None:
        """One prefixed line."""
        with self._lock:
            try:
                self.stream.write(f"{name} | {text}\n")
                self.stream.flush()
            except (OSError, ValueError):  # a closed terminal must not kill the supervisor
                pass


@dataclass(frozen=True)
class ChildSpec:
    """What to run: a name for the log prefix, argv, the environment, and the stop stage (lower stops first)."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    stage: int = 0


@dataclass
class Child:
    """A supervised child and its restart state."""

    spec: ChildSpec
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff_s: float = 0.0
    restart_at: float | None = None
    starts: int = 0
    reader: threading.Thread | None = None
    #: Exits in a row, each within ``Supervisor.quick_exit_s`` of its start.
    quick_exits: int = 0
    #: The supervisor stopped restarting it: it kept failing right after it started.
    given_up: bool = False
    last_line: str = ""

    @property
    def running(self) -> bool:
        """Whether its process is alive (not yet reaped)."""
        return self.popen is not None and self.popen.poll() is None


class Supervisor:
    """Runs children, restarts those that exit with capped exponential backoff, and stops them all in stages.

    The backoff starts at ``backoff_initial_s`` and doubles up to ``backoff_max_s``; a child that ran for
    ``stable_after_s`` or longer before exiting starts over from the initial delay. A child that fails
    ``give_up_after`` times in a row, each time within ``quick_exit_s`` of its start (a taken port, a bad
    configuration: restarting cannot help), is not restarted again; ``given_up`` names it, and ``run`` returns.
    """

    def __init__(
        self,
        printer: Printer,
        *,
        stop_grace_s: float = 10.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        stable_after_s: float = 30.0,
        quick_exit_s: float = 10.0,
        give_up_after: int = 3,
        poll_s: float = 0.1,
        name: str = "up",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.printer = printer
        self.stop_grace_s = stop_grace_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
        self.quick_exit_s = quick_exit_s
        self.give_up_after = give_up_after
        self.poll_s = poll_s
        self.name = name
        self.clock = clock
        self.children: list[Child] = []

    def say(self, text: str) -> None:
        """A line of the supervisor's own."""
        self.printer.line(self.name, text)

    # -- starting -------------------------------------------------------------------------------------------
    def add(self, spec: ChildSpec) -> Child:
        """Register a child (not started)."""
        child = Child(spec, backoff_s=self.backoff_initial_s)
        self.children.append(child)
        return child

    def remove(self, child: Child) -> None:
        """Forget a child that is not running."""
        self.children.remove(child)

    def start(self, child: Child) -> None:
        """Start ``child`` now, its output read line by line into the printer."""
        argv = list(child.spec.argv)
        if sys.platform.startswith("linux"):
            argv = [sys.executable, "-S", "-c", _LAUNCHER, str(os.getpid()), *argv]
        popen = subprocess.Popen(
            argv, env=dict(child.spec.env) if child.spec.env is not None else None, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        child.popen = popen
        child.started_at = self.clock()
        child.restart_at = None
        child.starts += 1
        child.last_line = ""
        child.reader = threading.Thread(target=self._pump, args=(child, popen), daemon=True,
                                        name=f"output-{child.spec.name}")
        child.reader.start()
        self.say(f"started {child.spec.name} (pid {popen.pid})")

    def _pump(self, child: Child, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdout is not None
        with popen.stdout:
            for raw in iter(popen.stdout.readline, b""):
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if text.strip():
                    child.last_line = text
                self.printer.line(child.spec.name, text)

    @property
    def given_up(self) -> Child | None:
        """The first child the supervisor stopped restarting, if any."""
        return next((c for c in self.children if c.given_up), None)

    # -- supervising ----------------------------------------------------------------------------------------
    def check(self) -> None:
        """Notice exited children and schedule their restart; start those whose backoff is over."""
        now = self.clock()
        for child in self.children:
            popen = child.popen
            if popen is not None and popen.poll() is not None:
                ran = now - child.started_at
                if ran >= self.stable_after_s:
                    child.backoff_s = self.backoff_initial_s
                child.quick_exits = child.quick_exits + 1 if ran < self.quick_exit_s else 0
                delay = child.backoff_s
                child.backoff_s = min(child.backoff_s * 2, self.backoff_max_s)
                child.popen = None
                _signal_group(popen.pid, signal.SIGKILL)  # helpers it left in its group go with it
                if child.quick_exits >= self.give_up_after:
                    if child.reader is not None:
                        child.reader.join(timeout=2)  # its last lines say why
                    child.given_up = True
                    last = f" (last line: {child.last_line.strip()})" if child.last_line.strip() else ""
                    self.say(f"{child.spec.name} exited with {describe_exit(popen.returncode)} "
                             f"{child.quick_exits} times in a row within {self.quick_exit_s:g}s of starting; "
                             f"not restarting it{last}")
                    continue
                child.restart_at = now + delay
                self.say(f"{child.spec.name} exited with {describe_exit(popen.returncode)}; "
                         f"restarting in {delay:g}s")
            elif popen is None and child.restart_at is not None and now >= child.restart_at:
                self.start(child)

    def run(self, stop: threading.Event) -> None:
        """Supervise until ``stop`` is set or a child was given up (``shutdown`` is the caller's)."""
        while not stop.is_set() and self.given_up is None:
            self.check()
            if self.given_up is None:
                stop.wait(self.poll_s)

    # -- stopping -------------------------------------------------------------------------------------------
    def shutdown(self, force: threading.Event | None = None) -> None:
        """Stop the children stage by stage: SIGTERM to each group, wait, SIGKILL after the grace."""
        for stage in sorted({c.spec.stage for c in self.children}):
            self.stop_children([c for c in self.children if c.spec.stage == stage], force)
        for child in self.children:
            if child.reader is not None:
                child.reader.join(timeout=2)

    def stop_children(self, children: Sequence[Child], force: threading.Event | None = None) -> None:
        """SIGTERM ``children``' groups, wait up to the grace (or until ``force``), then SIGKILL the rest."""
        running = [c for c in children if c.running]
        for child in children:
            child.restart_at = None
        for child in running:
            assert child.popen is not None
            _signal_group(child.popen.pid, signal.SIGTERM)
        deadline = self.clock() + self.stop_grace_s
        while any(c.running for c in running):
            if self.clock() >= deadline or (force is not None and force.is_set()):
                for child in running:
                    if child.running:
                        assert child.popen is not None
                        self.say(f"{child.spec.name} did not stop; killing it")
                        _signal_group(child.popen.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        for child in running:
            assert child.popen is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = child.popen.wait(timeout=5)
                self.say(f"{child.spec.name} exited with {describe_exit(code)}")
            _signal_group(child.popen.pid, signal.SIGKILL)  # helpers it left in its group go with it
            child.popen = None


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
