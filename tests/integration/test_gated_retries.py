"""A change gate decides whether a new slot is worth starting; a retry is never gated (README, ``engine.prechecks``).
So a retry whose gate has closed since its first attempt still runs, and the loop's regular slots after it are
gated as usual: skipped while the gate stays closed, run once it opens, never blocked behind the retry.

``fire`` in this process against the session's redis-server, with the engine's clock injected (slots a minute
apart come at once); targets and gates are real commands.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.timeutil import from_iso, to_iso
from loopsq.engine.prechecks import precheck_slot
from loopsq.engine.runner import fire
from loopsq.engine.runtime import Runtime
from loopsq.state.keys import Keys

pytestmark = pytest.mark.integration
KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
EVERY = timedelta(minutes=1)


class Clock:
    """The engine's ``timeutil.now``, moved by the test."""

    def __init__(self) -> None:
        self.at = T0

    def __call__(self) -> datetime:
        return self.at


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    found = Clock()
    monkeypatch.setattr("loopsq.domain.timeutil.now", found)
    return found


@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    runtime = Runtime(client=real_redis, keys=KEYS, role="worker")
    yield runtime
    runtime.stop()


def gated_loop(rt: Runtime, tmp_path: Path, command: str) -> tuple[Loop, Path]:
    """A loop every minute from ``T0``, two attempts, its gate open while the returned flag file exists."""
    flag = tmp_path / "gate-open"
    flag.touch()
    ledger = tmp_path / "ledger"
    body = {"name": "gated", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 60_000},
            "target": {"type": "command", "command": f'echo "$LOOPS_SCHEDULED_FOR $LOOPS_ATTEMPT" >> {ledger}; '
                                                     f"{command}", "shell": True},
            "gate": {"command": f"test -e {flag}"}, "maxAttempts": 2, "retryDelayMs": 1000}
    return rt.loops.create(new_loop(body, T0)), flag


def ledger(tmp_path: Path) -> list[tuple[str, ...]]:
    """(slot, attempt) of each execution of the target."""
    path = tmp_path / "ledger"
    return [tuple(line.split()) for line in path.read_text().splitlines()] if path.exists() else []


def rows(rt: Runtime, loop_id: str) -> list[tuple[str, str, int, str | None]]:
    """(slot, status, attempt, error) of the loop's runs, oldest slot first."""
    ids = [str(i) for i in rt.client.zrange(KEYS.loop_runs(loop_id), 0, -1)]
    return sorted((r.scheduled_for, r.status, r.attempt, r.error) for r in rt.runs.get_many(ids))


def fire_at(rt: Runtime, clock: Clock, loop_id: str, at: datetime) -> None:
    clock.at = at
    fire(rt, loop_id)


def retry_at(rt: Runtime, loop_id: str) -> datetime:
    loop = rt.loops.get(loop_id)
    assert loop is not None and loop.retry_scheduled_for is not None and loop.retry_at is not None, loop
    return from_iso(loop.retry_at)


def test_a_retry_slot_of_a_gated_loop_is_not_gated(rt: Runtime, clock: Clock, tmp_path: Path) -> None:
    loop, flag = gated_loop(rt, tmp_path, 'test "$LOOPS_ATTEMPT" = 2')
    slot = T0 + EVERY
    flag.unlink()
    assert precheck_slot(rt, loop, slot, slot, is_retry=True) == (False, None)  # claim it, gate or no gate
    stopped, row = precheck_slot(rt, loop, slot, slot, is_retry=False)
    assert stopped and row is not None and row.error == "gate closed (exit 1)"


def test_a_retry_runs_though_its_gate_closed_since_its_first_attempt(rt: Runtime, clock: Clock,
                                                                     tmp_path: Path) -> None:
    loop, flag = gated_loop(rt, tmp_path, 'test "$LOOPS_ATTEMPT" = 2')
    s1 = T0 + EVERY
    fire_at(rt, clock, loop.id, s1)
    assert rows(rt, loop.id) == [(to_iso(s1), "failed", 1, "process exited with code 1")]
    flag.unlink()  # the gate closes before the retry comes
    fire_at(rt, clock, loop.id, retry_at(rt, loop.id))
    assert rows(rt, loop.id) == [(to_iso(s1), "succeeded", 2, None)]
    assert ledger(tmp_path) == [(to_iso(s1), "1"), (to_iso(s1), "2")]


def test_a_closed_gate_at_a_retry_does_not_block_the_regular_slots_after_it(rt: Runtime, clock: Clock,
                                                                            tmp_path: Path) -> None:
    loop, flag = gated_loop(rt, tmp_path, "exit 1")  # fails every attempt
    s1, s2, s3 = T0 + EVERY, T0 + 2 * EVERY, T0 + 3 * EVERY
    fire_at(rt, clock, loop.id, s1)
    flag.unlink()
    fire_at(rt, clock, loop.id, retry_at(rt, loop.id))  # the retry runs, fails, and no attempt is left
    current = rt.loops.get(loop.id)
    assert current is not None and (current.retry_scheduled_for, current.next_run_at) == (None, to_iso(s2)), current
    fire_at(rt, clock, loop.id, s2)  # a regular slot: gated
    flag.touch()
    fire_at(rt, clock, loop.id, s3)  # open again: it runs
    assert rows(rt, loop.id) == [
        (to_iso(s1), "failed", 2, "process exited with code 1"),
        (to_iso(s2), "skipped", 1, "gate closed (exit 1)"),
        (to_iso(s3), "failed", 1, "process exited with code 1"),
    ]
    assert ledger(tmp_path) == [(to_iso(s1), "1"), (to_iso(s1), "2"), (to_iso(s3), "1")]
