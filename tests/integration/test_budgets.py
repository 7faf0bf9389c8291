"""Budgets with real workers: an agent run's usage is parsed from its provider CLI's JSON output and recorded on
the run; a loop that reaches its run or cost budget is paused with the reason and the figures; `runs` and `show`
display usage and totals."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer
from tests.unit.test_executor_agents import install_fake

pytestmark = pytest.mark.integration

CLAUDE_OUT = json.dumps({"type": "result", "total_cost_usd": 0.4,
                         "usage": {"input_tokens": 100, "cache_read_input_tokens": 20, "output_tokens": 30}})


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


@pytest.mark.timeout(60)
def test_an_agent_loop_records_usage_per_run_and_pauses_at_its_cost_budget(cluster: Cluster) -> None:
    bin_dir = cluster.tmp / "bin"
    install_fake(bin_dir, "claude", "fake_provider.py")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_STDOUT": CLAUDE_OUT, "FAKE_SKIP_STDIN": "1"}
    cluster.cli("create", "agent", "spender", "--provider", "claude", "--prompt", "fix the build", "--every", "1s",
                "--budget-cost", "$1/day")
    cluster.start("scheduler")
    cluster.start("worker", env=env)
    cluster.wait_until(lambda: cluster.loop("spender")["status"] == "paused", 30, "the budget to pause the loop")
    loop = cluster.loop("spender")
    assert loop["statusReason"] == "budget reached: $1.20 spent this day (limit $1.00/day)"
    assert loop["usage"]["day"]["runs"] == 3 and loop["usage"]["day"]["inputTokens"] == 360
    runs = cluster.ran("spender")
    assert [(r.status, r.input_tokens, r.output_tokens, r.cost_usd) for r in runs] == [
        ("succeeded", 120, 30, 0.4)] * 3
    human = cluster.cli("runs", "spender").stdout
    assert human.count("  usage: in=120 out=30 cost=$0.4000") == 3
    assert human.splitlines()[-1] == "total: 3 runs with usage, in=360 out=90 cost=$1.2000"
    shown = json.loads(cluster.cli("show", "spender").stdout)
    assert shown["usage"]["day"]["costUsd"] == pytest.approx(1.2)
    assert shown["lastRun"]["costUsd"] == 0.4
    # The pause is the run's own transition: one change entry noting paused_by_budget.
    assert sum("paused_by_budget" in c["data"].get("also", []) for c in cluster.changes()) == 1


@pytest.mark.timeout(60)
def test_a_runs_budget_pauses_the_loop_after_n_runs_in_the_window(cluster: Cluster) -> None:
    cluster.create("capped", cluster.ledger_cmd(), "--every", "1s", "--budget-runs", "2/day")
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: cluster.loop("capped")["status"] == "paused", 20, "the budget to pause the loop")
    assert cluster.loop("capped")["statusReason"] == "budget reached: 2 runs this day (limit 2/day)"
    assert len(cluster.ledger("capped")) == 2
    assert [r.status for r in cluster.ran("capped")] == ["succeeded", "succeeded"]
