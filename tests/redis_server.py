"""A private ``redis-server`` for the test session, on a free port, in a temporary directory.

Tests never touch the machine's shared Redis on 6379: every test that needs a real server gets this one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def free_port() -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process; ``url`` points at it. ``start``/``stop``/``restart`` keep the same port."""

    def __init__(self, *, appendonly: bool = False, appendfsync: str = "everysec") -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (the CI script installs it; apt-get install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="loopsq-redis-"))
        self.appendonly = appendonly
        #: ``always``: every write is on disk before Redis answers it, so a SIGKILL loses no acknowledged write.
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"), "--protected-mode", "no",
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.02)
        client.close()
        return self

    def stop(self, sig: int | None = None) -> None:
        if self.proc is None:
            return
        if sig is not None:
            os.kill(self.proc.pid, sig)
        else:
            self.proc.terminate()
        self.proc.wait(timeout=10)
        self.proc = None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True, **kwargs)  # type: ignore[arg-type]

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
