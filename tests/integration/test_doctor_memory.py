"""``doctor`` and ``status`` show Redis memory: an eviction policy other than ``noeviction`` fails, 80% of
``maxmemory`` warns, a mirror group idle past ``LOOPSQ_MIRROR_IDLE`` is named. On a Redis of its own (the test
changes its configuration)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.state.keys import Keys
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()


@pytest.fixture
def own_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    server = RedisServer().start()
    monkeypatch.setenv("LOOPSQ_REDIS_URL", server.url)
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("LOOPSQ_MIRROR_IDLE", raising=False)
    client = server.client()
    try:
        yield client
    finally:
        client.close()
        server.cleanup()


def doctor() -> tuple[int, dict[str, dict[str, str]]]:
    result = CliRunner().invoke(cli, ["--json", "doctor"])
    return result.exit_code, {c["id"]: c for c in json.loads(result.stdout)["checks"]}


def test_noeviction_under_the_limit_is_ok_and_shows_memory_per_loop_and_per_run(own_redis: redis.Redis) -> None:
    assert CliRunner().invoke(cli, ["create", "command", "a", "--every", "1h", "--cmd", "true"]).exit_code == 0
    code, checks = doctor()
    assert checks["redis-eviction"] == {"id": "redis-eviction", "status": "ok",
                                        "message": "maxmemory-policy is noeviction"}
    memory = checks["redis-memory"]
    assert memory["status"] == "ok"
    assert re.fullmatch(r"redis memory: [\d.]+ (KB|MB) \(no maxmemory\), policy noeviction; "
                        r"namespace loopsq: [\d.]+ (B|KB|MB) in \d+ keys; "
                        r"[\d.]+ (B|KB|MB) per loop "
                        r"\(1\), - per run in the window \(0\)", memory["message"]), memory["message"]
    status = CliRunner().invoke(cli, ["status"]).stdout
    assert re.search(r"^redis memory: .+ \(no maxmemory\), policy noeviction; .+ per loop \(1\)", status, re.M), status
    report = json.loads(CliRunner().invoke(cli, ["--json", "status"]).stdout)["redisMemory"]
    assert (report["maxMemory"], report["policy"], report["loops"], report["runs"]) == (0, "noeviction", 1, 0)
    assert code == 0


def test_an_lru_policy_fails_doctor_with_the_reason(own_redis: redis.Redis) -> None:
    own_redis.config_set("maxmemory-policy", "allkeys-lru")
    code, checks = doctor()
    assert code == 1
    assert checks["redis-eviction"] == {
        "id": "redis-eviction", "status": "fail",
        "message": "maxmemory-policy is allkeys-lru, not noeviction: an LRU policy silently evicts leases and claims, "
                   "which breaks exactly-once",
        "detail": "set maxmemory-policy noeviction"}
    human = CliRunner().invoke(cli, ["doctor"]).stdout
    assert "fail redis-eviction         maxmemory-policy is allkeys-lru, not noeviction" in human


def test_memory_at_80_percent_of_maxmemory_warns(own_redis: redis.Redis) -> None:
    used = int(own_redis.info("memory")["used_memory"])
    own_redis.config_set("maxmemory", str(int(used / 0.85)))
    code, checks = doctor()
    assert code == 0
    memory = checks["redis-memory"]
    assert memory["status"] == "warn"
    assert memory["message"].startswith("redis memory is above 80% of maxmemory: ")
    assert memory["detail"] == "lower --keep-runs or LOOPSQ_KEEP_RUNS, or raise maxmemory"
    own_redis.config_set("maxmemory", str(used * 4))
    assert doctor()[1]["redis-memory"]["status"] == "ok"


def test_a_mirror_group_idle_past_the_limit_is_named(own_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    own_redis.xadd(KEYS.changes, {"type": "t", "at": "", "data": "{}"})
    for group in ("mirror:live", "mirror:gone"):
        own_redis.xgroup_create(KEYS.changes, group, id="0-0")
    own_redis.xreadgroup("mirror:gone", "host-a", {KEYS.changes: ">"})
    monkeypatch.setenv("LOOPSQ_MIRROR_IDLE", "1s")
    time.sleep(1.2)
    own_redis.xreadgroup("mirror:live", "host-b", {KEYS.changes: ">"})
    _code, checks = doctor()
    gone = checks["mirror-group:mirror:gone"]
    assert gone["status"] == "warn"
    assert re.fullmatch(r"mirror group mirror:gone idle for \ds \(over LOOPSQ_MIRROR_IDLE=1s\): it no longer holds "
                        r"the change stream back", gone["message"]), gone["message"]
    assert gone["detail"] == "if its mirror is gone: XGROUP DESTROY loopsq:changes mirror:gone"
    assert checks["mirror-groups"] == {"id": "mirror-groups", "status": "ok",
                                       "message": "1 mirror group(s) following the change stream",
                                       "detail": "mirror:live"}
    assert "mirror-group:mirror:live" not in checks
