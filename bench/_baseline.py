"""The bare-RQ baseline the benchmarks compare loopsq with: rq-scheduler one-shot timers (``enqueue_at``) run by
rq-scheduler's own ``run()`` loop, and RQ ``SimpleWorker``s executing plain job functions. No loopsq code.

Entry points for child processes: ``python bench/_baseline.py scheduler URL QUEUE POLL_S`` and
``python bench/_baseline.py worker URL QUEUE``.

rq-scheduler stores whole seconds (``calendar.timegm``), so a job due at 12.5 s would be moved at 12.0 s: a
baseline with spread-out millisecond slots would show negative lags. ``MsScheduler`` here overrides only the
score (milliseconds, as loopsq's ``timers.MsScheduler`` does); everything else is stock rq-scheduler 0.14.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import redis
from rq import Queue, SimpleWorker, get_current_job
from rq_scheduler import Scheduler

RESULT_TTL = 60  # as loopsq's fire jobs


class MsScheduler(Scheduler):  # type: ignore[misc]
    """Stock rq-scheduler with millisecond scores."""

    def enqueue_at(self, scheduled_time: datetime, func: Any, *args: Any, **kwargs: Any) -> Any:
        job = self._create_job(func, args=args, kwargs={}, timeout=kwargs.get("timeout"), id=kwargs.get("job_id"),
                               result_ttl=kwargs.get("job_result_ttl"), queue_name=kwargs.get("queue_name"))
        self.connection.zadd(self.scheduled_jobs_key, {job.id: scheduled_time.timestamp()})
        return job

    def get_jobs_to_queue(self, with_times: bool = False) -> Any:
        return self.get_jobs(time.time(), with_times=with_times)


def arm(conn: redis.Redis, queue_name: str, slot_s: float, every_s: float, ledger: str, index: int) -> None:
    """Arm the one-shot timer of baseline "loop" ``index`` at ``slot_s`` (epoch seconds)."""
    slot = datetime.fromtimestamp(slot_s, UTC)
    MsScheduler(queue_name=queue_name, connection=conn).enqueue_at(
        slot, "_baseline.fire", slot_s, every_s, ledger, index, queue_name,
        job_id=f"bl-{index}-{round(slot_s * 1000)}", timeout=-1, job_result_ttl=RESULT_TTL, queue_name=queue_name,
    )


def fire(slot_s: float, every_s: float, ledger: str, index: int, queue_name: str) -> int:
    """The baseline job: start the same ledger command as loopsq's targets, then re-arm one period later."""
    slot_iso = datetime.fromtimestamp(slot_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    env = dict(os.environ, LOOPS_SCHEDULED_FOR=slot_iso, LOOPS_LOOP_ID=f"bl-{index}", LOOPS_RUN_ID="-")
    script = f'echo "$EPOCHREALTIME $LOOPS_SCHEDULED_FOR $LOOPS_LOOP_ID $LOOPS_RUN_ID" >> {ledger}'
    rc = subprocess.run(["bash", "-c", script], env=env, stdin=subprocess.DEVNULL, check=False).returncode
    job = get_current_job()
    assert job is not None
    arm(job.connection, queue_name, round(slot_s + every_s, 3), every_s, ledger, index)
    return rc


def main(argv: list[str]) -> None:
    """Child-process entry points (see the module docstring)."""
    role, url, queue_name = argv[0], argv[1], argv[2]
    conn = redis.Redis.from_url(url)
    if role == "scheduler":
        MsScheduler(queue_name=queue_name, connection=conn, interval=float(argv[3])).run()
    elif role == "worker":
        SimpleWorker([Queue(queue_name, connection=conn)], connection=conn).work(
            logging_level="WARNING", with_scheduler=False
        )
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
