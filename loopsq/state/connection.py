"""Connecting to Redis: URL masking, connection options, and the one error users see when Redis is down."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis

from loopsq.errors import RedisUnavailableError

Redis = redis.Redis


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (``redis://:***@host:6379/0``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable redis url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, f"{user}:***@{host}", parts.path, parts.query, parts.fragment))


def connect(url: str, *, timeout: float = 5.0, check: bool = True) -> redis.Redis:
    """Open a client for ``url`` (``decode_responses`` on) and, with ``check``, ping it once.

    Raises:
        RedisUnavailableError: when the URL is malformed or the server does not answer; the message carries the
            masked URL and the reason.
    """
    try:
        client: redis.Redis = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            health_check_interval=30,
        )
    except (ValueError, redis.RedisError) as exc:
        raise RedisUnavailableError(f"invalid Redis URL {mask_url(url)}: {exc}") from exc
    if check:
        ping(client, url)
    return client


def ping(client: redis.Redis, url: str) -> None:
    """Ping ``client``; wrap any failure in RedisUnavailableError naming the masked URL."""
    try:
        client.ping()
    except redis.RedisError as exc:
        raise unavailable(url, exc) from exc


def unavailable(url: str, exc: BaseException) -> RedisUnavailableError:
    """The error for a Redis failure at ``url``, with the password masked in the URL and in the reason."""
    reason = str(exc).replace(url, mask_url(url)) or type(exc).__name__
    return RedisUnavailableError(f"cannot reach Redis at {mask_url(url)}: {reason}")


def server_version(client: redis.Redis) -> str:
    """The server's ``redis_version`` from INFO."""
    info: dict[str, Any] = client.info("server")
    return str(info.get("redis_version", "unknown"))
