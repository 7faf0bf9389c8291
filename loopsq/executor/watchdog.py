"""No target outlives the process that started it: one watchdog process per worker kills the process groups of
its runs when it dies, however it dies; the parent-death signal is the fallback where no watchdog can run.

Targets lead process groups of their own (so that a timeout or cancel kills the whole group), which is also why
nothing kills them when their worker is SIGKILLed: they are re-parented to init and run on, unowned.

- **The watchdog**: one small helper process per worker process, not per run (a run costs two short pipe writes
  and no extra process). It runs in a session of its own, so a signal sent to the worker's process group (honcho's,
  a terminal's Ctrl-C) does not reach it, and it ignores SIGINT, SIGTERM and SIGHUP. It reads a pipe whose write
  end only the worker holds (close-on-exec: targets never inherit it). The worker writes ``+<pgid>`` when a group
  starts and ``-<pgid>`` once its leader is reaped. When the worker dies, the kernel closes the write end; the
  watchdog reads EOF, SIGKILLs every group still registered, the leader and its grandchildren alike (they stay in
  the group unless they leave it themselves), and exits. A worker restarts a watchdog that died and tells the new
  one about the groups still running.
- **The parent-death signal** (Linux ``PR_SET_PDEATHSIG``, set by ``pdeathsig_preexec`` between fork and exec):
  the kernel SIGKILLs the group leader the moment the thread that spawned it dies. It reaches that one process
  only (a grandchild such as ``sleep 20 &`` under ``sh -c`` is re-parented and lives on), and a ``preexec_fn``
  costs a real fork instead of vfork plus Python in the child: measured here, 3 to 5 ms per run on top of
  about 1 ms (``bench/executor.py``: 5.3x a bare ``subprocess.run`` against its goal of 1.5x). So it is used only
  when no watchdog could be started.

Considered and rejected: ``PR_SET_CHILD_SUBREAPER`` on the worker. Orphans re-parent to the worker while it lives,
but when the worker itself is SIGKILLed they go to init all the same, and nothing kills them. A watchdog per run,
between the worker and the target, would give the same guarantee for an interpreter start per run.

Not covered: a process that leaves its group on purpose (``setsid``, a daemon); processes a target left behind
after its leader exited normally (a target may start a daemon on purpose); a worker killed in the microseconds
between a spawn and its registration (then the leader lives on until recovery kills the orphan).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1

#: The watchdog itself (run with ``python -S -c``): register and forget groups from stdin; at EOF, kill them all.
WATCHDOG_CODE = """\
import os, signal
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
groups, buf = set(), b""
while True:
    try:
        chunk = os.read(0, 4096)
    except InterruptedError:
        continue
    except OSError:
        chunk = b""
    if not chunk:
        break
    buf += chunk
    *lines, buf = buf.split(b"\\n")
    for line in lines:
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# Resolved once, in the parent: between fork and exec the child must do as little as possible (no symbol lookup,
# no allocation that could wait on a lock another thread held at fork time).
_PRCTL = _load_prctl()


def pdeathsig_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` that gives the child SIGKILL when its parent thread dies; None where there is no prctl.

    The child checks afterwards that its parent is still the one that forked it: had the parent died between fork
    and prctl, no signal would ever come, so the child exits at once instead of running unowned.
    """
    prctl = _PRCTL
    if prctl is None:
        return None
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


class GroupWatchdog:
    """The watchdog of this process (see the module doc); ``register``/``unregister`` are thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner_pid = 0
        self._groups: set[int] = set()

    def ensure(self) -> bool:
        """Start the watchdog if none runs; whether one runs now (False: it could not be started)."""
        with self._lock:
            proc = self._current()
            if proc is None:
                proc = self._start()
                if proc is not None and self._groups:
                    self._write(proc, self._all_groups())
            return proc is not None

    def register(self, pgid: int) -> None:
        """A group started: kill it if this process dies before ``unregister``."""
        with self._lock:
            self._groups.add(pgid)
            self._send(f"+{pgid}\n".encode(), replay=True)

    def unregister(self, pgid: int) -> None:
        """The group's leader was reaped: leave the group alone from now on."""
        with self._lock:
            self._groups.discard(pgid)
            self._send(f"-{pgid}\n".encode(), replay=False)

    @property
    def pid(self) -> int | None:
        """The watchdog's pid, None before the first ``register`` (or in a fork that has not registered yet)."""
        proc = self._proc
        return proc.pid if proc is not None and self._owner_pid == os.getpid() else None

    def _send(self, line: bytes, *, replay: bool) -> None:
        proc = self._current()
        if proc is None:
            if not replay:
                return  # no watchdog to tell: nothing was registered with a live one
            proc = self._start()
            line = self._all_groups()  # a new watchdog must hear about every group still running
        if proc is None or self._write(proc, line):
            return
        log.warning("the group watchdog (pid %d) is gone; starting another", proc.pid)
        self._reap(proc)
        if replay:
            proc = self._start()
            if proc is not None:
                self._write(proc, self._all_groups())

    def _all_groups(self) -> bytes:
        return b"".join(f"+{g}\n".encode() for g in sorted(self._groups))

    @staticmethod
    def _write(proc: subprocess.Popen[bytes], line: bytes) -> bool:
        assert proc.stdin is not None
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except (OSError, ValueError):
            return False
        return True

    def _current(self) -> subprocess.Popen[bytes] | None:
        proc = self._proc
        if proc is None or self._owner_pid != os.getpid():
            # None yet, or inherited through a fork: that watchdog belongs to the parent.
            self._proc = None
            return None
        if proc.poll() is not None:
            log.warning("the group watchdog (pid %d) exited with %s; starting another", proc.pid, proc.returncode)
            self._reap(proc)
            return None
        return proc

    def _start(self) -> subprocess.Popen[bytes] | None:
        try:
            proc = subprocess.Popen([sys.executable, "-S", "-c", WATCHDOG_CODE], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            log.warning("could not start the group watchdog (%s); a run's grandchildren may outlive a killed "
                        "worker", exc)
            return None
        self._proc = proc
        self._owner_pid = os.getpid()
        return proc

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            proc.wait(timeout=1)
        if self._proc is proc:
            self._proc = None


_WATCHDOG = GroupWatchdog()


def watchdog() -> GroupWatchdog:
    """This process's watchdog."""
    return _WATCHDOG
