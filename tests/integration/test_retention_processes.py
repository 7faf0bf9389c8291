"""History windows with real processes: a scheduler trims what falls out of a loop's window, the mirror process
keeps it (archived) and a rebuild keeps it too; a running run, a pending retry and an idempotency key's run are
never trimmed; a scheduler killed with kill -9 in the middle of trimming leaves every run whole or gone."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from loopsq.domain import timeutil
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import to_iso
from loopsq.sdk import LoopsClient
from loopsq.state import run_codec
from loopsq.state.keys import Keys
from loopsq.state.runs import Claim, Owner, RunStore
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()
OWNER = Owner("worker:seed", "seed-host", 1)


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def start_mirror(cluster: Cluster) -> Proc:
    proc = cluster.start("mirror", wait=False)
    cluster.wait_until(lambda: "following" in proc.text() or not proc.alive(), 20, "the mirror to follow")
    assert proc.alive(), proc.text()
    return proc


def mirror_rows(cluster: Cluster, loop_name: str) -> dict[str, dict[str, Any]]:
    """The mirror's loop runs of ``loop_name`` by id (read straight from the file the mirror process writes)."""
    path = cluster.tmp / "data" / "loops.db"
    if not path.exists():
        return {}
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute("SELECT * FROM loop_runs WHERE loop_name = ?", (loop_name,)).fetchall()
    except sqlite3.OperationalError:
        return {}
    finally:
        conn.close()
    return {r["id"]: dict(r) for r in rows}


def settled_in_redis(cluster: Cluster, name: str) -> list[LoopRun]:
    return [r for r in cluster.runs(name) if r.status != "running"]


def trimmed_ids(cluster: Cluster) -> list[str]:
    return [i for change in cluster.changes() if change["type"] == "runs_trimmed"
            for i in change["data"].get("trim", {}).get("loop_runs", [])]


@pytest.mark.timeout(120)
def test_runs_trimmed_from_redis_stay_in_the_mirror_and_a_rebuild_keeps_them(cluster: Cluster) -> None:
    start_mirror(cluster)
    cluster.start_all(schedulers=1, workers=1)
    loop_id = cluster.create("often", 'echo "$LOOPS_RUN_ID" >> ' + str(cluster.ledger_dir / "ledger"),
                             "--every", "1s", "--keep-runs", "3")
    cluster.wait_until(lambda: sum(1 for r in mirror_rows(cluster, "often").values() if r["archived_at"]) >= 8, 60,
                       "8 runs archived in the mirror")
    worker = next(p for p in cluster.procs if p.name.startswith("worker"))
    worker.terminate()
    # The scheduler's next passes bring Redis back to exactly the window.
    cluster.wait_until(lambda: len(settled_in_redis(cluster, "often")) == 3, 20, "Redis to hold exactly 3 runs")
    executed = (cluster.ledger_dir / "ledger").read_text().split()
    in_redis = {r.id for r in settled_in_redis(cluster, "often")}
    cluster.wait_until(lambda: set(executed) <= set(mirror_rows(cluster, "often")), 20, "the mirror to hold every run")
    rows = mirror_rows(cluster, "often")
    assert set(executed) <= set(rows)
    for run_id, row in rows.items():
        # Left Redis on purpose (the trim change said so), or still in the window; never both, never neither.
        assert (row["archived_at"] is None) == (run_id in in_redis), (run_id, row["archived_at"])
        assert row["status"] == "succeeded" or run_id in in_redis
    for run_id in set(rows) - in_redis:
        assert not cluster.client.exists(KEYS.run(run_id))
    # Lean: no claim key, live stream or RQ result outlives a settled run.
    assert cluster.client.keys(f"loopsq:claim:{loop_id}:*") == []
    assert cluster.client.keys("rq:results:*") == []
    assert not [k for k in cluster.client.keys("loopsq:live:*")]
    listed = json.loads(cluster.cli("--json", "runs", "often", "--limit", "1000").stdout)
    assert {r["id"] for r in listed} == set(rows)
    archived = sum(1 for r in rows.values() if r["archived_at"])
    rebuilt = cluster.cli("mirror", "--rebuild").stdout
    assert rebuilt.endswith(f"loops=1 workflows=0 kept {archived} archived run(s) that Redis no longer holds\n")
    again = json.loads(cluster.cli("--json", "runs", "often", "--limit", "1000").stdout)
    assert again == listed


@pytest.mark.timeout(120)
def test_a_running_run_a_pending_retry_and_an_idempotency_keys_run_are_never_trimmed(cluster: Cluster) -> None:
    start_mirror(cluster)
    cluster.start_all(schedulers=1, workers=2)
    busy_marker, retry_marker = cluster.tmp / "busy-started", cluster.tmp / "retry-failed"
    cluster.create("busy", f"if [ ! -e {busy_marker} ]; then touch {busy_marker}; sleep 25; fi", "--every", "1s",
                   "--overlap", "allow", "--keep-runs", "1")
    cluster.create("retry", f"if [ ! -e {retry_marker} ]; then touch {retry_marker}; exit 1; fi", "--every", "1s",
                   "--attempts", "2", "--retry-delay", "1h", "--keep-runs", "1")
    cluster.create("keyed", "true", "--every", "1s", "--keep-runs", "1")
    keyed = cluster.cli("trigger", "keyed", "--key", "order-42").stdout.split()[0]
    cluster.wait_until(lambda: (r := cluster.run(keyed)) is not None and r.status == "succeeded", 20, "the trigger")
    failed = cluster.wait_until(lambda: next((r for r in cluster.runs("retry") if r.status == "failed"), None), 20,
                                "the first slot of retry to fail")
    assert cluster.loop("retry")["retryScheduledFor"] == failed.scheduled_for
    # Two more settled runs of "retry" (ad hoc: its pending retry is not due for an hour) push the failed one out.
    for _ in range(2):
        assert cluster.cli("run-now", "retry", "--local").stdout.split()[1] == "succeeded"
    busy_first = cluster.wait_until(lambda: next((r for r in cluster.runs("busy") if r.status == "running"), None),
                                    20, "busy's first run to go on")
    cluster.wait_until(lambda: len(trimmed_ids(cluster)) >= 12, 60, "a dozen trims")
    time.sleep(2.5)  # two more passes

    def archived(name: str) -> set[str]:
        return {i for i, r in mirror_rows(cluster, name).items() if r["archived_at"]}

    cluster.wait_until(lambda: archived("busy") and archived("keyed") and archived("retry"), 20,
                       "each loop to have runs archived")
    running = cluster.run(busy_first.id)
    assert running is not None and running.status == "running"
    assert busy_first.id not in trimmed_ids(cluster)
    retry_row = cluster.run(failed.id)
    assert retry_row is not None and retry_row.status == "failed"
    assert failed.id not in trimmed_ids(cluster)
    keyed_row = cluster.run(keyed)
    assert keyed_row is not None and keyed_row.idempotency_key == "order-42"
    assert keyed not in trimmed_ids(cluster)
    # The same key still gives the same run, which Redis still has.
    assert cluster.cli("trigger", "keyed", "--key", "order-42").stdout == f"{keyed} duplicate\n"


def seed(client: redis.Redis, name: str, runs: int) -> tuple[str, list[str]]:
    """A paused loop (window 2) with ``runs`` settled ad-hoc runs, written through the state API."""
    sdk = LoopsClient(client=client)
    loop = sdk.create({"name": name, "schedule": {"type": "interval", "everyMs": 3_600_000},
                       "target": {"type": "command", "command": "true"}, "keepRuns": 2})
    sdk.pause(name)
    store = RunStore(client, KEYS)
    base = timeutil.now() - timedelta(hours=1)
    ids = []
    for i in range(runs):
        at = base + timedelta(seconds=i)
        claim = store.claim(loop.id, at, OWNER, at, source="ad_hoc")
        assert isinstance(claim, Claim)
        assert store.finalize(claim.run.id, claim.token, at, status="succeeded", exit_code=0, duration_ms=1,
                              stdout="x" * 200, stderr="", error=None, pid=None) is not None
        ids.append(claim.run.id)
    return loop.id, ids


def whole_or_gone(cluster: Cluster, runs: dict[str, list[str]]) -> tuple[int, int]:
    """Every seeded run is whole (row, slot, both indexes) or gone entirely with a trim change naming it.
    Returns (whole, gone)."""
    client = cluster.client
    trimmed = set(trimmed_ids(cluster))
    whole = gone = 0
    everything = set(client.zrange(KEYS.runs, 0, -1))
    for loop_id, ids in runs.items():
        indexed = set(client.zrange(KEYS.loop_runs(loop_id), 0, -1))
        for run_id in ids:
            run = run_codec.load(client, KEYS.run(run_id))
            if run is not None:
                slot = run.scheduled_for
                assert client.hget(KEYS.slots(loop_id), slot) == run_id, run_id
                assert run_id in indexed and run_id in everything, run_id
                assert run_id not in trimmed, run_id
                whole += 1
            else:
                assert run_id not in indexed and run_id not in everything, run_id
                assert run_id in trimmed, f"{run_id} left Redis without its trim change"
                gone += 1
        # No slot key is left behind by a trimmed run.
        assert sorted(client.hvals(KEYS.slots(loop_id))) == sorted(
            i for i in ids if client.exists(KEYS.run(i)))
    return whole, gone


@pytest.mark.timeout(180)
def test_a_scheduler_killed_mid_trim_leaves_every_run_whole_or_gone(cluster: Cluster) -> None:
    client = cluster.client
    runs = dict(seed(client, f"seeded-{i}", 150) for i in range(3))
    # A live mirror group holds the stream, so every trim change stays readable for the check.
    client.xgroup_create(KEYS.changes, "mirror:test", id="0-0")
    client.xreadgroup("mirror:test", "test", {KEYS.changes: ">"}, count=1)
    first = cluster.start("scheduler", env={"LOOPSQ_FAULT": "mid_trim", "LOOPSQ_TEST_FAULTS": "1"}, wait=False)
    cluster.wait_until(lambda: not first.alive(), 30, "the scheduler to kill itself after its first trim")
    assert first.popen.returncode == -signal.SIGKILL
    assert whole_or_gone(cluster, runs)[1] == 100  # one transition: one loop's batch of 100, nothing else
    rng = random.Random(12)
    for _ in range(6):  # kill -9 at random moments while the backlog is trimmed
        proc = cluster.start("scheduler", wait=False)
        time.sleep(rng.uniform(0.3, 1.5))
        os.kill(proc.pid, signal.SIGKILL)
        proc.popen.wait(timeout=10)
        whole_or_gone(cluster, runs)
    last = cluster.start("scheduler")
    cluster.wait_until(lambda: all(client.zcard(KEYS.loop_runs(i)) == 2 for i in runs), 60,
                       "every window to be trimmed to 2 runs")
    last.terminate()
    assert whole_or_gone(cluster, runs) == (6, 444)
    for loop_id, ids in runs.items():
        assert client.zrange(KEYS.loop_runs(loop_id), 0, -1) == ids[-2:]


@pytest.mark.timeout(60)
def test_a_short_run_leaves_no_live_stream_and_a_long_ones_goes_soon_after_it_ends(cluster: Cluster) -> None:
    cluster.start_all(workers=2)
    at = to_iso(timeutil.now() + timedelta(seconds=1))
    cluster.create("long", "echo one; sleep 3; echo two", "--at", at)
    cluster.create("short", "echo quick", "--at", at)
    cluster.start("scheduler")
    long_run = cluster.wait_until(lambda: next((r for r in cluster.runs("long") if r.status == "running"), None), 20,
                                  "long to start")
    cluster.wait_until(lambda: cluster.client.exists(KEYS.live(long_run.id)), 10, "long's live output")
    short = cluster.wait_until(lambda: next((r for r in cluster.runs("short") if r.terminal), None), 20, "short")
    assert not cluster.client.exists(KEYS.live(short.id))
    cluster.wait_until(lambda: (r := cluster.run(long_run.id)) is not None and r.terminal, 20, "long to end")
    assert 0 < cluster.client.pttl(KEYS.live(long_run.id)) <= 10_000
    assert cluster.cli("logs", short.id).stdout == "quick\n"
    assert re.fullmatch(r"one\ntwo\n", cluster.cli("logs", long_run.id).stdout)
