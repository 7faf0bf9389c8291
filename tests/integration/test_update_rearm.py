"""``loopsq update`` against a real scheduler and worker (issue 31, point 2): a new schedule re-arms the loop's
timer from now (1 h -> 1 s runs within seconds, one run per 1 s slot from the update on, no catch-up burst;
1 s -> 1 h runs nothing more), and a run already going finishes under the definition it started with."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.timeutil import from_iso
from tests.integration.processes import Cluster, gaps, open_cluster
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: How long the first run under the new 1 s schedule may take to show up on a loaded machine (its slot is 1 s
#: after the update; without the re-arm it would wait for the old timer, an hour away, or for maintenance).
FIRST_RUN_S = 10


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def test_an_hourly_loop_changed_to_every_second_runs_from_now_without_a_burst(cluster: Cluster) -> None:
    cluster.create("fast", "true", "--every", "1h")
    cluster.start_all(schedulers=1, workers=1)
    before = cluster.loop("fast")
    assert cluster.timer_at("fast") == pytest.approx(from_iso(before["nextRunAt"]).timestamp())
    cluster.cli("update", "fast", "--every", "1s")
    updated = cluster.loop("fast")
    update_at = from_iso(updated["updatedAt"])
    first_slot = from_iso(updated["nextRunAt"])
    assert (first_slot - update_at).total_seconds() == 1.0  # one new interval after the update
    assert cluster.timer_at("fast") == pytest.approx(first_slot.timestamp())  # re-armed at once
    started = time.monotonic()
    cluster.wait_until(lambda: cluster.ran("fast"), FIRST_RUN_S, "the first run under the new schedule")
    assert time.monotonic() - started < FIRST_RUN_S
    runs = cluster.wait_until(lambda: len(r := cluster.ran("fast")) >= 4 and r, 60, "four runs")
    slots = [run.scheduled_for for run in runs]
    assert slots[0] == updated["nextRunAt"]  # nothing before the new schedule's first slot
    assert len(set(slots)) == len(slots)  # no slot twice
    assert gaps(slots, 1000) == []  # one run per 1 s slot: no burst, no catch-up of the old schedule
    assert [r for r in cluster.runs("fast") if r.status == "missed"] == []
    assert cluster.loop("fast")["id"] == before["id"]


def test_a_loop_every_second_changed_to_hourly_runs_nothing_more(cluster: Cluster) -> None:
    cluster.create("slow", "true", "--every", "1s")
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: len(cluster.ran("slow")) >= 2, 60, "two runs every second")
    cluster.cli("update", "slow", "--every", "1h")
    updated = cluster.loop("slow")
    assert (from_iso(updated["nextRunAt"]) - from_iso(updated["updatedAt"])).total_seconds() == 3600
    assert cluster.timer_at("slow") == pytest.approx(from_iso(updated["nextRunAt"]).timestamp())
    # A run claimed just before the update may still finish; nothing is scheduled after it.
    cluster.wait_until(lambda: all(r.status != "running" for r in cluster.runs("slow")), 30, "runs to settle")
    time.sleep(3)  # an absence: three of the old 1 s slots pass
    late = [r for r in cluster.runs("slow") if r.scheduled_for > updated["updatedAt"]]
    assert late == []
    assert cluster.timer_at("slow") == pytest.approx(from_iso(updated["nextRunAt"]).timestamp())


def test_a_running_run_finishes_under_the_definition_it_started_with(cluster: Cluster) -> None:
    cluster.create("edit", "echo old; sleep 2; echo old-done", "--every", "1h")
    cluster.start_all(workers=1)
    run_id = cluster.cli("trigger", "edit").stdout.split()[0]
    cluster.wait_until(lambda: (r := cluster.run(run_id)) and r.status == "running" and r, 30, "the run to start")
    cluster.cli("update", "edit", "--cmd", "echo new")
    assert cluster.loop("edit")["target"]["command"] == "echo new"
    done = cluster.wait_until(lambda: (r := cluster.run(run_id)) and r.status != "running" and r, 30, "the run")
    assert (done.status, done.stdout) == ("succeeded", "old\nold-done\n")
    second = cluster.cli("trigger", "edit").stdout.split()[0]
    after = cluster.wait_until(lambda: (r := cluster.run(second)) and r.status != "running" and r, 30, "run 2")
    assert (after.status, after.stdout) == ("succeeded", "new\n")
