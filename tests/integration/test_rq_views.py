"""RQ's own views of loopsq's workers stay true on both RQ lines (2.12 and 3.x): ``rq info`` shows a loopsq worker
busy while it fires a loop and idle after, with its finished count, and RQ's worker API (what rq-dashboard shows)
names the job it runs. Real redis-server, RQ's CLI as a process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.worker import Worker

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import from_iso
from loopsq.engine import rq_worker, steering, timers
from loopsq.engine.runtime import Runtime, set_current_runtime

pytestmark = pytest.mark.integration


@pytest.fixture
def rt(real_redis: redis.Redis) -> Iterator[Runtime]:
    runtime = Runtime(client=real_redis, role="worker").start()
    set_current_runtime(runtime)
    yield runtime
    set_current_runtime(None)
    runtime.stop()


def queued_fire(rt: Runtime, name: str) -> str:
    body = {"name": name, "schedule": {"type": "interval", "everyMs": 3_600_000},
            "target": {"type": "command", "command": "true"}, "timezone": "UTC"}
    loop = rt.loops.create(new_loop(body, timeutil.now() - timedelta(hours=1, seconds=1)))
    job_id = timers.arm(rt.raw, rt.keys, loop.id, from_iso(str(loop.next_run_at)))
    assert job_id is not None
    return job_id


def rq_info(rt: Runtime, name: str) -> str:
    """``rq info``'s line of worker ``name`` (RQ's CLI of the installed version, against the test's server)."""
    port = rt.raw.connection_pool.connection_kwargs["port"]
    out = subprocess.run([str(Path(sys.executable).parent / "rq"), "info", "-W", "-r", "--url",
                          f"redis://127.0.0.1:{port}/0"], capture_output=True, text=True, timeout=60, check=True)
    return next((line for line in out.stdout.splitlines() if name in line), "")


def test_rq_info_shows_a_loopsq_worker_busy_with_its_job_then_its_finished_count(
        rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = queued_fire(rt, "one"), queued_fire(rt, "two")
    assert timers.move_due(rt.raw) == 2
    name = rt.owner.worker_id
    seen: list[tuple[str, str | None]] = []
    original = steering.execute_target

    def spy(*args: Any, **kwargs: Any) -> Any:
        current = Worker.find_by_key(f"rq:worker:{name}", connection=rt.raw)
        seen.append((rq_info(rt, name), current.get_current_job_id() if current else None))
        return original(*args, **kwargs)

    monkeypatch.setattr(steering, "execute_target", spy)
    worker = rq_worker.make_worker(rt.raw, name)
    assert rq_worker.work(worker, burst=True)
    assert len(seen) == 2
    assert " busy " in seen[0][0] and "jobs: 0 finished, 0 failed" in seen[0][0], seen[0][0]
    assert seen[0][1] in (first, second)  # (RQ's API, which rq-dashboard shows, names the fire job it runs)
    assert " busy " in seen[1][0] and "jobs: 1 finished, 0 failed" in seen[1][0], seen[1][0]


def test_rq_info_shows_an_idle_loopsq_worker(rt: Runtime) -> None:
    worker: Any = rq_worker.make_worker(rt.raw, "idle-one")
    worker.register_birth()
    worker._idle()
    assert " idle " in rq_info(rt, "idle-one")
