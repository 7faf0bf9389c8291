"""``loopsq web``: serve the HTTP API, the dashboard and ``/metrics`` with uvicorn (plus a mirror follower, unless
``--no-mirror`` or another process follows the data dir: ``loopsq.web.context``).

Where it listens: ``--host``/``--port``; else, when ``PORT`` is set (a Heroku-style platform, honcho, foreman),
``0.0.0.0:$PORT``, as those platforms require; else ``127.0.0.1:8080``. loopsq binds the socket itself, so a
taken port is one ``error:`` line with exit status 1, never uvicorn's own exit status 3 (which would read as
loopsq's "Redis unreachable").
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import threading

import click

from loopsq.cli.app import get_app
from loopsq.cli.options import at_least, duration_flag
from loopsq.domain import limits
from loopsq.errors import LoopsqError, RedisUnavailableError, ValidationError
from loopsq.state.connection import mask_url
from loopsq.system.secrets import secret_from_env

TOKEN_ENV = "LOOPSQ_API_TOKEN"
PORT_ENV = "PORT"
SESSION_TTL_ENV = "LOOPSQ_SESSION_TTL"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8080
#: Where a process bound to ``PORT`` listens: such platforms route to it from outside the container.
PLATFORM_HOST = "0.0.0.0"

log = logging.getLogger("loopsq.web")


def resolve_token(generate: bool) -> tuple[str, bool]:
    """The API token: ``LOOPSQ_API_TOKEN`` (or the file ``LOOPSQ_API_TOKEN_FILE`` names), else a new one with
    ``--generate-token``; ``(token, generated)``.

    Raises:
        ValidationError: when there is none, or it is shorter than 16 characters.
    """
    from loopsq.web.auth import MIN_TOKEN_LENGTH

    found = secret_from_env(TOKEN_ENV)
    if found is not None:
        token, source = found
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValidationError(f"{source} must be at least {MIN_TOKEN_LENGTH} characters, got {len(token)}")
        return token, False
    if not generate:
        raise ValidationError(f"{TOKEN_ENV} is not set: set it (or {TOKEN_ENV}_FILE) to a secret of at least "
                              f"{MIN_TOKEN_LENGTH} characters, or pass --generate-token to have one made and printed")
    return secrets.token_urlsafe(32), True


def listen_address(host: str | None, port: int | None) -> tuple[str, int]:
    """Where to listen: the flags, else ``0.0.0.0:$PORT`` when ``PORT`` is set, else ``127.0.0.1:8080``.

    Raises:
        ValidationError: ``PORT`` is set but is not a TCP port.
    """
    env_port = os.environ.get(PORT_ENV, "").strip()
    if port is None and env_port:
        if not env_port.isdigit() or not 1 <= int(env_port) <= 65535:
            raise ValidationError(f"{PORT_ENV} must be a TCP port (1-65535), got '{env_port}'")
        return host or PLATFORM_HOST, int(env_port)
    return host or DEFAULT_HOST, DEFAULT_PORT if port is None else port


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (listening starts with the server).

    Raises:
        LoopsqError: the address is taken or cannot be bound; the message names it and the way out.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LoopsqError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; "
                          f"pass --port (or set {PORT_ENV}) to use another port") from exc
    sock.set_inheritable(False)
    return sock


@click.command("web")
@click.option("--host", metavar="HOST",
              help=f"Interface to bind [{DEFAULT_HOST}; {PLATFORM_HOST} when {PORT_ENV} is set].")
@click.option("--port", type=click.IntRange(0, 65535), metavar="PORT",
              help=f"TCP port [env {PORT_ENV}, else {DEFAULT_PORT}].")
@click.option("--generate-token", is_flag=True, help=f"Without {TOKEN_ENV}, make a token and print it.")
@click.option("--no-mirror", is_flag=True,
              help="Do not follow the change stream here (reads still catch up). It does not either while another "
                   "process follows the data dir (loopsq mirror).")
@click.option("--no-rq-dashboard", is_flag=True, help="Do not mount rq-dashboard under /rq.")
@click.option("--session-ttl", default="12h", show_default=True, envvar=SESSION_TTL_ENV, metavar="DURATION",
              help=f"How long a dashboard login lasts [env {SESSION_TTL_ENV}].")
def web(host: str | None, port: int | None, generate_token: bool, no_mirror: bool, no_rq_dashboard: bool,
        session_ttl: str) -> None:
    """Serve the HTTP API, the dashboard and /metrics (token from LOOPSQ_API_TOKEN)."""
    import uvicorn

    from loopsq.engine import layout_guard
    from loopsq.mirror.identity import configured_name
    from loopsq.state.connection import connect
    from loopsq.web import WebSettings, create_app
    from loopsq.web.metrics import per_loop_from_env

    app_ctx = get_app()
    url = app_ctx.redis_url  # a configuration error ends it here, before anything is bound or printed
    with contextlib.suppress(RedisUnavailableError):  # (a Redis that is down is waited for: 503 meanwhile)
        app_ctx.client()  # a state in a layout this release does not read: exit 2 (``state.layout``)
    host, port = listen_address(host, port)
    configured_name()  # a malformed LOOPSQ_MIRROR_NAME (exit 2)
    per_loop = per_loop_from_env()
    ttl_ms = at_least("--session-ttl", session_ttl, duration_flag("--session-ttl", session_ttl) or 0,
                      limits.MIN_SESSION_TTL_MS)
    token, generated = resolve_token(generate_token)
    sock = bind(host, port)
    port = int(sock.getsockname()[1])
    if generated:
        click.echo(f"{TOKEN_ENV}={token}")
    logging.basicConfig(level=logging.INFO, format="[loopsq-web] %(message)s")
    if host not in LOOPBACK:
        log.warning("binding %s: the API is reachable from other hosts; put TLS in front of it", host)
    settings = WebSettings(redis_url=url, data_dir=app_ctx.data_dir, token=token,
                           keys=app_ctx.keys, follow_mirror=not no_mirror, rq_dashboard=not no_rq_dashboard,
                           metrics_per_loop=per_loop, session_ttl_s=ttl_ms // 1000)
    log.info("serving http://%s:%d (redis %s, mirror %s)", host, port, mask_url(url),
             app_ctx.data_dir / "loops.db")
    # A state a newer release migrated while this one serves: exit 2 with one line (README, "Upgrading").
    # It watches for as long as the server serves, no longer (a server run in a test's process ends, the process
    # and its Redis go on).
    served = threading.Event()
    layout_guard.LayoutGuard(connect(url, check=False), app_ctx.keys, served).start()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="info", access_log=False,
                                           proxy_headers=False, server_header=False))
    try:
        server.run(sockets=[sock])
    except SystemExit as exc:
        # uvicorn exits 3 when it cannot start; loopsq's own 3 means "Redis unreachable".
        raise LoopsqError(f"the web server did not start (uvicorn exit status {exc.code}; see the log above)") from exc
    finally:
        served.set()
        sock.close()
    if not server.started:
        raise LoopsqError("the web server did not start (see the log above)")
