"""The progress watchdog (``engine.stalls``) with real scheduler and worker processes on the session's
redis-server: a loop whose fire job sits in no queue, and a hot loop (a slot whose claim can never pass), each run
again, are repaired once, logged once naming the cause, counted, and reported by ``doctor``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from loopsq.domain import missed, timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.timeutil import from_iso
from loopsq.engine import maintenance, stalls, timers
from loopsq.engine.rqcompat import names as rqnames
from loopsq.engine.runtime import Runtime
from loopsq.state.keys import Keys
from loopsq.web import WebSettings, create_app
from tests.integration.processes import Cluster, open_cluster
from tests.integration.test_web_api import AUTH, TOKEN
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()
#: A grace floor small enough that a loop every second is stalled 2 s after its slot (30 s by default).
FAST_GRACE = {"LOOPSQ_STALL_GRACE_MIN": "2s"}


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def queue_holds(client: redis.Redis, job_id: str) -> bool:
    return client.lpos(timers.queue_key(timers.QUEUE_NAME), job_id) is not None


@pytest.mark.timeout(90)
def test_a_loop_whose_fire_job_is_in_no_queue_is_repaired_once_and_runs_again(cluster: Cluster) -> None:
    cluster.create_fast("stranded", cluster.ledger_cmd(), 1000)
    loop_id = cluster.loop("stranded")["id"]
    scheduler = cluster.start("scheduler", env=FAST_GRACE)
    # No worker yet: the timer fires and its job waits in the queue; then it is lost from the queue (as in a
    # Sentinel failover), its hash still saying queued.
    job_id = cluster.wait_until(lambda: next((j for j in [cluster.client.get(KEYS.timer(loop_id))]
                                              if j and queue_holds(cluster.client, j)), None), 15,
                                "the loop's fire job to be queued")
    assert cluster.client.lrem(timers.queue_key(timers.QUEUE_NAME), 0, job_id) == 1
    assert cluster.client.hget(timers.job_key(job_id), "status") == "queued"
    stranded_at = timeutil.now()
    cluster.start("worker")
    cluster.wait_until(lambda: [r for r in cluster.ran("stranded") if from_iso(r.created_at) > stranded_at], 30,
                       "the loop to run again")
    assert not cluster.client.exists(timers.job_key(job_id))  # the stranded hash went
    time.sleep(1.5)  # more maintenance passes: nothing is repaired twice
    lines = [line for line in scheduler.text().splitlines() if "stalled, cause=" in line]
    assert len(lines) == 1, cluster.logs()
    assert f"loop stranded (id={loop_id}) stalled, cause=lost_fire_job: its fire job was in no queue; slot " in lines[0]
    assert f"dropped job {job_id}, timer re-armed now" in lines[0]
    assert cluster.client.hgetall(KEYS.repaired_counts) == {"lost_fire_job": "1"}
    doctor = cluster.cli("doctor", check=False).stdout
    (line,) = [" ".join(line.split()) for line in doctor.splitlines() if ":stall" in line]
    assert line.startswith(f"warn loop:{loop_id}:stall loop was stalled and has been repaired: stranded "
                           "(lost_fire_job: its fire job was in no queue; repaired at "), doctor


@pytest.mark.timeout(90)
def test_a_hot_loop_gives_up_its_slot_once_and_runs_its_next_slots(cluster: Cluster) -> None:
    cluster.create_fast("hot", cluster.ledger_cmd(), 1000)
    loop_id = cluster.loop("hot")["id"]
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: cluster.ledger("hot"), 15, "the loop's first run")

    def upcoming() -> str | None:
        slot = str(cluster.loop("hot")["nextRunAt"])
        return slot if from_iso(slot) - timeutil.now() > timedelta(milliseconds=300) else None

    # A claim of the next slot left by a previous version (no run behind it, 30-day TTL): its claim never passes.
    slot = cluster.wait_until(upcoming, 10, "a next slot far enough ahead")
    cluster.client.set(KEYS.claim(loop_id, slot, 1), "old-version:token", ex=30 * 24 * 3600)

    def stalled_rows() -> list[str]:
        return [r.id for r in cluster.runs("hot") if r.missed_kind == missed.STALLED]

    cluster.wait_until(stalled_rows, 10, "the slot recorded missed (stalled)")
    (row,) = [r for r in cluster.runs("hot") if r.missed_kind == missed.STALLED]
    assert (row.scheduled_for, row.status, row.error) == (slot, "missed", "stalled: a claim the slot can never pass")
    cluster.wait_until(lambda: len([s for s, *_ in cluster.ledger("hot") if s > slot]) >= 2, 10,
                       "the loop to run its next slots")
    fires = cluster.client.get(KEYS.slot_fires(loop_id, slot))
    time.sleep(1.0)
    assert fires == "6" and cluster.client.get(KEYS.slot_fires(loop_id, slot)) == "6"  # the fires stopped
    assert slot not in [s for s, *_ in cluster.ledger("hot")]
    assert len(stalled_rows()) == 1
    lines = [line for line in cluster.logs().splitlines() if "stalled, cause=" in line]
    assert len(lines) == 1, cluster.logs()
    assert (f"loop hot (id={loop_id}) stalled, cause=hot_loop: a claim the slot can never pass; slot {slot} "
            "refused (claimed) 6 times; recorded missed, loop moved on") in lines[0]
    assert cluster.client.hgetall(KEYS.repaired_counts) == {"hot_loop": "1"}


def test_queued_in_place_tells_a_job_in_its_queue_from_a_stranded_one(real_redis: redis.Redis) -> None:
    raw = timers.raw_from(real_redis)
    job_id = timers.arm(raw, KEYS, "loop1", timeutil.now() - timedelta(seconds=1))
    assert job_id is not None
    assert timers.queued_in_place(raw, job_id) is None  # scheduled, not fired yet: nothing to judge
    assert timers.move_due(raw) == 1
    assert timers.queued_in_place(raw, job_id) is True
    real_redis.lrem(timers.queue_key(timers.QUEUE_NAME), 0, job_id)
    assert timers.queued_in_place(raw, job_id) is False
    timers.drop_stranded(raw, job_id)
    assert timers.queued_in_place(raw, job_id) is None


def test_a_fire_job_left_in_the_intermediate_list_by_a_lost_dequeue_is_stranded_and_dropped_from_it(
        real_redis: redis.Redis) -> None:
    raw = timers.raw_from(real_redis)
    job_id = timers.arm(raw, KEYS, "loop1", timeutil.now() - timedelta(seconds=1))
    assert job_id is not None and timers.move_due(raw) == 1
    # RQ's dequeue (BLMOVE onto the intermediate list) whose reply the worker never read.
    intermediate = timers.queue(raw).intermediate_queue_key
    assert real_redis.lmove(timers.queue_key(timers.QUEUE_NAME), intermediate) == job_id
    assert real_redis.hget(timers.job_key(job_id), "status") == "queued"
    assert timers.queued_in_place(raw, job_id) is False
    timers.drop_stranded(raw, job_id)
    assert real_redis.lrange(intermediate, 0, -1) == []
    assert not real_redis.exists(timers.job_key(job_id))


# -- the guards, in this process against the session's redis-server ------------------------------------------------
@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    runtime = Runtime(client=real_redis, role="scheduler").start()
    yield runtime
    runtime.stop()


def fired_loop(rt: Runtime, late_s: float) -> tuple[Loop, str]:
    """A loop every second whose timer fired ``late_s`` ago: its job queued in its queue, no worker took it."""
    body = {"name": "fired", "schedule": {"type": "interval", "everyMs": 1_000},
            "target": {"type": "command", "command": "true", "shell": True}, "timezone": "UTC"}
    loop = rt.loops.create(new_loop(body, timeutil.now() - timedelta(seconds=late_s + 1)))
    job_id = timers.arm(rt.raw, rt.keys, loop.id, from_iso(str(loop.next_run_at)))
    assert job_id is not None and timers.move_due(rt.raw) == 1
    return loop, job_id


def check(rt: Runtime, loop: Loop) -> int:
    report = maintenance.Report()
    maintenance.check_loops(rt, [loop.id], timeutil.now(), report)
    return report.stalls_repaired


def test_maintenance_repairs_a_stranded_fire_job_only_past_the_grace_and_with_no_run_going(rt: Runtime) -> None:
    loop, job_id = fired_loop(rt, late_s=31)
    assert check(rt, loop) == 0  # in its queue: waits for a worker, nothing is stalled
    rt.client.lrem(timers.queue_key(timers.QUEUE_NAME), 0, job_id)
    rt.client.sadd(rt.keys.loop_active(loop.id), "run1")
    assert check(rt, loop) == 0  # a run of the loop is going on
    rt.client.delete(rt.keys.loop_active(loop.id))
    assert check(rt, loop) == 1
    assert not rt.client.exists(timers.job_key(job_id))
    assert timers.armed_state(rt.raw, rt.keys, [loop.id])[loop.id][0] is not None  # armed again, now
    assert check(rt, loop) == 0  # once
    (record,) = stalls.records(rt.client, rt.keys).values()
    assert (record.cause, record.repaired) == ("lost_fire_job", True)


def test_maintenance_repairs_a_fire_job_left_started_by_a_live_worker_whose_settle_a_failover_lost(
        rt: Runtime) -> None:
    """The state a failover leaves when a worker took the fire job on the new master (``take_fire``) and its settle
    went to the old master, then discarded: the job started by a worker that lives on and runs it no more."""
    loop, job_id = fired_loop(rt, late_s=31)
    worker = "worker:host:1234:abcdef"
    rt.client.set(rt.keys.worker(worker), "{}", ex=60)  # its liveness: the worker lives
    rt.raw.hset(rqnames.worker_key(worker), "state", "idle")  # its RQ worker hash (the execution shows on it)
    taken = timers.take_fire(rt.raw, worker)
    assert taken is not None and taken.job_id == job_id
    assert timers.armed_state(rt.raw, rt.keys, [loop.id])[loop.id] == (None, "started")
    assert check(rt, loop) == 0  # just taken: its fire is under way
    old = (timeutil.now() - timedelta(seconds=40)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    rt.raw.hset(timers.job_key(job_id), "started_at", old)  # taken 40 s ago, never settled
    rt.client.sadd(rt.keys.loop_active(loop.id), "run1")
    assert check(rt, loop) == 0  # a run of the loop is going on: the fire holds it
    rt.client.delete(rt.keys.loop_active(loop.id))
    assert check(rt, loop) == 1
    assert not rt.client.exists(timers.job_key(job_id))
    if rqnames.WORKER_HAS_EXECUTIONS:
        assert not rt.client.exists(rqnames.taken_execution_key(job_id))
        assert rt.client.smembers(rqnames.worker_executions_key(worker)) == set()
    new_job = rt.client.get(rt.keys.timer(loop.id))
    assert new_job != job_id and timers.armed_state(rt.raw, rt.keys, [loop.id])[loop.id][0] is not None
    assert check(rt, loop) == 0  # once
    assert rt.client.hgetall(rt.keys.repaired_counts) == {"lost_fire_job": "1"}


def test_maintenance_leaves_a_stranded_fire_job_within_the_grace(rt: Runtime) -> None:
    loop, job_id = fired_loop(rt, late_s=20)  # a loop every second: its grace is the 30 s floor
    rt.client.lrem(timers.queue_key(timers.QUEUE_NAME), 0, job_id)
    assert check(rt, loop) == 0
    assert rt.client.exists(timers.job_key(job_id))


def test_a_refused_slot_is_given_up_only_past_five_refusals_and_never_while_a_run_goes_on(rt: Runtime) -> None:
    loop, _ = fired_loop(rt, late_s=0)
    slot = from_iso(str(loop.next_run_at))
    now = timeutil.now()
    assert not any(stalls.refused(rt, loop, slot, "past", now) for _ in range(10))  # settled: not counted
    assert not rt.client.exists(rt.keys.slot_fires(loop.id, str(loop.next_run_at)))
    rt.client.sadd(rt.keys.loop_active(loop.id), "run1")
    assert not any(stalls.refused(rt, loop, slot, "claimed", now) for _ in range(10))
    rt.client.delete(rt.keys.loop_active(loop.id), rt.keys.slot_fires(loop.id, str(loop.next_run_at)))
    assert [stalls.refused(rt, loop, slot, "claimed", now) for _ in range(8)] == [False] * 5 + [True, False, False]
    assert 0 < rt.client.ttl(rt.keys.slot_fires(loop.id, str(loop.next_run_at))) <= 60
    moved = rt.loops.get(loop.id)
    assert moved is not None and from_iso(str(moved.next_run_at)) > slot
    assert rt.client.hgetall(rt.keys.repaired_counts) == {"hot_loop": "1"}


def test_a_scheduler_refuses_a_grace_floor_that_is_no_duration(cluster: Cluster) -> None:
    proc = cluster.start("scheduler", env={"LOOPSQ_STALL_GRACE_MIN": "soon"}, wait=False)
    assert proc.popen.wait(timeout=30) == 2
    assert "error: LOOPSQ_STALL_GRACE_MIN must be a duration greater than zero such as 30s, got 'soon'" in proc.text()


def test_metrics_show_the_loops_repaired_by_cause(redis_server: RedisServer, real_redis: redis.Redis,
                                                  tmp_path: Path) -> None:
    real_redis.hset(KEYS.repaired_counts, mapping={"hot_loop": 2})
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False,
                           rq_dashboard=False)
    with TestClient(create_app(settings), headers=AUTH) as web:
        families = text_string_to_metric_families(web.get("/metrics").text)
    got = {dict(s.labels)["cause"]: s.value for f in families for s in f.samples
           if s.name == "loopsq_loops_repaired_total"}
    assert got == {"hot_loop": 2, "lost_fire_job": 0}
