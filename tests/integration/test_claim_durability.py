"""Claims and finalizes that WAIT for a replica (``loopsq.state.durability``), on a real server: the replica count
comes from the connection and ``LOOPSQ_CLAIM_REPLICAS``; without an acknowledging replica on a master nobody
replaced, a claim still runs after the confirmation budget (availability), and a finalize is recorded once."""

from __future__ import annotations

import logging
import weakref
from datetime import UTC, datetime, timedelta

import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.errors import ValidationError
from loopsq.state import durability
from loopsq.state.commit import Committer, Tx
from loopsq.state.connection import client_for
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, RunStore
from tests.redis_server import RedisServer, wait_until

pytestmark = pytest.mark.integration

KEYS = Keys()
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_the_replicas_to_wait_for_come_from_the_connection_and_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(durability.REPLICAS_ENV, raising=False)
    assert durability.claim_replicas(client_for("redis://127.0.0.1:1/0")) == 0
    assert durability.claim_replicas(client_for("redis+sentinel://127.0.0.1:1/m")) == 1
    monkeypatch.setenv(durability.REPLICAS_ENV, "2")
    assert durability.claim_replicas(client_for("redis://127.0.0.1:1/0")) == 2
    monkeypatch.setenv(durability.REPLICAS_ENV, "0")
    assert durability.claim_replicas(client_for("redis+sentinel://127.0.0.1:1/m")) == 0
    monkeypatch.setenv(durability.REPLICAS_ENV, "some")
    with pytest.raises(ValidationError) as info:
        durability.claim_replicas(client_for("redis://127.0.0.1:1/0"))
    assert info.value.message == "LOOPSQ_CLAIM_REPLICAS must be a whole number >= 0, got 'some'"


def test_a_commit_reports_the_replicas_that_acknowledged_it_and_the_server(redis_server: RedisServer,
                                                                          real_redis: redis.Redis) -> None:
    replica = RedisServer(replica_of=redis_server.port).start()
    try:
        wait_until(lambda: replica.client().info("replication")["master_link_status"] == "up", "the replica")
        committer = Committer(real_redis, KEYS)
        result = committer.commit(Tx("probe", "now").set("loopsq:test:x", "1"), replicas=1, wait_ms=2000)
        assert (result.ok, result.replicated, result.server) == (True, 1, ("127.0.0.1", redis_server.port))
        assert replica.client().get("loopsq:test:x") == "1"
        real_redis.script_flush()  # as on a new master: the script is loaded again, once
        again = committer.commit(Tx("probe", "now").set("loopsq:test:y", "1"), replicas=1, wait_ms=2000)
        assert (again.ok, again.replicated) == (True, 1)
    finally:
        replica.cleanup()


def test_without_a_replica_a_claim_waits_for_none_runs_after_the_episodes_hold_and_its_finalize_is_recorded_once(
        real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(durability, "CONFIRM_S", 0.3)
    monkeypatch.setattr(durability, "_watches", weakref.WeakKeyDictionary())  # no state from an earlier test
    loops = LoopStore(real_redis, KEYS)
    runs = RunStore(real_redis, KEYS)
    runs.claim_replicas = 1  # no replica is attached
    loop = loops.create(new_loop({"name": "lonely", "schedule": {"type": "interval", "everyMs": 3_600_000},
                                  "target": {"type": "command", "command": "true"}}, NOW - timedelta(hours=1)))
    real_redis.config_resetstat()
    with caplog.at_level(logging.WARNING, logger="loopsq.state.durability"):
        claim = runs.claim(loop.id, NOW, Owner("w1", "h", 1), NOW)
        assert isinstance(claim, Claim)
        finished = runs.finalize(claim.run.id, claim.token, NOW + timedelta(seconds=1), status="succeeded",
                                 exit_code=0, duration_ms=5, stdout="", stderr="", error=None, pid=None)
    assert finished is not None
    assert "cmdstat_wait" not in real_redis.info("commandstats")  # 0 attached: no WAIT at all
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["claims are not replicated: the master reports 0 of 1 wanted replica(s) attached; runs go on "
                        "unreplicated 0s from now unless the sentinels name another master (a failover can then "
                        "lose their claims, and a slot may run twice)"], messages
    assert runs.get(claim.run.id).status == "succeeded"  # type: ignore[union-attr]
    changes = [f["type"] for _, f in real_redis.xrange(KEYS.changes)]
    assert changes.count("run_succeeded") == 1, changes
