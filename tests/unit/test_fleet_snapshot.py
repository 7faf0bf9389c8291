"""``engine.fleet.read_fleet`` on fakeredis: liveness records, RQ's queue lists and job hashes, and rq-scheduler's
timers written directly, as workers, enqueues and arms leave them; and the RQ spellings it reads from
``engine.timers``, held to what the installed RQ writes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest
import redis

from loopsq.engine import fleet, timers
from loopsq.state.keys import Keys

KEYS = Keys()


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def text(server: fakeredis.FakeServer) -> Iterator[redis.Redis]:
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def raw(server: fakeredis.FakeServer) -> Iterator[redis.Redis]:
    client = fakeredis.FakeRedis(server=server)
    yield client
    client.close()


def live_worker(client: redis.Redis, worker_id: str, **record: Any) -> None:
    """A worker's registration and liveness record, as ``Runtime`` writes them (fleet fields from ``describe``)."""
    body = {"id": worker_id, "role": "worker", "host": "h1", "pid": 1, "startedAt": "2026-12-01T00:00:00.000Z",
            "runs": [], **record}
    client.sadd(KEYS.workers, worker_id)
    client.set(KEYS.worker(worker_id), json.dumps(body), px=1500)


def waiting(client: redis.Redis, queue: str, job_id: str, waited_s: float | None) -> None:
    """A job waiting in RQ's list of ``queue``, enqueued ``waited_s`` ago (no hash at all when None)."""
    if queue != timers.QUEUE_NAME:
        client.hsetnx(KEYS.queues, queue, timers.queue_entry(queue))
    client.rpush(timers.queue_key(queue), job_id)
    if waited_s is not None:
        at = datetime.now(UTC) - timedelta(seconds=waited_s)
        client.hset(timers.job_key(job_id), timers.ENQUEUED_AT, at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))


def test_an_empty_deployment_has_the_base_queue_unserved_and_nothing_else(text: redis.Redis) -> None:
    snap = fleet.read_fleet(text, KEYS)
    assert snap.workers == () and (snap.capacity, snap.busy) == (0, 0)
    (base,) = snap.queues
    assert (base.name, base.labels, base.depth, base.oldest_age_ms, base.unserved) == ("loopsq", (), 0, None, True)
    assert base.why_unserved() == "no live worker is running"
    assert snap.timers == fleet.FleetTimers(armed=0, overdue=0, oldest_late_ms=None)
    assert abs((snap.at - datetime.now(UTC)).total_seconds()) < 5  # Redis's clock


def test_workers_are_read_with_labels_slots_busy_and_queues_and_summed(text: redis.Redis) -> None:
    live_worker(text, "w-gpu", labels=["gpu", "host:h1"], slots=3, busy=1, queues=["loopsq+gpu", "loopsq"])
    live_worker(text, "w-plain", labels=["host:h1"], slots=4, busy=4, queues=["loopsq"])
    snap = fleet.read_fleet(text, KEYS)
    assert [w.to_dict() for w in snap.workers] == [
        {"id": "w-gpu", "host": "h1", "labels": ["gpu", "host:h1"], "slots": 3, "busy": 1,
         "queues": ["loopsq+gpu", "loopsq"], "startedAt": "2026-12-01T00:00:00.000Z"},
        {"id": "w-plain", "host": "h1", "labels": ["host:h1"], "slots": 4, "busy": 4, "queues": ["loopsq"],
         "startedAt": "2026-12-01T00:00:00.000Z"},
    ]
    assert (snap.capacity, snap.busy) == (7, 5)
    assert snap.queues[0].served_by == ("w-gpu", "w-plain")


def test_a_dead_worker_a_local_run_now_and_a_garbled_record_are_not_in_the_fleet(text: redis.Redis) -> None:
    live_worker(text, "alive", labels=[], slots=2, busy=0)
    text.sadd(KEYS.workers, "dead")  # registered, liveness key expired
    live_worker(text, "manual:h1:9", role="manual", runs=["r1"])
    text.sadd(KEYS.workers, "garbled")
    text.set(KEYS.worker("garbled"), "{not json")
    assert [w.id for w in fleet.read_fleet(text, KEYS).workers] == ["alive"]


def test_an_older_worker_without_fleet_fields_is_one_slot_busy_while_it_holds_a_run(text: redis.Redis) -> None:
    live_worker(text, "old", runs=["r1"])
    (worker,) = fleet.read_fleet(text, KEYS).workers
    assert (worker.labels, worker.slots, worker.busy, worker.queues) == ((), 1, 1, ("loopsq",))


def test_each_queue_has_its_depth_and_the_age_of_its_oldest_waiting_run(text: redis.Redis) -> None:
    live_worker(text, "w", labels=["gpu"], slots=2, busy=2)
    waiting(text, "loopsq+gpu", "j1", 42.5)
    waiting(text, "loopsq+gpu", "j2", 3)
    waiting(text, "loopsq+gpu", "j3", 1)
    snap = fleet.read_fleet(text, KEYS)
    assert [q.name for q in snap.queues] == ["loopsq", "loopsq+gpu"]  # the base queue first
    base, gpu = snap.queues
    assert (base.depth, base.oldest_age_ms) == (0, None)
    assert (gpu.labels, gpu.depth, gpu.served_by, gpu.unserved) == (("gpu",), 3, ("w",), False)
    assert gpu.oldest_age_ms is not None and 42_500 <= gpu.oldest_age_ms < 44_000
    assert fleet.age_text(gpu.oldest_age_ms) == "42s"


def test_a_head_whose_job_hash_is_gone_leaves_the_age_to_the_next_job(text: redis.Redis) -> None:
    waiting(text, "loopsq", "gone", None)
    waiting(text, "loopsq", "j2", 10.5)
    (base,) = fleet.read_fleet(text, KEYS).queues
    assert base.depth == 2 and fleet.age_text(base.oldest_age_ms) == "10s"


def test_a_queue_no_live_worker_satisfies_is_unserved_naming_the_labels_the_closest_worker_lacks(
        text: redis.Redis) -> None:
    live_worker(text, "w1", labels=["gpu"], slots=1, busy=0)
    live_worker(text, "w2", labels=["nvme"], slots=1, busy=0)
    waiting(text, "loopsq+gpu+nvme", "j1", 5)
    waiting(text, "loopsq+nvme+repo:web", "j2", 5)
    snap = fleet.read_fleet(text, KEYS)
    by_name = {q.name: q for q in snap.queues}
    both = by_name["loopsq+gpu+nvme"]
    assert (both.unserved, both.missing) == (True, ("nvme",))  # w1 lacks one label, w2 one too: the first's
    assert both.why_unserved() == "no live worker has labels nvme"
    assert by_name["loopsq+nvme+repo:web"].missing == ("repo:web",)
    assert by_name["loopsq"].served_by == ("w1", "w2")
    assert by_name["loopsq+gpu+nvme"].to_dict() == {
        "name": "loopsq+gpu+nvme", "labels": ["gpu", "nvme"], "depth": 1,
        "oldestAgeMs": both.oldest_age_ms, "servedBy": [], "unserved": True, "missing": ["nvme"]}


def test_with_no_live_worker_a_queue_lacks_all_of_its_labels(text: redis.Redis) -> None:
    waiting(text, "loopsq+gpu+nvme", "j1", 5)
    gpu = fleet.read_fleet(text, KEYS).queues[1]
    assert gpu.missing == ("gpu", "nvme")
    assert gpu.why_unserved() == "no live worker has labels gpu, nvme"


def test_a_registered_queue_with_nothing_waiting_is_listed_empty(text: redis.Redis) -> None:
    text.hsetnx(KEYS.queues, "loopsq+gpu", timers.queue_entry("loopsq+gpu"))
    text.hsetnx(KEYS.queues, "not-ours", "{}")  # not a loopsq queue name: left out
    assert [(q.name, q.depth) for q in fleet.read_fleet(text, KEYS).queues] == [("loopsq", 0), ("loopsq+gpu", 0)]


def test_timers_past_their_time_by_more_than_the_grace_are_overdue(text: redis.Redis) -> None:
    now = time.time()
    key = timers.scheduled_key()
    text.zadd(key, {"late-a": now - 30.25, "late-b": now - 10, "just-due": now - 1, "future": now + 60})
    late = fleet.read_fleet(text, KEYS).timers
    assert (late.armed, late.overdue) == (4, 2)
    assert late.oldest_late_ms is not None and fleet.age_text(late.oldest_late_ms) == "30s"


def test_timers_within_the_grace_are_not_overdue(text: redis.Redis) -> None:
    text.zadd(timers.scheduled_key(), {"just-due": time.time() - 1, "future": time.time() + 60})
    assert fleet.read_fleet(text, KEYS).timers == fleet.FleetTimers(armed=2, overdue=0, oldest_late_ms=None)


def test_the_snapshot_is_read_in_three_round_trips_whatever_the_number_of_loops_and_timers(
        text: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(50):
        text.set(KEYS.loop(f"l{i}"), "{}")
        text.zadd(timers.scheduled_key(), {f"t{i}": time.time() - 30.5 + i})
    live_worker(text, "w", labels=["gpu"], slots=2, busy=1)
    waiting(text, "loopsq+gpu", "j1", 5)
    calls: list[int] = []
    original = redis.client.Pipeline.execute

    def counted(self: redis.client.Pipeline, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(self.command_stack))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", counted)
    monkeypatch.setattr(redis.Redis, "execute_command", lambda *_a, **_k: pytest.fail("a command outside a pipeline"))
    snap = fleet.read_fleet(text, KEYS)
    assert len(calls) == 3
    assert (snap.timers.armed, snap.timers.overdue) == (50, 26)  # those more than 5 s past


def test_to_dict_is_camel_case_json(text: redis.Redis) -> None:
    live_worker(text, "w", labels=["gpu"], slots=2, busy=1, queues=["loopsq"])
    data = json.loads(json.dumps(fleet.read_fleet(text, KEYS).to_dict()))
    assert set(data) == {"at", "capacity", "busy", "workers", "queues", "timers", "pools"}
    assert (data["capacity"], data["busy"]) == (2, 1)
    assert data["timers"] == {"armed": 0, "overdue": 0, "oldestLateMs": None, "overdueAfterMs": 5000}


@pytest.mark.parametrize(("ms", "shown"), [(None, "-"), (0, "0s"), (999, "0s"), (42_700, "42s"), (120_000, "2m"),
                                           (125_000, "125s"), (-5, "0s")])
def test_ages_are_shown_in_whole_seconds(ms: int | None, shown: str) -> None:
    assert fleet.age_text(ms) == shown


def test_lacking_is_the_closest_workers_gap() -> None:
    assert fleet.lacking(["a", "b", "c"], [["a"], ["a", "b"], []]) == ["c"]
    assert fleet.lacking(["a"], []) == ["a"]
    assert fleet.lacking(["a"], [["a"]]) == []


# -- the RQ spellings ``engine.timers`` gives the fleet view, against the installed RQ ---------------------------
def test_an_enqueued_job_is_in_the_queue_list_and_its_hash_has_the_enqueue_time_rq_wrote(
        text: redis.Redis, raw: redis.Redis) -> None:
    before = datetime.now(UTC) - timedelta(seconds=1)
    job_id = timers.enqueue(raw, "worker.jobs.run_now", "l1", "req", queue_name="loopsq+nvme", keys=KEYS)
    assert text.lrange(timers.queue_key("loopsq+nvme"), 0, -1) == [job_id]
    when = timers.enqueued_time(text.hget(timers.job_key(job_id), timers.ENQUEUED_AT))
    assert when is not None and before <= when <= datetime.now(UTC) + timedelta(seconds=1)
    assert timers.queue_key("loopsq+nvme") == timers.queue(raw, "loopsq+nvme").key
    assert timers.enqueued_time(None) is None and timers.enqueued_time("yesterday") is None


def test_an_armed_timer_is_in_the_scheduled_set_at_its_time_in_seconds(text: redis.Redis, raw: redis.Redis) -> None:
    at = datetime.now(UTC) + timedelta(minutes=5)
    job_id = timers.arm(raw, KEYS, "l1", at)
    assert job_id is not None
    score = text.zscore(timers.scheduled_key(), job_id)
    assert score is not None and abs(score - at.timestamp()) < 0.002
    assert timers.scheduled_key() == timers.scheduler(raw).scheduled_jobs_key


def test_the_fleet_shows_each_pool_with_its_holders_and_waiters_in_status_and_metrics(text: redis.Redis) -> None:
    from loopsq.cli.health_cmds import fleet_lines
    from loopsq.state.pools import PoolStore
    from loopsq.web.metrics import fleet_families

    pools = PoolStore(text, KEYS)
    pools.set("claude-acct", 2)
    pools.set("idle", 1)
    assert not isinstance(pools.acquire("claude-acct", "loop-a", 10_000), type(None))
    pools.acquire("claude-acct", "loop-b", 10_000)
    waiting_ = pools.acquire("claude-acct", "loop-c", 10_000)
    assert type(waiting_).__name__ == "Waiting"
    snap = fleet.read_fleet(text, KEYS)
    assert [(p.pool.name, len(p.holders), len(p.waiters)) for p in snap.pools] == [("claude-acct", 2, 1), ("idle", 0, 0)]
    lines = fleet_lines(snap.to_dict())
    assert "  pool claude-acct  in-use=2/2  waiting=1" in lines and "  pool idle  in-use=0/1  waiting=0" in lines
    samples = {(m.name, s.labels.get("pool")): s.value for m in fleet_families(snap) for s in m.samples
               if s.labels.get("pool")}
    assert samples[("loopsq_pool_limit", "claude-acct")] == 2
    assert samples[("loopsq_pool_holders", "claude-acct")] == 2
    assert samples[("loopsq_pool_waiters", "claude-acct")] == 1
