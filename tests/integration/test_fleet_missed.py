"""Slots that found no capacity are recorded, not dropped (real processes): a loop starved of free workers gets
one ``missed`` row for the streak, with its count and why; so does a loop whose scheduler was away."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.timeutil import from_iso
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def accounted(cluster: Cluster, name: str) -> int:
    """Slots of ``name`` with a record: its runs and skips, one each, plus each missed row's count."""
    return sum(r.missed_count or 1 if r.status == "missed" else 1 for r in cluster.runs(name))


@pytest.mark.timeout(120)
def test_a_loop_starved_of_free_workers_records_its_missed_slots_once_as_a_streak_with_its_count(
    cluster: Cluster
) -> None:
    cluster.create("hog", "sleep 6", "--every", "1h")
    cluster.start("worker", env={"LOOPSQ_WORKER_CONCURRENCY": "1"})
    from loopsq.sdk import LoopsClient

    client = LoopsClient(cluster.url)
    try:
        client.trigger("hog")
    finally:
        client.close()
    cluster.wait_until(lambda: any(r.status == "running" and r.pid for r in cluster.runs("hog")), 20, "the hog")
    created = time.time()
    cluster.create("tick", cluster.ledger_cmd(), "--every", "1s")
    cluster.start("scheduler")
    row = cluster.wait_until(lambda: next((r for r in cluster.runs("tick") if r.status == "missed"), None), 30,
                             "the missed streak")
    assert row.missed_kind == "no_free_worker"
    assert row.error is not None and row.error.startswith("no free worker for ")
    assert row.missed_count is not None and row.missed_count >= 3
    assert row.missed_last is not None and from_iso(row.missed_last) > from_iso(row.scheduled_for)
    # Once the hog is done the loop runs again; every slot since its creation has exactly one record.
    cluster.wait_until(lambda: len(cluster.ledger("tick")) >= 3, 30, "tick to run again")
    missed_rows = [r for r in cluster.runs("tick") if r.status == "missed"]
    assert len(missed_rows) == 1  # one row for the streak, not one per slot
    slots = [from_iso(r.scheduled_for).timestamp() for r in cluster.runs("tick") if r.status != "missed"]
    latest = max([*slots, from_iso(str(row.missed_last)).timestamp()])
    assert accounted(cluster, "tick") == round(latest - from_iso(cluster.runs("tick")[0].scheduled_for).timestamp()) + 1
    assert latest > created
    final = cluster.run(row.id)
    assert final is not None and final.missed_count is not None
    assert int(cluster.client.hget("loopsq:missed:counts", "no_free_worker") or 0) == final.missed_count
    assert f"missed \u00d7{final.missed_count}" in cluster.cli("runs", "tick").stdout


@pytest.mark.timeout(120)
def test_slots_that_fell_due_while_no_scheduler_ran_are_recorded_missed_with_that_reason(cluster: Cluster) -> None:
    cluster.start("worker")
    scheduler = cluster.start("scheduler")
    cluster.create("tick", cluster.ledger_cmd(), "--every", "1s")
    cluster.wait_until(lambda: len(cluster.ledger("tick")) >= 2, 20, "tick to run")
    scheduler.terminate()
    time.sleep(5)  # (what the test stages: five seconds without a scheduler)
    cluster.start("scheduler")
    row = cluster.wait_until(lambda: next((r for r in cluster.runs("tick") if r.status == "missed"), None), 30,
                             "the missed streak")
    assert (row.missed_kind, row.error) == ("no_scheduler", "no scheduler ran")
    assert row.missed_count is not None and row.missed_count >= 3
