"""Shared fixtures: fakeredis for the unit tier, a private real redis-server for the integration tier.

``client`` runs a test on both backends (fakeredis with Lua, and the real server), as the Lua scripts must be
proven on Redis's own Lua, not only on fakeredis's.
"""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest
import redis

from tests.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A redis-server started for this test session on a free port (never the shared one on 6379)."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def real_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the session's private server, flushed before each test (it is ours to flush)."""
    client = redis_server.client()
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def fake_redis() -> Iterator[redis.Redis]:
    """A fresh fakeredis client (decode_responses on), with Lua."""
    client = fakeredis.FakeRedis(decode_responses=True)
    yield client
    client.close()


@pytest.fixture(params=["fakeredis", pytest.param("redis", marks=pytest.mark.integration)])
def client(request: pytest.FixtureRequest) -> redis.Redis:
    """The same test on fakeredis and on the real server."""
    name = "fake_redis" if request.param == "fakeredis" else "real_redis"
    return request.getfixturevalue(name)  # type: ignore[no-any-return]
