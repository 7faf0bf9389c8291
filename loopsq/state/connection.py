"""Connecting to Redis: clients for every accepted URL form (plain, TLS, unix socket, Sentinel), clients that
share a server with another, URL masking, and the one error users see when Redis is down.

A ``redis+sentinel://`` URL gives a client of redis-py's ``Sentinel``: it asks the sentinels for the master of
the service and, after a failover, for the new one (a demoted master's ``READONLY`` reply or a dropped connection
makes it ask again). ``sibling`` keeps that for every further client (RQ's bytes client, a second thread's).
"""

from __future__ import annotations

import os
from typing import Any

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.utils import SENTINEL

from loopsq.domain.redis_url import (
    CERT_REQS_ENV,
    RedisUrl,
    apply_cert_reqs_default,
    mask_in,
    parse_redis_url,
)
from loopsq.domain.redis_url import mask_url as mask_url
from loopsq.errors import RedisUnavailableError

Redis = redis.Redis

#: Query options passed to redis-py's connections under the same name.
_PASSTHROUGH = ("socket_timeout", "socket_connect_timeout", "health_check_interval", "client_name",
                "ssl_cert_reqs", "ssl_ca_certs", "ssl_check_hostname", "ssl_certfile", "ssl_keyfile")


class SentinelConnection(SentinelManagedConnection):
    """redis-py's Sentinel connection, closed on any error while reading a reply, as its plain ``Connection`` is.

    redis-py's ``SentinelManagedConnection.read_response`` defaults ``disconnect_on_error`` to False: a read
    interrupted by an exception (RQ's stop request raised from the SIGTERM handler, during its blocking dequeue)
    left the blocked command's reply pending on the connection, and the next command on it (RQ's
    ``register_death``) waited for a reply that never matched: the worker hung on SIGTERM.
    """

    def read_response(self, disable_decoding: bool = False, *, timeout: float | object = SENTINEL,
                      disconnect_on_error: bool | None = True, push_request: bool | None = False) -> Any:
        return super().read_response(disable_decoding, timeout=timeout, disconnect_on_error=disconnect_on_error,
                                     push_request=push_request)


def target_of(url: str | RedisUrl, source: str | None = None) -> RedisUrl:
    """``url`` validated, with ``LOOPSQ_REDIS_SSL_CERT_REQS`` applied to a TLS URL that does not set its own.

    Raises:
        RedisUrlError: a malformed URL (exit code 2), quoted with its passwords masked.
    """
    target = url if isinstance(url, RedisUrl) else parse_redis_url(url, source)
    return apply_cert_reqs_default(target, os.environ.get(CERT_REQS_ENV))


def client_for(url: str | RedisUrl, *, decode_responses: bool = True, timeout: float = 5.0) -> redis.Redis:
    """A client (not yet connected) for ``url``: its options win over ``timeout``."""
    target = target_of(url)
    kwargs: dict[str, Any] = {
        "decode_responses": decode_responses,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "health_check_interval": 30,
        "db": target.db,
        "username": target.username,
        "password": target.password,
    }
    kwargs.update({name: target.options[name] for name in _PASSTHROUGH if name in target.options})
    if target.is_sentinel:
        assert target.service_name is not None
        sentinel_kwargs = {
            "socket_timeout": kwargs["socket_timeout"],
            "socket_connect_timeout": kwargs["socket_connect_timeout"],
            "username": target.options.get("sentinel_username"),
            "password": target.options.get("sentinel_password"),
            "decode_responses": True,
        }
        sentinel = Sentinel(list(target.hosts), min_other_sentinels=target.options.get("min_other_sentinels", 0),
                            sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call, unused-ignore]
        client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
            target.service_name, redis_class=redis.Redis, connection_class=SentinelConnection, **kwargs)
        return client
    # A pool of our own, as ``Redis.from_url`` builds it: redis-py's ``Redis(host=…)`` would add its default
    # retry policy (10 retries with backoff), which turns an outage into commands that block for a minute.
    pool: redis.ConnectionPool
    if target.socket_path is not None:
        pool = redis.ConnectionPool(connection_class=redis.UnixDomainSocketConnection, path=target.socket_path,
                                    **kwargs)
    else:
        host, port = target.hosts[0]
        connection_class = redis.SSLConnection if target.is_tls else redis.Connection
        pool = redis.ConnectionPool(connection_class=connection_class, host=host, port=port, **kwargs)
    return redis.Redis(connection_pool=pool)


def connect(url: str | RedisUrl, *, timeout: float = 5.0, check: bool = True) -> redis.Redis:
    """Open a client for ``url`` (``decode_responses`` on) and, with ``check``, ping it once.

    Raises:
        RedisUrlError: when the URL is malformed (nothing is connected).
        RedisUnavailableError: when the server does not answer; the message carries the masked URL and the reason.
    """
    target = target_of(url)
    client = client_for(target, timeout=timeout)
    if check:
        ping(client, target.url)
    return client


def sibling(client: redis.Redis, *, decode_responses: bool) -> redis.Redis:
    """A client with a pool of its own on the same server as ``client`` (through the same sentinels for a
    Sentinel client), with ``decode_responses`` as given: RQ wants bytes, loopsq text, and a thread its own pool."""
    pool = client.connection_pool
    # ``connection_pool`` is the Sentinel pool's back-reference, which a new pool sets for itself.
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    kwargs["decode_responses"] = decode_responses
    new_pool: redis.ConnectionPool
    if isinstance(pool, SentinelConnectionPool):
        new_pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            pool.service_name, pool.sentinel_manager, connection_class=pool.connection_class,
            is_master=pool.is_master, check_connection=pool.check_connection, **kwargs)
    else:
        new_pool = pool.__class__(connection_class=pool.connection_class, **kwargs)
    return redis.Redis(connection_pool=new_pool)


def ping(client: redis.Redis, url: str) -> None:
    """Ping ``client``; wrap any failure in RedisUnavailableError naming the masked URL."""
    try:
        client.ping()
    except redis.RedisError as exc:
        raise unavailable(url, exc) from exc


_SELF_SIGNED_HINT = (f"; for a self-signed certificate set {CERT_REQS_ENV}=none or add ssl_cert_reqs=none to the URL "
                     "(or ssl_ca_certs=<CA file> to verify it)")


def unavailable(url: str, exc: BaseException) -> RedisUnavailableError:
    """The error for a Redis failure at ``url``, with the password masked in the URL and in the reason."""
    reason = mask_in(str(exc), url) or type(exc).__name__
    if "CERTIFICATE_VERIFY_FAILED" in reason:
        reason += _SELF_SIGNED_HINT
    return RedisUnavailableError(f"cannot reach Redis at {mask_url(url)}: {reason}")


def server_version(client: redis.Redis) -> str:
    """The server's ``redis_version`` from INFO."""
    info: dict[str, Any] = client.info("server")
    return str(info.get("redis_version", "unknown"))
