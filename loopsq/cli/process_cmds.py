"""Long-running processes: ``loopsq scheduler`` and ``loopsq worker``."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import click

from loopsq.cli.app import get_app


def _logging(name: str) -> None:
    logging.basicConfig(level=logging.INFO, format=f"[loopsq-{name}] %(message)s", force=True)


@click.command("scheduler")
@click.option("--poll-ms", default=20, show_default=True, metavar="MS", help="How often due timers are checked.")
def scheduler(poll_ms: int) -> None:
    """Run a scheduler: move due timers to the queue and run maintenance (any number may run)."""
    from loopsq.engine.scheduler_process import run_scheduler

    app = get_app()  # no fail-fast ping: an unreachable Redis is waited for; a configuration error ends it (3)
    _logging("scheduler")
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        logging.getLogger("loopsq.scheduler").info("stop signal received")
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    run_scheduler(app.redis_url, stop, poll_s=max(1, poll_ms) / 1000.0)


@click.command("worker")
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@click.option("--grace", default="30s", show_default=True, metavar="DURATION",
              help="On SIGTERM, how long the current run may finish before it is cancelled and retried elsewhere.")
def worker(burst: bool, grace: str) -> None:
    """Run a worker: execute runs from loopsq's queue (scale horizontally)."""
    from loopsq.cli.options import duration_flag
    from loopsq.engine.worker_process import run_worker

    grace_ms = duration_flag("--grace", grace) or 0

    app = get_app()  # as the scheduler: Redis is waited for, a configuration error ends it (exit status 3)
    _logging("worker")
    run_worker(app.redis_url, burst=burst, grace_s=grace_ms / 1000.0)
