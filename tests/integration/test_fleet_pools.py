"""Fleet-wide pools on real processes: a pool of 2 under 5 loops on two workers never has 3 runs going, every loop
gets its turn, and a run waiting for its pool holds no worker slot (other loops go on)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.state.keys import Keys
from loopsq.state.pools import PoolStore
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.timeout(150)
def test_a_pool_of_two_under_five_loops_never_holds_three_and_waiting_runs_hold_no_worker_slot(
    cluster: Cluster
) -> None:
    cluster.cli("pool", "set", "acct", "--limit", "2")
    spans = cluster.tmp / "spans"
    for i in range(5):
        cluster.create(f"agent{i}", f'echo "start $(date +%s.%N)" >> {spans}; sleep 1.5; '
                                    f'echo "end $(date +%s.%N)" >> {spans}', "--every", "1s", "--pool", "acct")
    cluster.create("free", cluster.ledger_cmd(), "--every", "1s")
    # Two workers of 3 slots: 5 pooled loops would fill all 6 slots if waiting held one, and starve "free".
    env = {"LOOPSQ_WORKER_CONCURRENCY": "3"}
    cluster.start("worker", env=env)
    cluster.start("worker", env=env)
    cluster.start("scheduler")
    pools = PoolStore(cluster.client, Keys())
    most_held = 0
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        state = pools.state("acct")
        assert state is not None
        most_held = max(most_held, len(state.holders))
        if all(len([r for r in cluster.runs(f"agent{i}") if r.status == "succeeded"]) >= 2 for i in range(5)):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"every pooled loop did not get two turns within 40s\n{cluster.logs()}")
    assert most_held == 2  # sampled: the pool was used to its limit, never past it
    lines = [line.split() for line in spans.read_text().splitlines()]
    starts = sorted(float(t) for kind, t in lines if kind == "start")
    ends = sorted(float(t) for kind, t in lines if kind == "end")
    assert overlap(list(zip(starts, ends, strict=False))) <= 2
    # Meanwhile the loop outside the pool ran every second: waiting runs held no worker slot.
    cluster.wait_until(lambda: len(cluster.ledger("free")) >= 10, 30, "ten runs of the loop outside the pool")
    assert not any(r.status == "skipped" for i in range(5) for r in cluster.runs(f"agent{i}")
                   if r.error and "pool" in r.error)


@pytest.mark.timeout(60)
def test_a_loop_whose_pool_was_removed_records_its_slots_skipped_and_never_runs_uncapped(cluster: Cluster) -> None:
    cluster.cli("pool", "set", "gone", "--limit", "1")
    cluster.create("capped", cluster.ledger_cmd(), "--every", "1s", "--pool", "gone")
    cluster.cli("pool", "rm", "gone")
    cluster.start("worker")
    cluster.start("scheduler")
    cluster.wait_until(lambda: any(r.status == "skipped" for r in cluster.runs("capped")), 20, "a skipped slot")
    skipped = next(r for r in cluster.runs("capped") if r.status == "skipped")
    assert skipped.error == "pool gone does not exist"
    assert cluster.ledger("capped") == []


@pytest.mark.timeout(90)
def test_workflow_steps_sharing_a_pool_of_one_never_run_at_once(cluster: Cluster) -> None:
    import json

    cluster.cli("pool", "set", "gpu-box", "--limit", "1")
    spans = cluster.tmp / "step-spans"
    step = (f'echo "start $(date +%s.%N)" >> {spans}; sleep 1; echo "end $(date +%s.%N)" >> {spans}'
            )
    path = cluster.tmp / "wf.json"
    path.write_text(json.dumps({"name": "trainers", "maxParallel": 3, "pool": "gpu-box", "steps": [
        {"id": f"train{i}", "target": {"type": "command", "command": step, "shell": True}} for i in range(3)]}))
    cluster.cli("workflows", "create", str(path))
    cluster.start("worker", env={"LOOPSQ_WORKER_CONCURRENCY": "2"})
    done = cluster.cli("workflows", "run", "trainers", "--wait", "60")
    assert "succeeded" in done.stdout, done.stdout
    lines = [line.split() for line in spans.read_text().splitlines()]
    starts = sorted(float(t) for kind, t in lines if kind == "start")
    ends = sorted(float(t) for kind, t in lines if kind == "end")
    assert len(starts) == 3 and overlap(list(zip(starts, ends, strict=True))) == 1  # one at a time, all three ran
    state = PoolStore(cluster.client, Keys()).state("gpu-box")
    assert state is not None and state.holders == [] and state.waiters == []
