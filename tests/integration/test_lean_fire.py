"""A lone fire's round trips (issue 21.3): the loop and its running runs read once, the claim straight from that
read, the process start left to the beat (or the finalize), and the next timer armed in the round trip of the
transition that decided it, guarded by the loop's JSON. In this process, against the session's redis-server."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from redis.connection import AbstractConnection
from rq.job import Job

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import timer_at
from loopsq.domain.timeutil import from_iso, to_ms
from loopsq.engine import runner, timers
from loopsq.engine.runtime import Runtime

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    runtime = Runtime(client=real_redis, role="worker").start()
    yield runtime
    runtime.stop()


def due_loop(rt: Runtime, name: str, schedule: dict[str, Any], command: str = "true",
             created: Any = None) -> Loop:
    body = {"name": name, "schedule": schedule, "target": {"type": "command", "command": command, "shell": True},
            "timezone": "UTC"}
    loop = rt.loops.create(new_loop(body, created or timeutil.now() - timedelta(hours=1, seconds=1)))
    timers.arm(rt.raw, rt.keys, loop.id, from_iso(str(loop.next_run_at)))
    return loop


class Trips:
    """The requests this thread sends while inside (a pipeline or a script counts once), by first word."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.paused = False
        self._orig = AbstractConnection.send_packed_command

    def __enter__(self) -> Trips:
        trips = self

        def send(conn: AbstractConnection, command: Any, check_health: bool = True) -> None:
            if threading.current_thread() is threading.main_thread() and not trips.paused:
                data = b"".join(command) if isinstance(command, list) else command
                trips.sent.append(data.split(b"\r\n")[2].decode().upper())
            trips._orig(conn, command, check_health)  # type: ignore[no-untyped-call]

        AbstractConnection.send_packed_command = send  # type: ignore[method-assign]
        return self

    def __exit__(self, *_exc: object) -> None:
        AbstractConnection.send_packed_command = self._orig  # type: ignore[method-assign]


def armed_job(rt: Runtime, loop_id: str) -> str:
    return str(rt.client.get(rt.keys.timer(loop_id)))


def test_a_lone_fire_of_an_interval_loop_costs_three_round_trips(rt: Runtime) -> None:
    loop = due_loop(rt, "interval", {"type": "interval", "everyMs": 3_600_000})
    with Trips() as trips:
        result = runner.fire(rt, loop.id)
    assert result.completed == 1 and result.runs[0].status == "succeeded"
    # The read (GET loop + SMEMBERS active: a pipeline), the claim, the finalize with the arm behind it.
    assert len(trips.sent) == 3, trips.sent
    after = rt.loops.get(loop.id)
    assert after is not None
    want = timer_at(after)
    assert want is not None
    job_id = armed_job(rt, loop.id)
    assert job_id.startswith(f"{timers.FIRE_PREFIX}{loop.id}-{to_ms(want)}-")
    assert rt.raw.zscore("rq:scheduler:scheduled_jobs", job_id) == pytest.approx(to_ms(want) / 1000.0)
    # The job hash the script wrote is RQ's job: it fetches and names the fire of this loop.
    job = Job.fetch(job_id, connection=rt.raw)
    assert (job.func_name, job.args, job.result_ttl, job.origin) == (timers.FIRE, (loop.id,), 0, timers.QUEUE_NAME)


def test_a_cron_loops_next_slot_is_armed_in_its_claims_round_trip(rt: Runtime) -> None:
    # Created a second before the latest five-minute boundary: one slot due, none for catch-up to drop (dropped slots
    # are recorded missed, in round trips of their own).
    now_ms = to_ms(timeutil.now())
    boundary = timeutil.from_ms(now_ms - now_ms % 300_000)
    loop = due_loop(rt, "cron", {"type": "cron", "expression": "*/5 * * * *"},
                    created=boundary - timedelta(seconds=1))
    seen: list[str] = []
    trips = Trips()

    def during() -> None:  # while the run goes on, its next slot is armed already (these reads not counted)
        trips.paused = True
        current = rt.loops.get(loop.id)
        assert current is not None
        seen.append(armed_job(rt, loop.id))
        seen.append(f"{timers.FIRE_PREFIX}{loop.id}-{to_ms(timer_at(current) or timeutil.now())}-")
        trips.paused = False

    from loopsq.engine import steering

    original = steering.execute_target

    def spy(*args: Any, **kwargs: Any) -> Any:
        during()
        return original(*args, **kwargs)

    steering.execute_target = spy  # type: ignore[assignment]
    try:
        with trips:
            runner.fire(rt, loop.id)
    finally:
        steering.execute_target = original  # type: ignore[assignment]
    assert seen[0].startswith(seen[1])
    assert trips.sent.count("EVAL") == 0  # no arm of its own: it rode behind the claim (and the finalize)
    assert len(trips.sent) == 3, trips.sent


def test_an_arm_behind_a_transition_does_nothing_once_the_loop_moved_on(rt: Runtime) -> None:
    loop = due_loop(rt, "moved", {"type": "interval", "everyMs": 3_600_000})
    before = armed_job(rt, loop.id)
    keys_before = set(rt.raw.keys("*"))
    stale = loop.to_json()
    rt.loops.pause(loop.id, timeutil.now())  # someone moves the loop on after "our" transition wrote ``stale``
    paused_json = str(rt.client.get(rt.keys.loop(loop.id)))
    assert paused_json != stale
    later = timeutil.now() + timedelta(hours=3)
    assert timers.arm(rt.raw, rt.keys, loop.id, later, expect_loop=stale) is None
    assert armed_job(rt, loop.id) == before or rt.client.get(rt.keys.timer(loop.id)) is None
    assert not any(k.startswith(f"rq:job:{timers.FIRE_PREFIX}{loop.id}-{to_ms(later)}".encode())
                   for k in rt.raw.keys("*"))
    # With the loop as it is now, the same arm applies.
    assert timers.arm(rt.raw, rt.keys, loop.id, later, expect_loop=paused_json) is not None
    assert armed_job(rt, loop.id).startswith(f"{timers.FIRE_PREFIX}{loop.id}-{to_ms(later)}-")
    assert set(rt.raw.keys("*")) - keys_before  # (its job hash)


def test_a_fire_whose_loop_moved_between_finalize_and_arm_re_reads_it(rt: Runtime) -> None:
    """Another writer pauses the loop between the finalize and its arm (the pause is queued in between, on the
    same pipeline): the arm finds another loop than the one the finalize wrote and does nothing, and the fire
    re-reads the loop and arms what it says (a paused loop: no timer), not what the finalize wrote."""
    loop = due_loop(rt, "raced", {"type": "interval", "everyMs": 3_600_000})
    original = timers.arm_after

    def paused_in_between(pipe: Any, raw: Any, keys: Any, loop_id: str, at: Any, loop_json: str,
                          queue_name: str = timers.QUEUE_NAME) -> None:
        paused = Loop.from_json(loop_json).with_changes(status="paused")
        pipe.set(keys.loop(loop_id), paused.to_json())
        original(pipe, raw, keys, loop_id, at, loop_json, queue_name)

    timers.arm_after = paused_in_between  # type: ignore[assignment]
    try:
        result = runner.fire(rt, loop.id)
    finally:
        timers.arm_after = original  # type: ignore[assignment]
    assert result.completed == 1
    after = rt.loops.get(loop.id)
    assert after is not None and after.status == "paused"
    assert rt.client.get(rt.keys.timer(loop.id)) is None  # disarmed from the fresh read
    assert rt.raw.zcard("rq:scheduler:scheduled_jobs") == 0


def test_a_fire_whose_loop_moved_between_its_finalize_and_that_arm_re_reads_it(rt: Runtime) -> None:
    """The claim's arm of the next slot applies; then the run fails, its finalize schedules the retry, and another
    writer pauses the loop before the finalize's arm: the fire re-reads the loop (paused: no timer) instead of
    keeping the claim's timer, which would fire a paused loop."""
    body = {"name": "raced-finalize", "schedule": {"type": "interval", "everyMs": 3_600_000},
            "target": {"type": "command", "command": "exit 1", "shell": True}, "timezone": "UTC",
            "maxAttempts": 2, "retryDelayMs": 60_000}
    loop = rt.loops.create(new_loop(body, timeutil.now() - timedelta(hours=1, seconds=1)))
    timers.arm(rt.raw, rt.keys, loop.id, from_iso(str(loop.next_run_at)))
    original = timers.arm_after
    calls: list[str] = []

    def paused_before_the_second(pipe: Any, raw: Any, keys: Any, loop_id: str, at: Any, loop_json: str,
                                 queue_name: str = timers.QUEUE_NAME) -> None:
        calls.append(loop_json)
        if len(calls) == 2:  # the finalize's
            pipe.set(keys.loop(loop_id), Loop.from_json(loop_json).with_changes(status="paused").to_json())
        original(pipe, raw, keys, loop_id, at, loop_json, queue_name)

    timers.arm_after = paused_before_the_second  # type: ignore[assignment]
    try:
        result = runner.fire(rt, loop.id)
    finally:
        timers.arm_after = original  # type: ignore[assignment]
    assert len(calls) == 2 and result.runs[0].status == "failed"
    after = rt.loops.get(loop.id)
    assert after is not None and after.status == "paused"
    assert rt.client.get(rt.keys.timer(loop.id)) is None
    assert rt.raw.zcard("rq:scheduler:scheduled_jobs") == 0


def test_a_runs_process_start_is_recorded_by_the_beat_while_it_runs(rt: Runtime) -> None:
    loop = due_loop(rt, "sleeper", {"type": "interval", "everyMs": 3_600_000}, command="sleep 1.5")
    done: list[Any] = []
    thread = threading.Thread(target=lambda: done.append(runner.fire(rt, loop.id)))
    thread.start()
    deadline = time.monotonic() + 5
    recorded = None
    while time.monotonic() < deadline and recorded is None:
        running = rt.runs.get_many(rt.runs.active_ids(loop.id))
        if running and running[0].pid:
            recorded = running[0]
        time.sleep(0.05)
    thread.join(10)
    assert recorded is not None and recorded.status == "running"
    assert recorded.pid_start_time is not None and recorded.host == rt.owner.host
    final = done[0].runs[0]
    assert (final.status, final.pid, final.pid_start_time) == ("succeeded", recorded.pid, recorded.pid_start_time)


def test_a_short_run_has_its_process_start_recorded_by_its_finalize(rt: Runtime) -> None:
    loop = due_loop(rt, "short", {"type": "interval", "everyMs": 3_600_000})
    with Trips() as trips:
        final = runner.fire(rt, loop.id).runs[0]
    assert final.status == "succeeded" and final.pid and final.pid_start_time is not None
    assert final.host == rt.owner.host
    assert len(trips.sent) == 3


def test_a_slot_that_falls_due_while_the_fire_claims_stays_due_instead_of_being_passed_over(
        rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fire judges the due slots at its start; its claim moved the loop to the first slot after the claim's own
    time, so a slot that fell due in between was passed over with no record at all (the chaos bench's lone slot
    without a record). The first claim is decided on the fire's time: that slot stays due, for the timer."""
    loop = due_loop(rt, "boundary", {"type": "interval", "everyMs": 2_000})
    first = to_ms(from_iso(str(loop.next_run_at)))
    behind = (to_ms(timeutil.now()) - first) // 2_000
    latest = first + behind * 2_000  # the slot due at the fire's start (catch-up latest)
    fired_ms, later_ms = latest + 1_999, latest + 2_005  # the next slot falls due between the two
    calls: list[int] = []

    class Clock:
        """``timeutil`` as ``runner`` sees it: the fire's start, then 6 ms later for every other reading."""

        def __getattr__(self, name: str) -> Any:
            return getattr(timeutil, name)

        def now(self) -> Any:
            calls.append(1)
            return timeutil.from_ms(fired_ms if len(calls) == 1 else later_ms)

    monkeypatch.setattr(runner, "timeutil", Clock())
    out = runner.fire(rt, loop.id)
    assert out.claimed == 1
    (run,) = [r for r in rt.runs.get_many(rt.client.zrange(rt.keys.loop_runs(loop.id), 0, -1)) if r.status != "missed"]
    assert to_ms(from_iso(run.scheduled_for)) == latest
    moved = rt.loops.get(loop.id)
    assert moved is not None and to_ms(from_iso(str(moved.next_run_at))) == latest + 2_000
