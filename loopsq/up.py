"""``loopsq up``: the whole system as supervised children (embedded Redis, scheduler, workers, mirror, web).

The supervisor: named children with prefixed output, restarts with backoff, staged clean stops.
Each child runs in a session (and so a process group) of its own: a Ctrl-C at the terminal reaches the supervisor
alone, which then stops the children in stages (the app processes first, the Redis they need last), each with
SIGTERM to its group, then SIGKILL to the group after a grace. On Linux each child also gets the parent-death
signal (SIGTERM), so a supervisor killed with SIGKILL leaves no orphans behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from loopsq import config
from loopsq.embedded_redis import EmbeddedRedis, find_redis_server, server_version, write_private
from loopsq.errors import LoopsqError
from loopsq.redis_conn import connect, mask_url
from loopsq.redis_conn import server_version as redis_version

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

    @property
    def running(self) -> bool:
        """Whether its process is alive (not yet reaped)."""
        return self.popen is not None and self.popen.poll() is None


class Supervisor:
    """Runs children, restarts those that exit with capped exponential backoff, and stops them all in stages.

    The backoff starts at ``backoff_initial_s`` and doubles up to ``backoff_max_s``; a child that ran for
    ``stable_after_s`` or longer before exiting starts over from the initial delay.
    """

    def __init__(
        self,
        printer: Printer,
        *,
        stop_grace_s: float = 10.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        stable_after_s: float = 30.0,
        poll_s: float = 0.1,
        name: str = "up",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.printer = printer
        self.stop_grace_s = stop_grace_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
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
        child.reader = threading.Thread(target=self._pump, args=(child.spec.name, popen), daemon=True,
                                        name=f"output-{child.spec.name}")
        child.reader.start()
        self.say(f"started {child.spec.name} (pid {popen.pid})")

    def _pump(self, name: str, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdout is not None
        with popen.stdout:
            for raw in iter(popen.stdout.readline, b""):
                self.printer.line(name, raw.decode("utf-8", "replace").rstrip("\r\n"))

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
                delay = child.backoff_s
                child.backoff_s = min(child.backoff_s * 2, self.backoff_max_s)
                child.popen = None
                _signal_group(popen.pid, signal.SIGKILL)  # helpers it left in its group go with it
                child.restart_at = now + delay
                self.say(f"{child.spec.name} exited with {describe_exit(popen.returncode)}; "
                         f"restarting in {delay:g}s")
            elif popen is None and child.restart_at is not None and now >= child.restart_at:
                self.start(child)

    def run(self, stop: threading.Event) -> None:
        """Supervise until ``stop`` is set (``shutdown`` is the caller's)."""
        while not stop.is_set():
            self.check()
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


API_TOKEN_ENV = "LOOPSQ_API_TOKEN"
API_TOKEN_FILENAME = "api.token"


# -- loopsq up ----------------------------------------------------------------------------------------------------


class UpLock:
    """``<data-dir>/up.lock``: held with ``flock`` while ``loopsq up`` runs there, holding its pid.

    The kernel drops the lock when the process dies, however it dies, so a stale file never blocks a new ``up``.
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / config.UP_LOCK_FILENAME
        self._fd: int | None = None

    def acquire(self, wait_s: float = 1.0) -> None:
        """Take the lock or raise ``LoopsqError`` naming the running ``up``'s pid.

        It retries for ``wait_s``: ``config.up_is_running`` takes the lock shared for an instant.
        """
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
                    os.close(fd)
                    raise LoopsqError(
                        f"loopsq up is already running for data dir {self.data_dir} (pid {holder}); "
                        "stop it first or use another --data-dir"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Give the lock up."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None


@dataclass(frozen=True)
class UpConfig:
    """What ``loopsq up`` runs: ``redis_url`` None means the embedded Redis."""

    data_dir: Path
    redis_url: str | None = None
    workers: int = 2
    demo: bool = False
    web: bool = False
    web_port: int = 8080
    stop_grace_s: float = 10.0


def api_token(data_dir: Path) -> str:
    """``LOOPSQ_API_TOKEN``, else the token kept in ``<data-dir>/api.token`` (made once, mode 0600)."""
    token = os.environ.get(API_TOKEN_ENV, "").strip()
    if token:
        return token
    path = data_dir / API_TOKEN_FILENAME
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    if not token:
        token = secrets.token_urlsafe(32)
        write_private(path, token + "\n")
    return token


def app_specs(cfg: UpConfig, url: str) -> list[ChildSpec]:
    """The scheduler, the workers, the mirror (and the web app), each a ``python -m loopsq`` child."""
    env = {**os.environ, "LOOPSQ_REDIS_URL": url, "LOOPSQ_DATA_DIR": str(cfg.data_dir), "PYTHONUNBUFFERED": "1"}
    loopsq = (sys.executable, "-m", "loopsq")
    specs = [ChildSpec("scheduler", (*loopsq, "scheduler"), env)]
    # A worker's grace must end before up's stop timeout does, so its current run is recorded and handed on
    # rather than killed with it.
    grace = f"{max(500, int(cfg.stop_grace_s * 1000) - 2000)}ms"
    specs += [ChildSpec(f"worker.{i}", (*loopsq, "worker", "--grace", grace), env) for i in range(1, cfg.workers + 1)]
    specs.append(ChildSpec("mirror", (*loopsq, "mirror"), env))
    if cfg.web:
        # The mirror above already follows the change stream into this data dir.
        web_env = {**env, API_TOKEN_ENV: api_token(cfg.data_dir)}
        specs.append(ChildSpec("web", (*loopsq, "web", "--port", str(cfg.web_port), "--no-mirror"), web_env))
    return specs


def start_embedded_redis(sup: Supervisor, embedded: EmbeddedRedis, stop: threading.Event,
                         attempts: int = 5) -> str | None:
    """Start the embedded Redis as the last-stopped child and publish its URL; None when stopped meanwhile.

    Raises:
        LoopsqError: when it does not start after ``attempts`` ports.
    """
    orphan = embedded.stop_orphan()
    if orphan is not None:
        sup.say(f"stopped redis-server pid {orphan}, left running by an earlier loopsq up")
    embedded.unpublish_url()
    version = server_version(embedded.binary)
    for _ in range(attempts):
        embedded.configure()
        sup.say(f"starting redis-server {version} ({embedded.binary}) on 127.0.0.1:{embedded.port}, "
                f"AOF in {embedded.dir}")
        child = sup.add(ChildSpec("redis", tuple(embedded.argv()), stage=1))
        sup.start(child)
        assert child.popen is not None
        if embedded.wait_ready(child.popen, stop):
            embedded.publish_url()
            sup.say(f"redis ready at {mask_url(embedded.url)} (URL in {embedded.url_file})")
            return embedded.url
        if stop.is_set():
            return None
        code = child.popen.wait()
        if child.reader is not None:
            child.reader.join(timeout=2)
        sup.say(f"redis exited with {describe_exit(code)} while starting")
        child.popen = None
        sup.remove(child)
    raise LoopsqError(f"the embedded redis-server did not start after {attempts} attempts (see the redis lines)")


def run_up(cfg: UpConfig, stop: threading.Event, force: threading.Event | None = None,
           printer: Printer | None = None) -> None:
    """Run everything until ``stop`` is set, then stop it all; ``force`` skips the stop grace.

    Raises:
        LoopsqError: when another ``up`` runs on the data dir, or the embedded Redis does not start.
        RedisUnavailableError: when a configured Redis does not answer.
    """
    sup = Supervisor(printer or Printer(), stop_grace_s=cfg.stop_grace_s)
    cfg.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = UpLock(cfg.data_dir)
    lock.acquire()
    embedded: EmbeddedRedis | None = None
    try:
        sup.say(f"data dir {cfg.data_dir}")
        if cfg.redis_url is None:
            embedded = EmbeddedRedis(cfg.data_dir, find_redis_server())
            url = start_embedded_redis(sup, embedded, stop)
        else:
            url = cfg.redis_url
            client = connect(url)
            sup.say(f"using Redis at {mask_url(url)} (redis-server {redis_version(client)})")
            client.close()
        if url is None or stop.is_set():
            return
        if cfg.demo:
            from loopsq import timeutil
            from loopsq.demo import create_demo

            client = connect(url)
            try:
                for line in create_demo(client, timeutil.now()):
                    sup.say(line)
            finally:
                client.close()
        for spec in app_specs(cfg, url):
            sup.start(sup.add(spec))
        if cfg.web:
            where = "LOOPSQ_API_TOKEN" if os.environ.get(API_TOKEN_ENV, "").strip() else \
                cfg.data_dir / API_TOKEN_FILENAME
            sup.say(f"web: http://127.0.0.1:{cfg.web_port}/ (API token in {where})")
        hint = "; try `loopsq runs demo-hello` in another terminal" if cfg.demo else ""
        sup.say(f"running; Ctrl-C stops everything{hint}")
        sup.run(stop)
    finally:
        if any(c.running for c in sup.children):
            sup.say("stop signal received; stopping everything" if stop.is_set() else "stopping everything")
        sup.shutdown(force)
        if embedded is not None:
            embedded.unpublish_url()
        lock.release()
        sup.say("stopped")
