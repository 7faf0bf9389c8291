"""Redis Sentinel: a real failover in the middle of a workload of real scheduler and worker processes.

A master, a replica and three sentinels on loopback (``tests.redis_server.SentinelGroup``; the same redis-server
binary the session uses, run with ``--sentinel``). Every loopsq process gets only the ``redis+sentinel://`` URL.
``SENTINEL FAILOVER`` promotes the replica while loops run every second; the old master accepts writes for about
11 s more before Sentinel demotes it, and then discards them (``bench/failover_loss.py``). Claims wait for a
replica (``loopsq.state.durability``), so no claim made there runs.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.timeutil import from_iso
from loopsq.engine import timers
from loopsq.sdk import LoopsClient
from loopsq.state.connection import connect
from tests.integration.processes import KEYS, Cluster, open_cluster
from tests.redis_server import SentinelGroup

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LOOPS = 4


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    g = SentinelGroup().start()
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture
def cluster(group: SentinelGroup, tmp_path: Path) -> Iterator[Cluster]:
    group.wait_settled()
    yield from open_cluster(group.url, tmp_path)


def _settled_runs(cluster: Cluster, name: str, after: float = 0.0) -> list[str]:
    return [r.scheduled_for for r in cluster.runs(name)
            if r.status == "succeeded" and from_iso(r.scheduled_for).timestamp() > after]


def test_every_loopsq_process_and_the_sdk_reach_redis_through_the_sentinels(cluster: Cluster,
                                                                           group: SentinelGroup) -> None:
    out = cluster.cli("create", "command", "hello", "--cmd", "true", "--every", "1h").stdout
    assert out.startswith("created loop ")
    master = group.server(group.master_port()).client()
    assert master.hget("loopsq:loop-names", "hello") or master.keys("loopsq:*"), "nothing written on the master"
    client = connect(group.url)
    assert client.connection_pool.service_name == "loopsq-test"
    assert cluster.cli("list").stdout.split()[-1] == "hello"


def test_a_failover_in_the_middle_of_a_workload_loses_no_loop_and_runs_no_slot_twice(cluster: Cluster,
                                                                                    group: SentinelGroup) -> None:
    procs = cluster.start_all(schedulers=2, workers=2)
    names = [f"fo{i}" for i in range(LOOPS)]
    client = LoopsClient(cluster.url)
    for name in names:
        # Catch-up "all": a slot whose run the failover discarded would run again, so a lost claim shows.
        client.create({"name": name, "schedule": {"type": "interval", "everyMs": 1000, "anchor": "fixed_rate"},
                       "catchUp": "all", "target": {"type": "command", "command": cluster.ledger_cmd(),
                                                    "shell": True}})
    client.close()
    cluster.wait_until(lambda: all(len(_settled_runs(cluster, n)) >= 2 for n in names), 60, "runs before failover")

    old, new = group.failover(settled=False)
    group.wait_settled()
    settled_at = time.time()
    assert group.master_port() == new != old

    # Loops keep running on the new master: each gets runs for slots after the group settled.
    cluster.wait_until(lambda: all(len(_settled_runs(cluster, n, after=settled_at)) >= 3 for n in names), 90,
                       "runs after the failover")
    exited = [p.name for p in procs if not p.alive()]
    cluster.stop_all()
    assert exited == [], f"processes exited during the failover: {exited}\n{cluster.logs()}"

    for name in names:
        executed = [slot for slot, *_ in cluster.ledger(name)]
        doubled = {slot: n for slot, n in Counter(executed).items() if n > 1}
        assert doubled == {}, f"{name}: slots executed twice: {doubled}\n{cluster.logs()}"
        # No stranded loop: active, with its timer armed for a future slot.
        loop = cluster.loop(name)
        assert loop["status"] == "active"
        armed = cluster.timer_at(name)
        assert armed is not None, f"{name} has no armed timer"
        # Every execution is recorded, settled, with its exit code.
        runs = {r.id: r for r in cluster.runs(name)}
        for slot, run_id in cluster.ledger(name):
            run = runs.get(run_id)
            assert run is not None, f"{name}: the run of slot {slot} ({run_id}) was lost\n{cluster.logs()}"
            assert (run.scheduled_for, run.status, run.exit_code) == (slot, "succeeded", 0), run.to_dict()


def test_up_with_an_external_sentinel_redis_runs_loops_on_it(group: SentinelGroup, tmp_path: Path) -> None:
    from tests.integration.test_up import Up, clean_env, loopsq, wait_for_runs

    group.wait_settled()
    connect(group.url).flushall()
    env = clean_env(tmp_path, LOOPSQ_REDIS_URL=group.url)
    up = Up(env, tmp_path / "up.log", "--workers", "1", "--no-web")
    try:
        up.wait_for(r"^up \| running;", 60)
        assert loopsq(env, "create", "command", "via-sentinel", "--every", "1s", "--cmd", "true").returncode == 0
        wait_for_runs(env, "via-sentinel", 20, status="succeeded")
        assert f"up | using Redis at {group.url} (redis-server " in up.text()
        master = group.server(group.master_port()).client()
        assert master.hget("loopsq:loop-names", "via-sentinel") is not None
        assert up.stop() == 0
    finally:
        up.cleanup()


def test_the_web_app_and_its_rq_dashboard_serve_through_the_sentinels(group: SentinelGroup, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from loopsq.web import WebSettings, create_app

    group.wait_settled()
    client = LoopsClient(group.url)
    client.client.flushall()
    client.create({"name": "web-sentinel", "schedule": {"type": "interval", "everyMs": 3_600_000},
                   "target": {"type": "command", "command": "true"}})
    # A job on loopsq's queue (no worker runs here), for rq-dashboard to count on the master.
    timers.queue(timers.raw_from(client.client)).enqueue("worker.jobs.fire", "no-such-loop")
    token = "a-web-token-through-sentinel"
    settings = WebSettings(redis_url=group.url, data_dir=tmp_path / "data", token=token, follow_mirror=False)
    with TestClient(create_app(settings)) as web:
        loops = web.get("/api/loops", headers={"Authorization": f"Bearer {token}"})
        assert loops.status_code == 200, loops.text
        assert [loop["name"] for loop in loops.json()["items"]] == ["web-sentinel"]
        assert web.post("/login", data={"token": token, "next": "/"}, follow_redirects=False).status_code == 303
        queues = web.get("/rq/0/data/queues.json")
        assert queues.status_code == 200, queues.text
        assert {q["name"]: q["count"] for q in queues.json()["queues"]}.get("loopsq") == 1, queues.json()
        page = web.get("/rq/")
        assert page.status_code == 200
        assert "redis+sentinel://127.0.0.1:" in page.text


def test_a_run_that_finishes_during_a_failover_is_recorded_once_on_the_new_master(cluster: Cluster,
                                                                                 group: SentinelGroup) -> None:
    cluster.start_all(workers=1)
    ledger = cluster.ledger_dir / "ledger-straddle"
    cluster.create("straddle", f'sleep 3; echo "$LOOPS_SCHEDULED_FOR $LOOPS_RUN_ID" >> {ledger}', "--every", "1h")
    run_id = cluster.cli("trigger", "straddle").stdout.split()[0]
    old = group.master_port()
    replica = next(s for s in group.servers if s.port != old).client()
    # Running, and its claim on the replica, before the failover starts.
    def started() -> bool:
        run = cluster.run(run_id)
        return run is not None and run.pid is not None and bool(replica.exists(KEYS.run(run_id)))

    cluster.wait_until(started, 20, "the run to start")
    group.failover(settled=False)
    # The run ends about two seconds after the promotion, while the old master still takes writes.
    group.wait_settled()
    cluster.wait_until(lambda: (r := cluster.run(run_id)) is not None and r.status != "running", 30,
                       "the run to be recorded on the new master")
    run = cluster.run(run_id)
    assert run is not None
    assert (run.status, run.exit_code, run.attempt) == ("succeeded", 0, 1), run.to_dict()
    assert [line.split()[1] for line in ledger.read_text().splitlines()] == [run_id]
