"""Manual runs with real processes: each ``run-now`` source on a worker and in the CLI's own process, and triggers
whose idempotency key makes a repeat start nothing (issue #12, scenarios 6 and 7)."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import rq

from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import from_iso
from loopsq.sdk import LoopsClient
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

LINE = re.compile(r"^(?P<id>\S+) (?P<status>\S+) source=(?P<source>\S+) slot=(?P<slot>\S+)\n$")


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


@pytest.fixture(params=["worker", "local"])
def mode(request: pytest.FixtureRequest, cluster: Cluster) -> str:
    """``run-now`` on a worker (one is started; no scheduler runs) or with ``--local``."""
    if request.param == "worker":
        cluster.start("worker")
    return str(request.param)


def run_now(cluster: Cluster, mode: str, name: str) -> tuple[subprocess.CompletedProcess[str], LoopRun]:
    """``loopsq run-now NAME [--local]``: the finished process, and the run it printed as stored in Redis."""
    done = cluster.cli("run-now", name, *(["--local"] if mode == "local" else []), check=False, timeout=30)
    match = LINE.match(done.stdout)
    assert match, f"unexpected output {done.stdout!r} (stderr {done.stderr!r})\n{cluster.logs()}"
    run = cluster.run(match["id"])
    assert run is not None, match["id"]
    assert done.stdout == f"{run.id} {run.status} source={run.source} slot={run.scheduled_for}\n"
    return done, run


def wait_due(cluster: Cluster, name: str) -> str:
    """Wait until the loop's next slot (or pending retry) is past; returns that slot."""
    loop = cluster.loop(name)
    slot = loop.get("retryScheduledFor") or loop["nextRunAt"]
    due_at = from_iso(loop.get("retryAt") or slot).timestamp()
    time.sleep(max(0.0, due_at - time.time() + 0.05))
    return str(slot)


@pytest.mark.timeout(60)
def test_run_now_of_a_loop_that_is_not_due_runs_an_ad_hoc_slot_and_leaves_the_loop_alone(
    cluster: Cluster, mode: str
) -> None:
    cluster.create("hourly", cluster.ledger_cmd(), "--every", "1h")
    cluster.create("broken", "exit 3", "--every", "1h")
    before = cluster.loop("hourly")
    started = time.time()
    done, run = run_now(cluster, mode, "hourly")
    assert (done.returncode, run.status, run.source, run.attempt) == (0, "succeeded", "ad_hoc", 1), done.stderr
    assert started - 1 <= from_iso(run.scheduled_for).timestamp() <= time.time()
    assert cluster.ledger("hourly") == [(run.scheduled_for, run.id)]
    after = cluster.loop("hourly")
    assert (after["nextRunAt"], after.get("retryScheduledFor")) == (before["nextRunAt"], None)

    failed, broken = run_now(cluster, mode, "broken")
    assert (failed.returncode, broken.status, broken.source) == (1, "failed", "ad_hoc")
    assert broken.exit_code == 3


@pytest.mark.timeout(60)
def test_run_now_of_a_loop_past_its_slot_runs_that_slot_and_advances_the_loop(cluster: Cluster, mode: str) -> None:
    # Catch-up none: the due slot is exactly nextRunAt, however long the CLI takes to start.
    cluster.create("due", cluster.ledger_cmd(), "--every", "1s", "--catch-up", "none")
    slot = wait_due(cluster, "due")
    done, run = run_now(cluster, mode, "due")
    assert (done.returncode, run.status, run.source, run.scheduled_for) == (0, "succeeded", "due_slot", slot)
    assert cluster.ledger("due") == [(slot, run.id)]
    assert from_iso(cluster.loop("due")["nextRunAt"]) > from_iso(slot)


@pytest.mark.timeout(60)
def test_run_now_of_a_failed_slot_whose_retry_is_due_runs_the_retry(cluster: Cluster, mode: str) -> None:
    flag = cluster.tmp / "second-attempt"
    # The first attempt fails at once; the second takes a second (long enough for a waiting CLI to poll it).
    cmd = f'{cluster.ledger_cmd()}; test -e {flag} || {{ touch {flag}; exit 1; }}; sleep 1'
    cluster.create("flaky", cmd, "--every", "1s", "--attempts", "2", "--retry-delay", "200ms", "--catch-up", "none")
    slot = wait_due(cluster, "flaky")
    first, failed = run_now(cluster, mode, "flaky")
    assert (first.returncode, failed.status, failed.source, failed.attempt) == (1, "failed", "due_slot", 1)
    assert cluster.loop("flaky")["retryScheduledFor"] == slot
    assert wait_due(cluster, "flaky") == slot
    done, retried = run_now(cluster, mode, "flaky")
    assert (done.returncode, retried.status, retried.source) == (0, "succeeded", "retry_slot")
    assert (retried.id, retried.scheduled_for, retried.attempt) == (failed.id, slot, 2)
    assert cluster.ledger("flaky") == [(slot, failed.id), (slot, failed.id)]
    assert cluster.loop("flaky").get("retryScheduledFor") is None
    # The row is the retry's now; the first attempt is kept on it and shown under it.
    (row, attempt) = cluster.cli("runs", "flaky").stdout.splitlines()
    assert row == f"{failed.id}  succeeded   attempt=2  slot={slot}  flaky"
    assert attempt == (f"  attempt 1 failed  exit=1  finished={failed.finished_at}  "
                       "process exited with code 1")


# -- triggers ---------------------------------------------------------------------------------------------------

def _executed(cluster: Cluster, name: str) -> list[str]:
    return [line[1] for line in cluster.ledger(name)]


@pytest.mark.timeout(60)
def test_a_repeated_trigger_key_returns_the_same_run_and_executes_it_once(cluster: Cluster) -> None:
    cluster.create("hook", cluster.ledger_cmd(), "--every", "1h")
    cluster.start("scheduler")
    cluster.start("worker")
    client = LoopsClient(cluster.url)
    try:
        first = client.trigger("hook", idempotency_key="k")
        assert client.trigger("hook", idempotency_key="k") == first
        assert cluster.cli("trigger", "hook", "--key", "k").stdout == f"{first} duplicate\n"
        cluster.wait_until(lambda: (r := cluster.run(first)) is not None and r.terminal, 15, "the triggered run")
        other = client.trigger("hook", idempotency_key="k-other")
        assert other != first
        cluster.wait_until(lambda: (r := cluster.run(other)) is not None and r.terminal, 15, "the second key's run")
        assert client.trigger("hook", idempotency_key="k") == first
    finally:
        client.close()
    time.sleep(1.5)  # room for a duplicate to show up, were one started
    assert sorted(_executed(cluster, "hook")) == sorted([first, other])
    runs = cluster.runs("hook")
    assert {(r.id, r.status, r.source, r.idempotency_key) for r in runs} == {
        (first, "succeeded", "trigger", "k"), (other, "succeeded", "trigger", "k-other")}


@pytest.mark.timeout(60)
def test_a_trigger_enqueued_through_rq_by_dotted_path_runs_once_per_key(cluster: Cluster) -> None:
    cluster.create("hook", cluster.ledger_cmd(), "--every", "1h")
    cluster.start("worker")
    queue = rq.Queue("loopsq", connection=redis.Redis.from_url(cluster.url))
    jobs = [queue.enqueue("worker.jobs.trigger", "hook", idempotency_key="k2") for _ in range(2)]

    def results() -> list[str] | None:
        for job in jobs:
            job.refresh()
        if any(job.get_status() == "failed" for job in jobs):
            raise AssertionError(f"a trigger job failed: {[job.exc_info for job in jobs]}\n{cluster.logs()}")
        return [str(job.return_value()) for job in jobs] if all(job.is_finished for job in jobs) else None

    ids = cluster.wait_until(results, 15, "both trigger jobs to finish")
    assert ids[0] == ids[1], ids
    time.sleep(1.0)
    assert _executed(cluster, "hook") == [ids[0]]
    run = cluster.run(ids[0])
    assert run is not None and (run.status, run.source, run.idempotency_key) == ("succeeded", "trigger", "k2")


@pytest.mark.timeout(60)
def test_a_plain_rq_worker_runs_triggers_and_timers_under_its_own_name(cluster: Cluster) -> None:
    cluster.create("hook", cluster.ledger_cmd(), "--every", "1s")
    cluster.start("scheduler")
    cluster.start_rq_worker("plain-rq")
    queue = rq.Queue("loopsq", connection=redis.Redis.from_url(cluster.url))
    job = queue.enqueue("worker.jobs.trigger", "hook", idempotency_key="k3")
    cluster.wait_until(lambda: job.refresh() or job.is_finished or job.is_failed, 15, "the trigger job")
    assert job.is_finished, f"{job.exc_info}\n{cluster.logs()}"
    cluster.wait_until(lambda: sum(r.source == "scheduled" and r.terminal for r in cluster.runs("hook")) >= 2, 15,
                       "timer slots on the plain rq worker")
    cluster.stop_all()
    # Slots that came due while the scheduler started (a second or more on a loaded machine) are recorded missed
    # by catch-up latest: they ran nowhere. Every run that did run ran on the plain worker.
    runs = [r for r in cluster.runs("hook") if r.status != "missed"]
    assert {r.worker_id for r in runs} == {"plain-rq"}, [r.to_dict() for r in runs]
    assert [r.id for r in runs if r.source == "trigger"] == [job.return_value()]
    assert all(r.status == "succeeded" for r in runs)
