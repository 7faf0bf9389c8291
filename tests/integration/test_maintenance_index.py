"""Maintenance works from indexes (``state.loop_watch``): each check still finds what is wrong — a lost timer, a
write never followed by its arm, an expired loop, a dead worker's run — while a pass over idle, armed loops issues
the same commands however many loops are defined. Against the session's private redis-server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from rq.job import Job

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.timeutil import from_iso, to_ms
from loopsq.engine import maintenance, runner, timers
from loopsq.engine.runtime import Runtime
from loopsq.state import loop_watch
from loopsq.state.runs import Claim

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    runtime = Runtime(client=real_redis, role="scheduler").start()
    yield runtime
    runtime.stop()


def armed_loop(rt: Runtime, name: str, *, first_in_s: float = 60.0, arm: bool = True, **extra: Any) -> Loop:
    """A loop every minute whose next slot is ``first_in_s`` from now, its timer armed (unless ``arm`` is off)."""
    body = {"name": name, "schedule": {"type": "interval", "everyMs": 60_000},
            "target": {"type": "command", "command": "true", "shell": True}, "timezone": "UTC", **extra}
    loop = rt.loops.create(new_loop(body, timeutil.now() - timedelta(seconds=60 - first_in_s)))
    if arm:
        timers.arm(rt.raw, rt.keys, loop.id, from_iso(str(loop.next_run_at)))
    return loop


def settle(rt: Runtime) -> None:
    """Passes until the full reconciliation's first round is over (it starts at once on a fresh deployment)."""
    for _ in range(1000):
        maintenance.maintain(rt)
        if int(rt.client.hget(rt.keys.reconcile, "nextAt") or 0):
            return
    raise AssertionError("the reconciliation round never ended")


def timer_ms(rt: Runtime, loop: Loop) -> int | None:
    score, _ = timers.armed_state(rt.raw, rt.keys, [loop.id])[loop.id]
    return None if score is None else round(score * 1000)


def lose_timer(rt: Runtime, loop: Loop) -> None:
    """The loop's rq-scheduler entry and job vanish (what a crash inside rq-scheduler's move can do)."""
    job_id = str(rt.client.get(rt.keys.timer(loop.id)))
    rt.raw.zrem(timers.scheduler(rt.raw).scheduled_jobs_key, job_id)
    rt.raw.delete(Job.key_for(job_id))


def test_a_lost_timer_is_armed_again_once_its_time_passed_by_the_grace(rt: Runtime) -> None:
    loop = armed_loop(rt, "lost", first_in_s=10)
    settle(rt)
    lose_timer(rt, loop)
    due = from_iso(str(loop.next_run_at))
    assert maintenance.maintain(rt).armed == 0  # nothing says anything is wrong yet
    late = due + timedelta(milliseconds=loop_watch.DUE_GRACE_MS + 1)
    assert maintenance.maintain(rt, late).armed == 1
    assert timer_ms(rt, loop) == to_ms(due)
    assert maintenance.maintain(rt, late + timedelta(milliseconds=1)).armed == 0  # once


def test_a_loop_written_but_never_armed_is_armed_after_the_write_grace(rt: Runtime) -> None:
    settle(rt)
    loop = armed_loop(rt, "unarmed", arm=False)  # the writer died before it armed the timer
    assert maintenance.maintain(rt).armed == 0
    later = timeutil.now() + timedelta(milliseconds=loop_watch.WRITE_GRACE_MS + 100)
    assert maintenance.maintain(rt, later).armed == 1
    assert timer_ms(rt, loop) == to_ms(from_iso(str(loop.next_run_at)))


def test_a_loop_whose_expiry_passed_is_expired_from_its_index(rt: Runtime) -> None:
    expires = timeutil.now() + timedelta(seconds=30)
    loop = armed_loop(rt, "expiring", first_in_s=10, expiresAt=timeutil.to_iso(expires))
    settle(rt)
    assert rt.client.zscore(rt.keys.loop_expiry, loop.id) == to_ms(expires)
    assert maintenance.maintain(rt, expires - timedelta(seconds=1)).expired == 0
    report = maintenance.maintain(rt, expires + timedelta(milliseconds=1))
    assert report.expired == 1
    gone = rt.loops.get(loop.id)
    assert gone is not None and gone.status == "expired"
    assert timer_ms(rt, loop) is None  # disarmed in the same pass
    assert rt.client.zscore(rt.keys.loop_expiry, loop.id) is None
    assert rt.client.zscore(rt.keys.loop_watch, loop.id) is None


def test_a_dead_workers_run_is_recovered_from_the_running_index(rt: Runtime, real_redis: redis.Redis) -> None:
    loop = armed_loop(rt, "orphan", first_in_s=-1)
    settle(rt)
    dead = Runtime(client=real_redis, role="worker")  # never started: no liveness key, as after a kill -9
    claim = runner.claim_slot(dead, loop.id, from_iso(str(loop.next_run_at)), timeutil.now(), source="scheduled")
    assert isinstance(claim, Claim)
    report = maintenance.maintain(rt)
    assert [run.id for run in report.recovered] == [claim.run.id]
    recovered = rt.runs.get(claim.run.id)
    assert recovered is not None and recovered.status == "abandoned"
    assert recovered.error == f"worker {dead.owner.worker_id} died before completion"


def commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name: int(value["calls"]) for name, value in stats.items()}


def idle_pass_commands(rt: Runtime) -> dict[str, int]:
    """The commands (also those a script calls) of one maintenance pass, by name, after a first pass has trimmed
    the change stream of the writes before it (one XTRIM, for what was written, not for what is defined)."""
    maintenance.maintain(rt)
    before = commands(rt.client)
    maintenance.maintain(rt)
    after = commands(rt.client)
    return {name: calls - before.get(name, 0) - (1 if name == "cmdstat_info" else 0)
            for name, calls in after.items() if calls - before.get(name, 0) - (1 if name == "cmdstat_info" else 0)}


def test_an_idle_pass_issues_the_same_commands_for_120_and_1200_armed_loops(rt: Runtime) -> None:
    # (Over 100 loops each, so that both change streams are past the trim margin: one XTRIM a pass either way.)
    for i in range(120):
        armed_loop(rt, f"few-{i}", first_in_s=30 + i / 100)
    settle(rt)
    few = idle_pass_commands(rt)
    for i in range(1080):
        armed_loop(rt, f"many-{i}", first_in_s=30 + i / 100)
    assert rt.client.scard(rt.keys.loops) == 1200
    many = idle_pass_commands(rt)
    assert many == few
    assert sum(few.values()) < 40, few
    # The pre-index pass, for contrast, reads every loop and its timer.
    before = commands(rt.client)
    maintenance.check_loops(rt, rt.loops.ids(), timeutil.now(), maintenance.Report(), reindex=False)
    assert commands(rt.client)["cmdstat_get"] - before["cmdstat_get"] >= 1200


def test_a_full_round_seeds_the_indexes_of_loops_that_had_none(rt: Runtime) -> None:
    loops = [armed_loop(rt, f"old-{i}") for i in range(5)]
    rt.client.delete(rt.keys.loop_watch, rt.keys.loop_expiry)  # written by a version without indexes
    settle(rt)
    for loop in loops:
        score = rt.client.zscore(rt.keys.loop_watch, loop.id)
        assert score == loop_watch.armed_score_ms(to_ms(from_iso(str(loop.next_run_at))), 0)


def test_the_watch_moves_past_the_timer_when_a_write_finds_it_armed(rt: Runtime) -> None:
    loop = armed_loop(rt, "rewritten")
    at = to_ms(from_iso(str(loop.next_run_at)))
    renamed = rt.loops.rename(loop.id, "renamed", timeutil.now())  # a write whose timer is armed already
    assert renamed.next_run_at == loop.next_run_at
    assert rt.client.zscore(rt.keys.loop_watch, loop.id) == loop_watch.armed_score_ms(at, 0)
    paused = rt.loops.pause(loop.id, timeutil.now())
    assert paused.status == "paused"
    assert rt.client.zscore(rt.keys.loop_watch, loop.id) is None


def test_the_watch_spells_rq_schedulers_timer_key_and_loopsqs_timer_prefix_as_the_timer_module_does() -> None:
    assert timers.MsScheduler.scheduled_jobs_key == loop_watch.SCHEDULED_KEY
    assert timers.FIRE_PREFIX == loop_watch.TIMER_PREFIX
