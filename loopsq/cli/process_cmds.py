"""Long-running processes: ``loopsq scheduler`` and ``loopsq worker``."""

from __future__ import annotations

import logging
import threading

import click

from loopsq.cli.app import get_app
from loopsq.engine.slots import DEFAULT_CONCURRENCY
from loopsq.system import tracing
from loopsq.system.signals import dump_stacks_on_sigusr2, stop_on_signals


def _logging(name: str) -> None:
    from loopsq.engine.faults import warn_if_enabled

    logging.basicConfig(level=logging.INFO, format=f"[loopsq-{name}] %(message)s", force=True)
    warn_if_enabled(logging.getLogger(f"loopsq.{name}"))
    dump_stacks_on_sigusr2()


@click.command("scheduler")
@click.option("--poll-ms", default=20, show_default=True, metavar="MS", help="How often due timers are checked.")
@click.option("--no-migrate", is_flag=True, help="Refuse (exit 2) a state in an older layout instead of migrating it "
              "at start (`loopsq migrate`).")
def scheduler(poll_ms: int, no_migrate: bool) -> None:
    """Run a scheduler: move due timers to the queue and run maintenance (any number may run)."""
    from loopsq.domain.stalls import grace_min_ms as stall_grace_min_ms
    from loopsq.engine.scheduler_process import run_scheduler
    from loopsq.system import limits

    # Bad retention settings are bad input (exit 2) at start, not an error on every maintenance pass.
    limits.keep_runs(), limits.keep_workflow_runs(), limits.mirror_idle_ms(), stall_grace_min_ms()
    tracing.configure("loopsq-scheduler")  # a bad LOOPSQ_TRACING is bad input here (exit 2)
    app = get_app()  # no fail-fast ping: an unreachable Redis is waited for; a configuration error ends it (3)
    url = app.redis_url  # before any log line
    _logging("scheduler")
    stop = threading.Event()
    stop_on_signals(stop, say=lambda: logging.getLogger("loopsq.scheduler").info("stop signal received"))
    run_scheduler(url, stop, poll_s=max(1, poll_ms) / 1000.0, migrate=not no_migrate, keys=app.keys)


@click.command("worker")
@click.option("--burst", is_flag=True, help="Exit once the queue is empty.")
@click.option("--grace", metavar="DURATION",
              help="On SIGTERM, how long the current run may finish before it is cancelled and retried elsewhere "
                   "[the kill timeout (LOOPSQ_KILL_TIMEOUT, 30s on Heroku, else honcho's 5s) minus 2.5s].")
@click.option("--concurrency", metavar="N",
              help="How many runs this worker holds at once, each a child process it supervises "
                   f"(LOOPSQ_WORKER_CONCURRENCY) [{DEFAULT_CONCURRENCY}].")
@click.option("--label", "labels", multiple=True, metavar="LABEL",
              help="A label runs may require of this worker, e.g. gpu or repo:web (repeat; LOOPSQ_WORKER_LABELS, "
                   "comma-separated). host:<name> and provider:<cli> for each agent CLI on PATH are added.")
def worker(burst: bool, grace: str | None, concurrency: str | None, labels: tuple[str, ...]) -> None:
    """Run a worker: execute runs from loopsq's queues (scale horizontally)."""
    import os

    from loopsq.cli.options import duration_flag
    from loopsq.domain.durations import describe_ms
    from loopsq.engine.worker_process import run_worker
    from loopsq.ops import shutdown
    from loopsq.ops.fleet_config import worker_concurrency, worker_declared_labels

    slots = worker_concurrency(concurrency, os.environ)
    tracing.configure("loopsq-worker")  # a bad LOOPSQ_TRACING is bad input here (exit 2)
    declared = worker_declared_labels(labels, os.environ)

    if grace is not None:
        grace_ms, why = duration_flag("--grace", grace) or 0, "--grace"
    else:
        kill_ms, source = shutdown.kill_timeout_ms(os.environ)
        grace_ms, why = shutdown.grace_for(kill_ms), f"kill timeout {describe_ms(kill_ms)}: {source}"

    app = get_app()  # as the scheduler: Redis is waited for, a configuration error ends it (exit status 3)
    url = app.redis_url  # resolved first: with no Redis configured, the one error line comes before anything
    _logging("worker")
    run_worker(url, burst=burst, grace_s=grace_ms / 1000.0, concurrency=slots, labels=declared, keys=app.keys,
               announce=f"{slots} slot(s); on SIGTERM the current runs get {describe_ms(grace_ms)} to finish "
                        f"({why})")
