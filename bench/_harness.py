"""Shared plumbing of the distributed benchmarks: a private redis-server, child processes in their own process
groups that are always killed on exit (also on Ctrl-C, SIGTERM or the time bound), percentiles and timestamps.

Nothing here measures anything; ``lag.py``, ``run_overhead.py`` and ``recovery.py`` do.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for _p in (str(ROOT), str(BENCH)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from tests.redis_server import RedisServer  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable

#: The target writes its own start time first thing, with bash's builtin clock (no fork of ``date``): the most
#: direct "process start" there is short of the kernel's (whose /proc start time has only 10 ms resolution).
LEDGER_SCRIPT = 'echo "$EPOCHREALTIME $LOOPS_SCHEDULED_FOR $LOOPS_LOOP_ID $LOOPS_RUN_ID" >> {ledger}'


class BenchTimeout(Exception):
    """Raised when a benchmark exceeds its time bound."""


class Harness:
    """Owns every process a benchmark starts and a scratch directory; ``close()`` (also at exit) ends them all."""

    def __init__(self, name: str, time_bound_s: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"loopsq-bench-{name}-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        #: Process groups of targets our workers started (pgid -> a word of its command line), killed at exit.
        self.extra_groups: dict[int, str] = {}
        self.servers: list[RedisServer] = []
        self._closed = False
        atexit.register(self.close)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.alarm(time_bound_s)

    @staticmethod
    def _on_signal(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    @staticmethod
    def _on_alarm(_signum: int, _frame: object) -> None:
        raise BenchTimeout("benchmark exceeded its time bound")

    # -- redis ------------------------------------------------------------------------------------------------
    def redis(self) -> RedisServer:
        """A fresh private redis-server on a free port (never the machine's shared one)."""
        server = RedisServer().start()
        self.servers.append(server)
        return server

    # -- processes --------------------------------------------------------------------------------------------
    def spawn(self, args: Sequence[str], log_name: str, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``args`` as the leader of a new process group, output to ``<dir>/<log_name>.log`` (in ``cwd``,
        default this checkout)."""
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(BENCH), full_env.get("PYTHONPATH", "")])
        full_env.update(env or {})
        log = open(self.dir / f"{log_name}.log", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(list(args), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, cwd=str(cwd or ROOT), start_new_session=True)
        log.close()
        self.procs.append(proc)
        return proc

    def loopsq(self, role: str, url: str, log_name: str, *extra: str) -> subprocess.Popen[bytes]:
        """``python -m loopsq <role>`` against ``url``."""
        return self.spawn([PYTHON, "-m", "loopsq", role, *extra], log_name, {"LOOPSQ_REDIS_URL": url})

    def stop(self, proc: subprocess.Popen[bytes], timeout: float = 10.0, *, term: bool = True) -> None:
        """SIGTERM the process group (unless ``term`` is false: already sent), SIGKILL it after ``timeout``."""
        if proc.poll() is None:
            if term:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout)
        if proc.poll() is None:  # only while the leader is unreaped is its pid surely still our group's id
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    def stop_many(self, procs: Sequence[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
        """SIGTERM every process group at once, then reap (and SIGKILL the rest) one by one."""
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            self.stop(proc, timeout, term=False)

    def stop_all(self, timeout: float = 10.0) -> None:
        """Stop every process started so far, in reverse order, then the extra groups registered."""
        self.stop_many(list(reversed(self.procs)), timeout)
        self.procs.clear()
        for pgid, marker in self.extra_groups.items():
            try:
                with open(f"/proc/{pgid}/cmdline", "rb") as fh:
                    mine = marker.encode() in fh.read()
            except OSError:
                continue
            if mine:  # still the target process we registered, not a reused pid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
        self.extra_groups.clear()

    def close(self) -> None:
        """End every process and server; idempotent."""
        if self._closed:
            return
        self._closed = True
        signal.alarm(0)
        self.stop_all(timeout=5.0)
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.cleanup()

    def log_tail(self, log_name: str, lines: int = 20) -> str:
        """The last lines of a child's log (for error reports)."""
        path = self.dir / f"{log_name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# -- figures ---------------------------------------------------------------------------------------------------
def pct(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an ascending sequence (p in 0..100)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), int(-(-p * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def summary_ms(values_s: Sequence[float]) -> str:
    """``p50 p90 p99 max`` of seconds, printed in milliseconds."""
    v = sorted(values_s)
    if not v:
        return "no samples"
    return (f"p50 {pct(v, 50) * 1e3:8.1f}  p90 {pct(v, 90) * 1e3:8.1f}  p99 {pct(v, 99) * 1e3:8.1f}  "
            f"max {v[-1] * 1e3:8.1f} ms  (n={len(v)})")


def load_average() -> str:
    """The 1/5/15-minute load averages (other processes on this host skew every figure)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def iso_to_epoch(text: str) -> float:
    """Epoch seconds of an ISO-8601 timestamp with ``Z`` or an offset (RQ's and loopsq's formats)."""
    t = text.strip()
    if t.endswith("Z"):
        t = t[:-1] + "+00:00"
    dt = datetime.fromisoformat(t)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def epoch_to_iso(epoch: float) -> str:
    """loopsq's timestamp format (UTC, milliseconds, ``Z``)."""
    dt = datetime.fromtimestamp(epoch, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def read_ledger(path: Path) -> Iterator[list[str]]:
    """Lines of a ledger file, split on whitespace."""
    if not path.exists():
        return
    with open(path, encoding="ascii", errors="replace") as fh:
        for line in fh:
            parts = line.split()
            if parts:
                yield parts


def wait_for(predicate: object, timeout: float, interval: float = 0.02, what: str = "condition") -> None:
    """Poll ``predicate()`` until true; raise TimeoutError naming ``what``."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
