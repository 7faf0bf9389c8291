"""Process identity and liveness: start times that guard against pid reuse, group kills, the host name.

A process is identified by ``(host, pid, start_time)``. On Linux ``start_time`` is the process's start in seconds
since boot, read from ``/proc/<pid>/stat`` (``starttime`` clock ticks divided by ``SC_CLK_TCK``). It is measured
on the boot clock, so unlike an epoch time derived from ``btime`` it does not move when the wall clock is stepped
or slewed, and two readings of the same process compare equal. Elsewhere (no ``/proc``) it falls back to psutil's
``create_time()``, seconds since the epoch. Either way, only compare start times taken on the same host.
"""

from __future__ import annotations

import errno
import os
import socket

import psutil

_PROC = "/proc"
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Two readings of the same process are identical tick counts; half a tick absorbs float rounding and nothing more.
_START_TOLERANCE = 0.5 / _CLK_TCK


def _read_stat(pid: int) -> tuple[str, float] | None:
    """Return ``(state, start_time)`` from ``/proc/<pid>/stat``, or None when the process does not exist."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as fh:
            data = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may itself contain spaces or ')': split after the last one.
    fields = data[data.rindex(b")") + 2 :].split()
    state = fields[0].decode("ascii", "replace")
    start_ticks = int(fields[19])
    return state, start_ticks / _CLK_TCK


def _have_proc() -> bool:
    return os.path.exists(f"{_PROC}/self/stat")


_USE_PROC = _have_proc()


def process_start_time(pid: int) -> float | None:
    """Return the start time of process ``pid``, or None when there is no such process.

    Args:
        pid: the process id.

    Returns:
        Seconds since boot on Linux (from ``/proc``), seconds since the epoch elsewhere (psutil). Zombies still
        have a start time; ``is_process_alive`` is what treats them as dead.
    """
    if pid <= 0:
        return None
    if _USE_PROC:
        stat = _read_stat(pid)
        return None if stat is None else stat[1]
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def _state_and_start(pid: int) -> tuple[bool, float | None] | None:
    """Return ``(is_zombie, start_time)`` for ``pid``, or None when it does not exist."""
    if _USE_PROC:
        stat = _read_stat(pid)
        if stat is None:
            return None
        return stat[0] in ("Z", "X", "x"), stat[1]
    try:
        proc = psutil.Process(pid)
        return proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD), float(proc.create_time())
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:
        # Access denied: the process exists but cannot be inspected; treat it as running, start unknown.
        return False, None


def is_process_alive(pid: int, start_time: float | None = None) -> bool:
    """Tell whether process ``pid`` is running on this host (and is the same process, when ``start_time`` is given).

    ``os.kill(pid, 0)`` answering EPERM means the process exists but belongs to someone else: that counts as alive
    (the reference judged it dead in one place and alive in another). Zombies count as dead: they have exited and
    only wait to be reaped. With ``start_time``, a process whose start time differs is a later process that reused
    the pid, and counts as dead.

    Args:
        pid: the process id.
        start_time: the value ``process_start_time`` returned when the process was spawned, or None to skip
            the pid-reuse check.

    Returns:
        True when the process exists, is not a zombie and (if given) has the same start time.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OSError as exc:
        if exc.errno != errno.EPERM:
            return False
    info = _state_and_start(pid)
    if info is None:
        return False
    zombie, actual_start = info
    if zombie:
        return False
    if start_time is not None and actual_start is not None:
        return abs(actual_start - start_time) <= _START_TOLERANCE
    return True


def kill_process_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to every process of group ``pgid``.

    Args:
        pgid: the process group id (a target's pid: targets lead their own session and group).
        sig: the signal number, e.g. ``signal.SIGTERM``.

    Returns:
        True when the signal was delivered, False when the group no longer exists or may not be signalled.
    """
    if pgid <= 0:
        # killpg(0) would signal our own group; a negative id is meaningless here.
        return False
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def hostname() -> str:
    """Return this host's name, as recorded next to a pid so that liveness is only judged on the owning host.

    ``LOOPSQ_HOST`` overrides it: for processes that share a pid namespace but not a host name (containers
    with ``--pid=host``), or distinct "hosts" on one machine in tests.
    """
    return os.environ.get("LOOPSQ_HOST") or socket.gethostname()
