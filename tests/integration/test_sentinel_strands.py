"""Sentinel failovers strand nothing (issue 27, point 2): several ``SENTINEL FAILOVER`` and one SIGKILL of the
master in the middle of a workload of real scheduler and worker processes that reach Redis only through the
sentinels; afterwards every loop runs again soon, no slot ran twice, and every slot ran or is recorded missed.

Across an asynchronous failover the old master acknowledges writes for seconds after the replica was promoted, and
they are discarded: whatever pair of writes one process makes on the old master and another on the new one, the
new master must never be left with a loop that nothing will wake.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from loopsq.domain import timeutil
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import from_iso
from loopsq.engine import recovery, timers
from loopsq.state import durability
from loopsq.state.connection import connect
from loopsq.state.runs import Claim, Owner, RunStore
from loopsq.system.procs import hostname
from tests.integration.processes import KEYS, Cluster, open_cluster
from tests.redis_server import RedisServer, SentinelGroup

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

LOOPS = 10
EVERY_MS = 1000
#: After the last failover settled, how long every loop has to run a later slot: a run a lost reply left running
#: under its live worker is abandoned ``recovery.UNHELD_GRACE_MS`` after its claim (30 s), then a margin.
RUN_AGAIN_S = 45.0


@pytest.fixture(scope="module")
def group() -> Iterator[SentinelGroup]:
    g = SentinelGroup().start()
    try:
        yield g
    finally:
        g.cleanup()


@pytest.fixture
def cluster(group: SentinelGroup, tmp_path: Path) -> Iterator[Cluster]:
    group.wait_settled()
    yield from open_cluster(group.url, tmp_path)


def stuck(cluster: Cluster, name: str) -> str:
    """What holds a loop that did not run again: its timer, its job's hash, where the job is."""
    loop = cluster.loop(name)
    job_id = cluster.client.get(KEYS.timer(loop["id"])) or ""
    fields = ("status", "worker_name", "loopsq_taken")
    job = dict(zip(fields, cluster.client.hmget(timers.job_key(job_id), fields), strict=True)) if job_id else {}
    active = cluster.client.smembers(KEYS.loop_active(loop["id"]))
    runs = {i: (r.status, r.scheduled_for, r.worker_id) if (r := cluster.run(i)) else None for i in active}
    queue = timers.queue_key(timers.QUEUE_NAME)
    return (f"{name}: nextRunAt={loop.get('nextRunAt')} timer={job_id} "
            f"scheduled={cluster.client.zscore(timers.scheduled_key(), job_id) if job_id else None} "
            f"status={job.get('status')} worker={job.get('worker_name')} taken={job.get('loopsq_taken')} "
            f"in_queue={cluster.client.lpos(queue, job_id) if job_id else None} "
            f"in_intermediate={cluster.client.lpos(queue + ':intermediate', job_id) if job_id else None} "
            f"active={runs}")


def accounted(cluster: Cluster, name: str) -> list[tuple[int, int]]:
    """The slots (epoch ms) each record of the loop stands for: a run's own, a missed row's streak."""
    spans = []
    for run in cluster.runs(name):
        first = int(from_iso(run.scheduled_for).timestamp() * 1000)
        last = int(from_iso(run.missed_last).timestamp() * 1000) if run.status == "missed" and run.missed_last \
            else first
        spans.append((first, last))
    return spans


def test_failovers_and_a_master_kill_strand_no_loop_and_run_no_slot_twice(cluster: Cluster,
                                                                          group: SentinelGroup) -> None:
    procs = cluster.start_all(schedulers=2, workers=2)
    names = [f"sn-{i:02d}" for i in range(LOOPS)]
    for name in names:
        cluster.create_fast(name, cluster.ledger_cmd(), EVERY_MS)
    cluster.wait_until(lambda: all(cluster.ledger(n) for n in names), 60, "every loop to run")

    # Between two failovers, each process must have seen the new master's replica attached (it re-reads ``INFO
    # replication`` every ``REFRESH_S``): until then its claims are, as documented, as durable as the master alone.
    between = 3 * durability.REFRESH_S
    group.failover(settled=True)
    time.sleep(between)
    group.kill_master()
    time.sleep(between)
    group.failover(settled=True)
    settled_at = time.time()

    def ran_since(name: str) -> bool:
        return any(from_iso(slot).timestamp() > settled_at for slot, *_ in cluster.ledger(name))

    deadline = time.monotonic() + RUN_AGAIN_S
    while not all(ran_since(n) for n in names) and time.monotonic() < deadline:
        time.sleep(0.2)
    stranded = [stuck(cluster, n) for n in names if not ran_since(n)]
    exited = [p.name for p in procs if not p.alive()]
    cluster.stop_all()
    assert stranded == [], "loops stranded by the failovers:\n" + "\n".join(stranded) + "\n" + cluster.logs()
    assert exited == [], f"processes exited during the failovers: {exited}\n{cluster.logs()}"

    for name in names:
        executed = [slot for slot, *_ in cluster.ledger(name)]
        doubled = {slot: n for slot, n in Counter(executed).items() if n > 1}
        assert doubled == {}, f"{name}: slots executed twice: {doubled}\n{cluster.logs()}"
        runs = {r.id: r for r in cluster.runs(name)}
        unrecorded = [(slot, run_id, r.status if (r := runs.get(run_id)) else None)
                      for slot, run_id in cluster.ledger(name)
                      if (r := runs.get(run_id)) is None or r.status != "succeeded"]
        assert unrecorded == [], f"{name}: executed, not recorded succeeded: {unrecorded}\n{cluster.logs()}"
        # Every slot from the first recorded one to the last is a run, a skip, or inside a missed streak.
        spans = sorted(accounted(cluster, name))
        first, last = spans[0][0], max(end for _, end in spans)
        covered = set()
        for start, end in spans:
            covered.update(range(start, end + 1, EVERY_MS))
        holes = [ms for ms in range(first, last + 1, EVERY_MS) if ms not in covered]
        assert holes == [], f"{name}: {len(holes)} slot(s) with no record, e.g. {holes[:3]}\n{cluster.logs()}"


def test_noticing_a_failover_closes_no_connection_another_thread_is_reading_from(group: SentinelGroup) -> None:
    """``durability.failed_over`` switches the pool to the new master without closing the connections other
    threads are using: closing one under a thread that reads its reply lost a claim's reply (the loop stranded)."""
    group.wait_settled()
    client = connect(group.url)
    client.delete("strand:list")
    outcome: list[object] = []

    def blocked_read() -> None:
        try:
            outcome.append(client.blpop(["strand:list"], timeout=2))
        except Exception as exc:  # what the reader met is the point
            outcome.append(exc)

    reader = threading.Thread(target=blocked_read)
    reader.start()
    deadline = time.monotonic() + 10
    while not client.connection_pool._in_use_connections:  # (the reader holds its connection)
        assert time.monotonic() < deadline, "the reader never took a connection"
        time.sleep(0.01)
    time.sleep(0.2)  # blocked in BLPOP now
    # As seen by a writer whose claim went to another server than the one the sentinels name.
    assert durability.failed_over(client, ("127.0.0.1", 1)) is True
    client.rpush("strand:list", "x")
    reader.join(10)
    assert outcome == [("strand:list", "x")]



def test_a_claim_no_replica_acknowledged_counts_as_made_when_the_new_master_has_it(group: SentinelGroup) -> None:
    """A claim the replica received just before its promotion, its ``WAIT`` come back with no acknowledgement, is
    on the new master with the loop moved past the slots its fire gave up: refused, its run was left to recovery
    and those slots had no record at all (the chaos bench's slots without a record). One the new master lacks (the
    old master's writes are discarded) or holds for another claimer is not made."""
    group.wait_settled()
    client = connect(group.url)
    old = group.master_port()
    key, token = "strand:claim", "worker:host:1:run1:1:nonce"
    server, _ = durability.pipelined(client, lambda pipe: pipe.set(key, token))
    assert server[1] == old
    replica = next(s for s in group.servers if s.port != old).client()
    deadline = time.monotonic() + 10
    while replica.get(key) != token:  # replicated before the promotion (its acknowledgement is what got lost)
        assert time.monotonic() < deadline, "the claim never reached the replica"
        time.sleep(0.01)
    group.failover(settled=False)
    # As the claimer sees it: one replica wanted and asked for, none acknowledged, the sentinels name another master.
    assert durability.settle(client, server, 1, 1, 0, claim=key, token=token) is True
    client.set(key, "worker:other:2:run2:1:nonce")  # (on the new master: the pool follows the sentinels now)
    assert durability.settle(client, server, 1, 1, 0, claim=key, token=token) is False
    client.delete(key)
    assert durability.settle(client, server, 1, 1, 0, claim=key, token=token) is False
    group.wait_settled()


@pytest.fixture
def plain_cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def test_a_run_claimed_under_a_live_worker_that_does_not_run_it_is_abandoned_and_its_loop_goes_on(
        plain_cluster: Cluster) -> None:
    """What a lost reply or a discarded finalize leaves: a run recorded running under a live worker, its lease 30
    minutes long, that the worker does not hold. The worker abandons it once its claim is ``UNHELD_GRACE_MS``
    old, instead of leaving its loop to skip every slot until the lease expires."""
    cluster = plain_cluster
    worker = cluster.start("worker")
    cluster.create_fast("orphan", cluster.ledger_cmd(), 3_600_000)
    loop = cluster.loop("orphan")
    owner = Owner(cluster.worker_id(worker), hostname(), worker.pid)
    claimed_at = timeutil.now() - timedelta(milliseconds=recovery.UNHELD_GRACE_MS + 5_000)
    claim = RunStore(cluster.client, KEYS).claim(loop["id"], from_iso(loop["nextRunAt"]), owner, claimed_at,
                                                 source="scheduled")
    assert isinstance(claim, Claim)
    run_id = claim.run.id

    def settled() -> LoopRun | None:
        run = cluster.run(run_id)
        return run if run is not None and run.status != "running" else None

    run = cluster.wait_until(settled, 20, "the unheld run to be abandoned")
    assert (run.status, run.error) == (
        "abandoned", f"claimed by worker {owner.worker_id}, which does not run it (a reply or a write lost, "
                     "as in a failover)")
    assert cluster.client.smembers(KEYS.loop_active(loop["id"])) == set()
    assert f"run {run_id} abandoned loop=orphan slot={loop['nextRunAt']} attempt=1: claimed by worker " \
        in worker.text()
