"""``loopsq up``: the whole system as supervised children (embedded Redis, scheduler, workers, mirror, web), on
the supervisor of ``loopsq.ops.supervisor``."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from loopsq.engine.slots import DEFAULT_CONCURRENCY
from loopsq.errors import LoopsqError
from loopsq.mirror import follower_lock
from loopsq.ops.embedded_redis import EmbeddedRedis, find_redis_server, server_version, write_private
from loopsq.ops.shutdown import grace_for
from loopsq.ops.supervisor import ChildSpec, Printer, Supervisor, describe_exit
from loopsq.state.connection import connect, mask_url
from loopsq.state.connection import server_version as redis_version
from loopsq.state.outages import OutageLog, wait_for_redis
from loopsq.system import config
from loopsq.system.secrets import FILE_SUFFIX, secret_from_env

API_TOKEN_ENV = "LOOPSQ_API_TOKEN"
API_TOKEN_FILE_ENV = API_TOKEN_ENV + FILE_SUFFIX
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
    #: The file ``redis_url`` was read from (``LOOPSQ_REDIS_URL_FILE``): the children get the path, not the URL.
    redis_url_file: str | None = None
    workers: int = 1
    #: Slots of each worker (``loopsq worker --concurrency``): one process holds several runs.
    concurrency: int = DEFAULT_CONCURRENCY
    demo: bool = False
    web: bool = False
    web_port: int = 8080
    stop_grace_s: float = 10.0


def api_token(data_dir: Path) -> str:
    """``LOOPSQ_API_TOKEN`` (or the file ``LOOPSQ_API_TOKEN_FILE`` names), else the token kept in
    ``<data-dir>/api.token`` (made once, mode 0600)."""
    return api_token_setting(data_dir)[0]


def api_token_setting(data_dir: Path) -> tuple[str, str | None]:
    """``(token, file)`` as ``api_token`` finds it; ``file`` is where it is kept (None: ``LOOPSQ_API_TOKEN``).

    Raises:
        ValidationError: ``LOOPSQ_API_TOKEN_FILE`` cannot be read, or is set beside ``LOOPSQ_API_TOKEN``.
    """
    found = secret_from_env(API_TOKEN_ENV)
    if found is not None:
        return found[0], (None if found[1] == API_TOKEN_ENV else os.environ[API_TOKEN_FILE_ENV].strip())
    path = data_dir / API_TOKEN_FILENAME
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        token = ""
    if not token:
        token = secrets.token_urlsafe(32)
        write_private(path, token + "\n")
    return token, str(path)


def web_token_env(data_dir: Path) -> dict[str, str]:
    """How up's web app gets its token: the file's path (``LOOPSQ_API_TOKEN_FILE``) when it is kept in one, so that
    it is in no process's environment; ``LOOPSQ_API_TOKEN`` only when that is how up was given it."""
    token, path = api_token_setting(data_dir)
    return {API_TOKEN_ENV: token} if path is None else {API_TOKEN_FILE_ENV: path}


#: What any child needs from up's environment: to find Python and loopsq, and the locale, zone and home.
BASE_ENV_KEYS = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR",
                           "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SYSTEMROOT"})
#: loopsq's own variables a child may be given (each only to the children that use it), never inherited as such.
PASSED_LOOPSQ_KEYS = {
    "all": ("LOOPSQ_HOST", "LOOPSQ_REDIS_SSL_CERT_REQS", "LOOPSQ_CLAIM_REPLICAS", "LOOPSQ_NAMESPACE"),
    "web": ("LOOPSQ_METRICS_PER_LOOP", "LOOPSQ_MCP_ALLOW_MUTATIONS", "LOOPSQ_MCP_ALLOW_TOOLS"),
    "mirror": ("LOOPSQ_MIRROR_NAME",),
    # What maintenance reads: the history windows and how long a silent mirror group holds the stream back.
    "scheduler": ("LOOPSQ_KEEP_RUNS", "LOOPSQ_KEEP_WORKFLOW_RUNS", "LOOPSQ_MIRROR_IDLE"),
}


def child_env(role: str, url: str | None, data_dir: Path, environ: dict[str, str] | None = None,
              url_file: str | None = None) -> dict[str, str]:
    """The environment of one of up's children: only what it needs.

    Every child gets ``BASE_ENV_KEYS`` and ``LC_*``, the Redis URL (``LOOPSQ_REDIS_URL_FILE``, the file's path, when
    ``url_file`` holds it: the embedded Redis's ``redis.url``, or the file up was given) and the data dir (the
    embedded Redis gets neither);
    ``LOOPSQ_HOST``, the namespace (``LOOPSQ_NAMESPACE``, which ``--namespace`` sets) and the Redis connection
    settings (``LOOPSQ_REDIS_SSL_CERT_REQS``, ``LOOPSQ_CLAIM_REPLICAS``);
    the web app its token (added by the caller), ``LOOPSQ_METRICS_PER_LOOP``, ``LOOPSQ_MCP_ALLOW_MUTATIONS`` and
    ``LOOPSQ_MCP_ALLOW_TOOLS``; the mirror ``LOOPSQ_MIRROR_NAME``; the scheduler the retention settings
    (``LOOPSQ_KEEP_RUNS``, ``LOOPSQ_KEEP_WORKFLOW_RUNS``, ``LOOPSQ_MIRROR_IDLE``). A worker gets the whole
    environment instead, because the commands and agents it runs need the user's variables (API keys, an SSH
    agent), but without loopsq's own: no ``LOOPSQ_*`` but what is set here, no ``REDIS_URL``, no ``PORT`` and no
    fault injection (``LOOPSQ_FAULT``: a stray one would make every worker kill itself on every run).
    """
    source = dict(os.environ) if environ is None else environ
    if role == "worker":
        env = {k: v for k, v in source.items() if not k.startswith("LOOPSQ_") and k not in ("REDIS_URL", "PORT")}
    else:
        env = {k: v for k, v in source.items() if k in BASE_ENV_KEYS or k.startswith("LC_")}
    if url is not None:  # a loopsq process (the embedded Redis needs none of this)
        for key in (*PASSED_LOOPSQ_KEYS["all"], *PASSED_LOOPSQ_KEYS.get(role, ())):
            if source.get(key):
                env[key] = source[key]
        env.update({"LOOPSQ_REDIS_URL_FILE": url_file} if url_file is not None else {"LOOPSQ_REDIS_URL": url})
        env["LOOPSQ_DATA_DIR"] = str(data_dir)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def app_specs(cfg: UpConfig, url: str, url_file: str | None = None) -> list[ChildSpec]:
    """The scheduler, the workers, the mirror (and the web app), each a ``python -m loopsq`` child; ``url_file``
    holds ``url`` (the children are given its path)."""
    loopsq = (sys.executable, "-m", "loopsq")

    def env_of(role: str) -> dict[str, str]:
        return child_env(role, url, cfg.data_dir, url_file=url_file)

    specs = [ChildSpec("scheduler", (*loopsq, "scheduler"), env_of("scheduler"))]
    # A worker's grace must end before up's stop timeout does, so its current run is recorded and handed on
    # rather than killed with it.
    grace = f"{grace_for(int(cfg.stop_grace_s * 1000))}ms"
    worker_env = env_of("worker")
    specs += [ChildSpec(f"worker.{i}", (*loopsq, "worker", "--grace", grace, "--concurrency", str(cfg.concurrency)),
                        worker_env)
              for i in range(1, cfg.workers + 1)]
    specs.append(ChildSpec("mirror", (*loopsq, "mirror"), env_of("mirror")))
    if cfg.web:
        # The mirror above already follows the change stream into this data dir (one follower per data dir).
        web_env = {**env_of("web"), **web_token_env(cfg.data_dir)}
        specs.append(ChildSpec("web", (*loopsq, "web", "--port", str(cfg.web_port), "--no-mirror"), web_env))
    return specs


def check_web_port(port: int) -> None:
    """Refuse to start when the web app's port is taken (by another ``up``, say): its URL would be another's.

    Raises:
        LoopsqError: naming the address and the way out.
    """
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise LoopsqError(f"cannot serve the web app on 127.0.0.1:{port}: {exc.strerror or exc}; "
                              "pass --web-port PORT (or --no-web)") from exc


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
        child = sup.add(ChildSpec("redis", tuple(embedded.argv()), child_env("redis", None, embedded.dir), stage=1))
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


def _say_logger(sup: Supervisor) -> logging.Logger:
    """A logger whose records are the supervisor's own lines (``up | ...``)."""

    class Say(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            sup.say(record.getMessage())

    logger = logging.getLogger(f"loopsq.up.{id(sup)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.handlers = [Say()]
    return logger


def bring_layout_forward(sup: Supervisor, url: str) -> None:
    """Migrate a state of an older layout (an embedded Redis a 0.1.0 ``up`` wrote) before any child starts, so
    that none of them meets it and exits; refuse a newer one (``StateLayoutError``, exit 2) before the demo or
    any child writes into it (README, "Upgrading")."""
    from loopsq.state import layout, migrations
    from loopsq.state.keys import Keys
    from loopsq.system.config import configured_namespace

    client = connect(url)
    try:
        keys = Keys(configured_namespace())
        found = layout.read(client, keys)
        if layout.EMPTY < found.version < layout.LAYOUT or found.migrating_to is not None:
            migrations.migrate(client, keys, wait_s=120.0, say=sup.say)
        layout.check(client, keys, writer=True)
    finally:
        client.close()


def run_up(cfg: UpConfig, stop: threading.Event, force: threading.Event | None = None,
           printer: Printer | None = None) -> None:
    """Run everything until ``stop`` is set, then stop it all; ``force`` skips the stop grace.

    Raises:
        LoopsqError: when another ``up`` runs on the data dir, another process follows its mirror, the web port is
            taken, no redis-server can be found, the embedded Redis does not start, or a child keeps failing right
            after it starts.
        RedisUnavailableError: on a configuration error of a configured Redis (wrong password, bad URL); an
            unreachable one is waited for.
    """
    sup = Supervisor(printer or Printer(), stop_grace_s=cfg.stop_grace_s)
    binary = None
    if not config.up_is_running(cfg.data_dir):  # else the lock below says which up runs there
        # What would make a child fail at once is refused here, before anything is started or written.
        if cfg.web:
            check_web_port(cfg.web_port)
        binary = find_redis_server() if cfg.redis_url is None else None
    cfg.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = UpLock(cfg.data_dir)
    lock.acquire()
    holder = follower_lock.probe(cfg.data_dir)
    if holder is not None:  # up's mirror would be refused: say so now, not in a restart loop
        lock.release()
        raise LoopsqError(follower_lock.busy_message(cfg.data_dir, holder))
    embedded: EmbeddedRedis | None = None
    try:
        sup.say(f"data dir {cfg.data_dir}")
        url = cfg.redis_url
        if url is None:
            embedded = EmbeddedRedis(cfg.data_dir, binary or find_redis_server())
            url = start_embedded_redis(sup, embedded, stop)
        else:
            client = connect(url, check=False)
            if not wait_for_redis(client, OutageLog(url, _say_logger(sup)), stop):
                return
            sup.say(f"using Redis at {mask_url(url)} (redis-server {redis_version(client)})")
            client.close()
        if url is None or stop.is_set():
            return
        bring_layout_forward(sup, url)
        if cfg.demo:
            from loopsq.domain import timeutil
            from loopsq.ops.demo import create_demo

            client = connect(url)
            try:
                from loopsq.state.keys import Keys
                from loopsq.system.config import configured_namespace

                for line in create_demo(client, timeutil.now(), Keys(configured_namespace())):
                    sup.say(line)
            finally:
                client.close()
        url_file = str(embedded.url_file) if embedded is not None else cfg.redis_url_file
        for spec in app_specs(cfg, url, url_file):
            sup.start(sup.add(spec))
        if cfg.web:
            where = api_token_setting(cfg.data_dir)[1] or API_TOKEN_ENV
            sup.say(f"web: http://127.0.0.1:{cfg.web_port}/ (API token in {where})")
        hint = "; try `loopsq runs demo-hello` in another terminal" if cfg.demo else ""
        sup.say(f"running; Ctrl-C stops everything{hint}")
        sup.run(stop)
        failing = sup.given_up
        if failing is not None and not stop.is_set():
            raise LoopsqError(f"{failing.spec.name} kept failing right after it started; stopped everything "
                              f"(see its lines above)")
    finally:
        if any(c.running for c in sup.children):
            sup.say("stop signal received; stopping everything" if stop.is_set() else "stopping everything")
        sup.shutdown(force)
        if embedded is not None:
            embedded.unpublish_url()
        lock.release()
        sup.say("stopped")
