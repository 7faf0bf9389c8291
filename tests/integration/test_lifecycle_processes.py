"""Failure streaks, expiry and ``tick`` with real processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from loopsq.domain import timeutil
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


@pytest.mark.timeout(60)
def test_a_failure_streak_pauses_the_loop_and_show_says_why(cluster: Cluster) -> None:
    cluster.start_all(schedulers=1, workers=1)
    cluster.create("flaky", "exit 3", "--every", "1s", "--pause-after-failures", "2")
    cluster.wait_until(lambda: cluster.loop("flaky")["status"] == "paused", 20, "the streak to pause the loop")
    shown = json.loads(cluster.cli("--json", "show", "flaky").stdout)
    assert shown["status"] == "paused"
    assert shown["statusReason"] == (
        "circuit breaker open: paused after 2 consecutive unsuccessful runs (last: failed: process exited with "
        f"code 3); fix the cause, then resume it (loopsq resume {shown['id']})"
    )
    assert [r.status for r in cluster.runs("flaky")] == ["failed", "failed"]
    notes = [c["data"].get("also", []) for c in cluster.changes() if c["type"] == "run_failed"]
    assert notes[-1] == ["paused_by_streak"]
    resumed = json.loads(cluster.cli("--json", "resume", "flaky").stdout)
    assert resumed["status"] == "active" and "statusReason" not in resumed and resumed["failureStreak"] == 0


@pytest.mark.timeout(60)
def test_a_loop_past_its_expiry_is_expired_and_runs_no_more(cluster: Cluster) -> None:
    from loopsq.sdk import LoopsClient

    # The processes first, then the loop, its expiry computed right before it is stored (in this process, not a
    # CLI one): the 8 s it may run are not eaten by the processes' start on a loaded machine.
    cluster.start_all(schedulers=1, workers=1)
    client = LoopsClient(cluster.url)
    try:
        expires = timeutil.to_iso(timeutil.now() + timedelta(seconds=8))
        client.create({"name": "brief", "schedule": {"type": "interval", "everyMs": 1000}, "expiresAt": expires,
                       "target": {"type": "command", "command": cluster.ledger_cmd(), "shell": True}})
    finally:
        client.close()
    cluster.wait_until(lambda: cluster.loop("brief")["status"] == "expired", 20, "the loop to expire")
    assert "nextRunAt" not in cluster.loop("brief")
    assert cluster.timer_at("brief") is None
    slots = [line[0] for line in cluster.ledger("brief")]
    assert slots and all(slot < expires for slot in slots)


def test_tick_runs_every_due_loop_here_and_counts_like_the_reference(cluster: Cluster) -> None:
    past = timeutil.to_iso(timeutil.now() - timedelta(seconds=5))
    cluster.create("due", cluster.ledger_cmd(), "--at", past)
    cluster.create("later", cluster.ledger_cmd(), "--every", "1h")
    out = cluster.cli("tick").stdout
    assert out == "completed=1 skipped=0 recovered=0\n"
    assert len(cluster.ledger("due")) == 1 and cluster.ledger("later") == []
    assert cluster.loop("due")["status"] == "stopped"
    assert cluster.cli("tick").stdout == "completed=0 skipped=0 recovered=0\n"
