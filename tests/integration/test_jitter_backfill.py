"""Jitter and backfill with real workers and schedulers: jittered slots are the ones recorded; a backfill runs a
past range's slots as normal runs with their slot times, once each unless --force."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from loopsq.domain.jitter import offset_ms
from loopsq.domain.timeutil import from_iso, now, to_iso
from tests.integration.processes import Cluster, open_cluster, slots_ms
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


@pytest.mark.timeout(60)
def test_jittered_slots_carry_the_loops_offset_and_are_the_slots_recorded(cluster: Cluster) -> None:
    loop_id = cluster.create("jit", cluster.ledger_cmd(), "--every", "2s", "--jitter", "1500ms")
    loop = cluster.loop("jit")
    offset = offset_ms(loop_id, 1500)
    assert loop["jitterMs"] == 1500 and loop["schedule"].get("offsetMs") == (offset or None)
    assert slots_ms([loop["nextRunAt"]])[0] - slots_ms([loop["createdAt"]])[0] == 2000 + offset
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: len(cluster.ledger("jit")) >= 3, 20, "three runs")
    ran = [line[0] for line in cluster.ledger("jit")]
    first = slots_ms([loop["nextRunAt"]])[0]
    assert all((ms - first) % 2000 == 0 for ms in slots_ms(ran)), ran
    assert ran == [r.scheduled_for for r in cluster.runs("jit")][:len(ran)]
    shown = json.loads(cluster.cli("show", "jit").stdout)
    assert shown["jitterMs"] == 1500


@pytest.mark.timeout(90)
def test_backfill_runs_each_past_slot_once_with_its_slot_time_and_force_runs_it_again(cluster: Cluster) -> None:
    cluster.create("hourly", cluster.ledger_cmd(), "--every", "1h")
    loop = cluster.loop("hourly")
    cluster.start_all(workers=1)
    start, end = to_iso(now() - timedelta(hours=5)), to_iso(now())
    out = cluster.cli("backfill", "hourly", "--from", start, "--to", end).stdout
    anchor = from_iso(loop["nextRunAt"])
    expected = [to_iso(anchor - timedelta(hours=h)) for h in (5, 4, 3, 2, 1)]
    assert [line[0] for line in cluster.ledger("hourly")] == expected
    assert out.splitlines()[-1] == "backfill hourly: 5 slots: 5 ran succeeded"
    runs = cluster.runs("hourly")
    assert [(r.scheduled_for, r.source, r.status, r.attempt) for r in runs] == [
        (slot, "backfill", "succeeded", 1) for slot in expected]
    assert cluster.loop("hourly")["nextRunAt"] == loop["nextRunAt"]  # a backfill never moves the loop
    # Idempotent per slot: nothing runs again.
    again = cluster.cli("backfill", "hourly", "--from", start, "--to", end).stdout
    assert again.splitlines()[0] == f"{expected[0]}  already ran (not run again; --force runs it)  {runs[0].id}"
    assert again.splitlines()[-1] == "backfill hourly: 5 slots: 5 done"
    assert len(cluster.ledger("hourly")) == 5
    # --force runs the slots again, as the rows' next attempts.
    forced = json.loads(cluster.cli("backfill", "hourly", "--from", expected[3], "--to", expected[4], "--force",
                                    "--json").stdout)
    assert [(s["slot"], s["outcome"], s["status"]) for s in forced["slots"]] == [
        (expected[3], "ran", "succeeded"), (expected[4], "ran", "succeeded")]
    assert [r.attempt for r in cluster.runs("hourly")] == [1, 1, 1, 2, 2]
    assert len(cluster.ledger("hourly")) == 7


@pytest.mark.timeout(90)
def test_backfill_with_overlap_allow_runs_up_to_max_parallel_slots_at_once(cluster: Cluster) -> None:
    ledger = cluster.ledger_dir / "ledger-par"
    cmd = f'echo "start $(date +%s.%N)" >> {ledger}; sleep 1.5; echo "end $(date +%s.%N)" >> {ledger}'
    cluster.create("par", cmd, "--every", "1h")
    cluster.start_all(workers=3)
    start, end = to_iso(now() - timedelta(hours=3)), to_iso(now())
    cluster.cli("backfill", "par", "--from", start, "--to", end, "--overlap", "allow", "--max-parallel", "3")
    events = sorted((float(at), kind) for kind, at in cluster.ledger("par"))
    depth = peak = 0
    for _, kind in events:
        depth += 1 if kind == "start" else -1
        peak = max(peak, depth)
    assert peak >= 2, events
    assert len(events) == 6
