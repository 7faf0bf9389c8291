"""A fire job goes on to fire the timer jobs queued behind it (``fire_queue.fire_queued`` over ``timers.take_fire``),
in this process against the session's private redis-server: which jobs it takes, in what order, what it leaves
for RQ, and what is left in Redis when it stops."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from rq.job import Job

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.timeutil import from_iso
from loopsq.engine import fire_queue, maintenance, runner, timers
from loopsq.engine.runtime import Runtime

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    runtime = Runtime(client=real_redis, role="worker").start()
    yield runtime
    runtime.stop()


def due_loop(rt: Runtime, name: str, command: str = "true") -> Loop:
    """A loop whose first slot is due now, its timer armed at that slot."""
    body = {"name": name, "schedule": {"type": "interval", "everyMs": 3_600_000},
            "target": {"type": "command", "command": command, "shell": True}, "timezone": "UTC"}
    loop = rt.loops.create(new_loop(body, timeutil.now() - timedelta(hours=1, seconds=1)))
    timers.arm(rt.raw, rt.keys, loop.id, from_iso(str(loop.next_run_at)))
    return loop


def queued(rt: Runtime) -> list[str]:
    return [v.decode() for v in rt.raw.lrange(timers.queue(rt.raw).key, 0, -1)]


def timer_job(rt: Runtime, loop: Loop) -> str:
    return str(rt.client.get(rt.keys.timer(loop.id)))


def test_take_fire_takes_timer_jobs_from_the_head_and_leaves_any_other_job_in_its_place(rt: Runtime) -> None:
    a, b, c = (due_loop(rt, name) for name in ("a", "b", "c"))
    first, second, third = timer_job(rt, a), timer_job(rt, b), timer_job(rt, c)
    raw = rt.raw
    # Queue order: a's timer, b's timer, another job, c's timer.
    for job_id in (first, second):
        timers.scheduler(raw).enqueue_job(Job.fetch(job_id, connection=raw))
    other = timers.enqueue(raw, "worker.jobs.run_triggered", "no-such-run")
    timers.scheduler(raw).enqueue_job(Job.fetch(third, connection=raw))
    assert queued(rt) == [first, second, other, third]

    assert timers.take_fire(raw, "w1")[:2] == (first, a.id)  # type: ignore[index]
    assert raw.hmget(Job.key_for(first), ["status", "worker_name"]) == [b"started", b"w1"]
    assert timers.take_fire(raw, "w1", done=first)[:2] == (second, b.id)  # type: ignore[index]
    assert not raw.exists(Job.key_for(first))
    # The head is not a timer's job: nothing is taken, the order is kept, and the finished job is still deleted.
    assert timers.take_fire(raw, "w1", done=second) is None
    assert not raw.exists(Job.key_for(second))
    assert queued(rt) == [other, third]


def test_take_fire_skips_a_timer_job_whose_hash_is_gone(rt: Runtime) -> None:
    a, b = due_loop(rt, "a"), due_loop(rt, "b")
    assert timers.move_due(rt.raw) == 2
    gone, kept = sorted([timer_job(rt, a), timer_job(rt, b)], key=queued(rt).index)
    rt.raw.delete(Job.key_for(gone))
    assert timers.take_fire(rt.raw, "w1")[:2] == (kept, timers.fire_loop_id(kept))  # type: ignore[index]
    assert queued(rt) == []


def test_fire_loop_id_reads_the_loop_back_from_a_timer_job_id() -> None:
    at = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    assert timers.fire_loop_id(f"{timers.FIRE_PREFIX}my-loop-id-{timeutil.to_ms(at)}-ab12cd") == "my-loop-id"


def test_fire_queued_runs_every_queued_timer_in_queue_order_and_leaves_nothing_behind(rt: Runtime) -> None:
    loops = [due_loop(rt, f"l{i}") for i in range(5)]
    assert timers.move_due(rt.raw) == 5
    order = [timers.fire_loop_id(job_id) for job_id in queued(rt)]
    taken_jobs = queued(rt)

    result = fire_queue.fire_queued(rt)

    assert (result.taken, result.claimed, result.completed) == (5, 5, 5)
    assert [run.loop_id for run in result.runs] == order
    assert all(run.status == "succeeded" and run.worker_id == rt.owner.worker_id for run in result.runs)
    assert queued(rt) == []
    assert not any(rt.raw.exists(Job.key_for(job_id)) for job_id in taken_jobs)
    # Each loop is re-armed at its next slot, one hour on.
    for loop in loops:
        current = rt.loops.get(loop.id)
        assert current is not None
        score = rt.raw.zscore(timers.scheduler(rt.raw).scheduled_jobs_key, timer_job(rt, loop))
        assert score is not None and score * 1000 == timeutil.to_ms(from_iso(str(current.next_run_at)))
        assert from_iso(str(current.next_run_at)) > timeutil.now() + timedelta(minutes=59)


def test_fire_queued_takes_nothing_once_a_shutdown_is_requested(rt: Runtime) -> None:
    due_loop(rt, "a")
    assert timers.move_due(rt.raw) == 1
    rt.begin_shutdown(60)
    result = fire_queue.fire_queued(rt)
    assert result.taken == 0
    assert len(queued(rt)) == 1  # left for another worker


def test_fire_queued_stops_after_its_budget(rt: Runtime) -> None:
    for i in range(3):
        due_loop(rt, f"l{i}")
    assert timers.move_due(rt.raw) == 3
    result = fire_queue.fire_queued(rt, budget_s=0.0)
    assert result.taken == 0 and len(queued(rt)) == 3
    result = fire_queue.fire_queued(rt, budget_s=60.0)
    assert result.taken == 3 and queued(rt) == []


def test_a_taken_fire_that_fails_is_failed_in_rq_under_its_own_id_and_maintenance_rearms_the_loop(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = due_loop(rt, "a")
    assert timers.move_due(rt.raw) == 1
    (job_id,) = queued(rt)

    def broken(_rt: Runtime, _loop_id: str, **_kwargs: Any) -> runner.FireResult:
        raise redis.ConnectionError("connection lost")

    monkeypatch.setattr(runner, "fire", broken)
    assert fire_queue.fire_queued(rt).taken == 1  # the host job is not failed with the taken job's error
    monkeypatch.undo()
    job = Job.fetch(job_id, connection=rt.raw)
    result = job.latest_result()
    assert job.get_status() == "failed" and result is not None and "connection lost" in str(result.exc_string)
    # While taken, the job counted as in flight; now it failed, so the next maintenance pass re-arms the loop.
    assert timers.armed_state(rt.raw, rt.keys, [loop.id])[loop.id] == (None, "failed")
    report = maintenance.maintain(rt)
    assert report.armed == 1
    score, _ = timers.armed_state(rt.raw, rt.keys, [loop.id])[loop.id]
    assert score is not None and score * 1000 == timeutil.to_ms(from_iso(str(loop.next_run_at)))


def test_a_taken_job_counts_as_in_flight_while_its_worker_lives_and_orphaned_once_it_is_gone(rt: Runtime) -> None:
    mine, theirs = due_loop(rt, "mine"), due_loop(rt, "theirs")
    assert timers.move_due(rt.raw) == 2
    # This runtime is a live worker (its liveness key is set at start); "killed-worker" has no liveness key.
    owners = {mine.id: rt.owner.worker_id, theirs.id: "killed-worker"}
    for _ in range(2):
        loop_id = timers.fire_loop_id(queued(rt)[0])
        assert timers.take_fire(rt.raw, owners[loop_id]) is not None
    states = timers.armed_state(rt.raw, rt.keys, [mine.id, theirs.id])
    assert states == {mine.id: (None, "started"), theirs.id: (None, "orphaned")}
    my_job, their_job = timer_job(rt, mine), timer_job(rt, theirs)
    report = maintenance.maintain(rt)
    assert report.armed == 1
    assert timers.armed_state(rt.raw, rt.keys, [mine.id])[mine.id] == (None, "started")
    assert timers.armed_state(rt.raw, rt.keys, [theirs.id])[theirs.id][0] is not None
    # Re-arming dropped the dead worker's taken job (nothing else would); a live worker's re-arm keeps its own.
    assert not rt.raw.exists(Job.key_for(their_job))
    timers.arm(rt.raw, rt.keys, mine.id, timeutil.now() + timedelta(hours=1))
    assert rt.raw.hget(Job.key_for(my_job), "status") == b"started"


def test_dropping_a_taken_job_rides_out_a_short_redis_outage_and_gives_up_after_a_long_one(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b"):
        due_loop(rt, name)
    assert timers.move_due(rt.raw) == 2
    first, second = queued(rt)
    real_finish = timers.finish_taken
    failures = {"left": 2}

    def flaky(raw: redis.Redis, job_id: str, *args: object) -> None:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise redis.ConnectionError("Connection refused")
        real_finish(raw, job_id, *args)  # type: ignore[arg-type]

    def fire_then_stop(runtime: Runtime, _loop_id: str, **_kwargs: Any) -> runner.FireResult:
        runtime.begin_shutdown(60)  # the taken job is then dropped on its own, not by a next take
        return runner.FireResult()

    monkeypatch.setattr(timers, "finish_taken", flaky)
    monkeypatch.setattr(fire_queue, "FINISH_WAIT_S", 1.0)
    monkeypatch.setattr(runner, "fire", fire_then_stop)
    assert fire_queue.fire_queued(rt).taken == 1
    assert failures["left"] == 0 and not rt.raw.exists(Job.key_for(first))

    # Redis stays away longer than the retries: the error goes up (to RQ); the job stays marked for the orphan path.
    assert timers.take_fire(rt.raw, rt.owner.worker_id)[:2] == (second, timers.fire_loop_id(second))  # type: ignore[index]
    failures["left"] = 10
    with pytest.raises(redis.ConnectionError):
        fire_queue._finish_taken(rt, second)
    assert rt.raw.hget(Job.key_for(second), "status") == b"started"
