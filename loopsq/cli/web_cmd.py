"""``loopsq web``: serve the HTTP API, the dashboard and ``/metrics`` with uvicorn (plus a mirror follower)."""

from __future__ import annotations

import logging
import os
import secrets

import click

from loopsq.cli.app import get_app
from loopsq.cli.options import at_least, duration_flag
from loopsq.domain import limits
from loopsq.errors import ValidationError
from loopsq.state.connection import mask_url

TOKEN_ENV = "LOOPSQ_API_TOKEN"
SESSION_TTL_ENV = "LOOPSQ_SESSION_TTL"
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})

log = logging.getLogger("loopsq.web")


def resolve_token(generate: bool) -> tuple[str, bool]:
    """The API token: ``LOOPSQ_API_TOKEN``, else a new one with ``--generate-token``; ``(token, generated)``.

    Raises:
        ValidationError: when there is none, or it is shorter than 16 characters.
    """
    from loopsq.web.auth import MIN_TOKEN_LENGTH

    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        if len(token) < MIN_TOKEN_LENGTH:
            raise ValidationError(f"{TOKEN_ENV} must be at least {MIN_TOKEN_LENGTH} characters, got {len(token)}")
        return token, False
    if not generate:
        raise ValidationError(f"{TOKEN_ENV} is not set: set it to a secret of at least {MIN_TOKEN_LENGTH} "
                              "characters, or pass --generate-token to have one made and printed")
    return secrets.token_urlsafe(32), True


@click.command("web")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="TCP port.")
@click.option("--generate-token", is_flag=True, help=f"Without {TOKEN_ENV}, make a token and print it.")
@click.option("--no-mirror", is_flag=True, help="Do not follow the change stream here (reads still catch up).")
@click.option("--no-rq-dashboard", is_flag=True, help="Do not mount rq-dashboard under /rq.")
@click.option("--session-ttl", default="12h", show_default=True, envvar=SESSION_TTL_ENV, metavar="DURATION",
              help=f"How long a dashboard login lasts [env {SESSION_TTL_ENV}].")
def web(host: str, port: int, generate_token: bool, no_mirror: bool, no_rq_dashboard: bool,
        session_ttl: str) -> None:
    """Serve the HTTP API, the dashboard and /metrics (token from LOOPSQ_API_TOKEN)."""
    import uvicorn

    from loopsq.web import WebSettings, create_app

    app_ctx = get_app()
    ttl_ms = at_least("--session-ttl", session_ttl, duration_flag("--session-ttl", session_ttl) or 0,
                      limits.MIN_SESSION_TTL_MS)
    token, generated = resolve_token(generate_token)
    if generated:
        click.echo(f"{TOKEN_ENV}={token}")
    logging.basicConfig(level=logging.INFO, format="[loopsq-web] %(message)s")
    if host not in LOOPBACK:
        log.warning("binding %s: the API is reachable from other hosts; put TLS in front of it", host)
    settings = WebSettings(redis_url=app_ctx.redis_url, data_dir=app_ctx.data_dir, token=token,
                           keys=app_ctx.keys, follow_mirror=not no_mirror, rq_dashboard=not no_rq_dashboard,
                           session_ttl_s=ttl_ms // 1000)
    log.info("serving http://%s:%d (redis %s, mirror %s)", host, port, mask_url(app_ctx.redis_url),
             app_ctx.data_dir / "loops.db")
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info", access_log=False,
                proxy_headers=False, server_header=False)
