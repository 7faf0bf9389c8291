"""``loopsq scheduler --no-migrate`` (issue #28.2): a scheduler told not to migrate refuses an older state with
its one line and exit 2, and changes nothing; without the flag the same start migrates it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from loopsq.state.keys import Keys
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

KEYS = Keys()
V1_SLOT = "loopsq:slot:l1:2026-01-01T00:00:00.000Z"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    # (its own server: a v1 state would make any other test's process on a shared one exit, rightly)
    started = RedisServer().start()
    try:
        yield started
    finally:
        started.cleanup()


def scheduler(server: RedisServer, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    assert server.port, "a URL with no port would reach the shared Redis"
    env = {"LOOPSQ_REDIS_URL": server.url, "LOOPSQ_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-m", "loopsq", "scheduler", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def v1_state(client: redis.Redis) -> dict[str, object]:
    client.set(KEYS.loop("l1"), '{"id": "l1", "status": "paused"}')
    client.sadd(KEYS.loops, "l1")
    client.set(V1_SLOT, "r1")
    return {key: client.type(key) for key in client.keys("*")}


@pytest.mark.timeout(90)
def test_a_scheduler_with_no_migrate_refuses_an_older_state_with_one_line_and_changes_nothing(
    server: RedisServer, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    before = v1_state(client)
    refused = scheduler(server, tmp_path, "--no-migrate")
    out, _ = refused.communicate(timeout=60)
    assert (refused.returncode, out) == (2, "error: this Redis holds loopsq state v1; this loopsq reads v2: run "
                                            "`loopsq migrate` (a scheduler does at its start)\n")
    assert {key: client.type(key) for key in client.keys("*")} == before
    # The same start without the flag migrates first, then runs.
    migrating = scheduler(server, tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (client.hget(KEYS.meta, "layout") == "2" and not client.exists(V1_SLOT)):
            assert migrating.poll() is None, migrating.communicate()[0]
            assert time.monotonic() < deadline, "the scheduler did not migrate the v1 state within 60s"
            time.sleep(0.1)
        assert client.hgetall(KEYS.slots("l1")) == {"2026-01-01T00:00:00.000Z": "r1"}
    finally:
        migrating.terminate()
        migrating.wait(timeout=30)
