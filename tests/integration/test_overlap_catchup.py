"""Overlap and catch-up policies with real processes (issue #12, scenarios 4 and 5)."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import from_iso, to_iso
from tests.integration.processes import Cluster, gaps, open_cluster, slots_ms
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


# -- overlap --------------------------------------------------------------------------------------------------

def _slow_cmd(cluster: Cluster, name: str) -> str:
    """Sleeps ~2.5 s, recording ``start|end <slot> <epoch seconds>`` around the sleep."""
    ledger = cluster.ledger_dir / f"ledger-{name}"
    mark = 'echo "{0} $LOOPS_SCHEDULED_FOR $(date +%s.%N)" >> ' + str(ledger)
    return f"{mark.format('start')}; sleep 2.5; {mark.format('end')}"


def _intervals(cluster: Cluster, name: str) -> dict[str, tuple[float, float | None]]:
    """Slot -> (start, end or None) of each execution in the ledger."""
    out: dict[str, tuple[float, float | None]] = {}
    for event, slot, at in cluster.ledger(name):
        if event == "start":
            assert slot not in out, f"slot {slot} started twice"
            out[slot] = (float(at), None)
        else:
            out[slot] = (out[slot][0], float(at))
    return out


def _overlapping(intervals: dict[str, tuple[float, float | None]]) -> list[tuple[str, str]]:
    spans = sorted((start, end if end is not None else float("inf"), slot) for slot, (start, end) in intervals.items())
    return [(a[2], b[2]) for a, b in itertools.pairwise(spans) if b[0] < a[1]]


def _run_overlap(cluster: Cluster, policy: str, until: object, what: str, *options: str) -> list[LoopRun]:
    cluster.create("slow", _slow_cmd(cluster, "slow"), "--every", "1s", "--overlap", policy, *options)
    cluster.start_all(schedulers=1, workers=2)
    cluster.wait_until(until, 20, what)  # type: ignore[arg-type]
    cluster.stop_all()
    return cluster.ran("slow")  # (less a slot missed while the processes started)


@pytest.mark.timeout(60)
def test_overlap_skip_records_skipped_slots_and_never_runs_two_at_once(cluster: Cluster) -> None:
    def enough() -> bool:
        runs = cluster.runs("slow")
        return sum(r.status == "succeeded" for r in runs) >= 2 and sum(r.status == "skipped" for r in runs) >= 2

    runs = _run_overlap(cluster, "skip", enough, "two runs and two skips")
    skipped = [r for r in runs if r.status == "skipped"]
    assert skipped and all(r.error == "previous run still active" for r in skipped), [r.to_dict() for r in skipped]
    assert all(r.pid is None and r.started_at is None for r in skipped)
    executed = _intervals(cluster, "slow")
    assert set(executed) == {r.scheduled_for for r in runs if r.status != "skipped"}
    assert not _overlapping(executed), executed
    assert {r.status for r in runs} == {"succeeded", "skipped"}, [r.to_dict() for r in runs]


@pytest.mark.timeout(60)
def test_overlap_allow_runs_slots_concurrently(cluster: Cluster) -> None:
    def overlapped() -> bool:
        return bool(_overlapping(_intervals(cluster, "slow")))

    runs = _run_overlap(cluster, "allow", overlapped, "two runs of the loop at once")
    assert all(r.status == "succeeded" for r in runs), [r.to_dict() for r in runs]
    executed = _intervals(cluster, "slow")
    assert set(executed) == {r.scheduled_for for r in runs}
    assert all(end is not None for _, end in executed.values()), executed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("attempts", [(), ("--attempts", "2", "--retry-delay", "200ms")], ids=["once", "retries"])
def test_overlap_replace_fails_the_running_run_and_starts_the_new_slot(
    cluster: Cluster, attempts: tuple[str, ...]
) -> None:
    def replaced_twice() -> bool:
        return sum(bool(r.error and r.error.startswith("replaced")) for r in cluster.runs("slow")) >= 2

    runs = _run_overlap(cluster, "replace", replaced_twice, "two replaced runs", *attempts)
    assert len(runs) >= 3, [r.to_dict() for r in runs]
    for earlier, later in itertools.pairwise(runs):
        assert (earlier.status, earlier.error) == ("failed", f"replaced by slot {later.scheduled_for}"), (
            earlier.to_dict(), later.to_dict())
    # A replaced slot is settled, never retried (attempts or not): its retry would replace the newer run.
    assert all(r.attempt == 1 for r in runs), [r.to_dict() for r in runs]
    assert runs[-1].status in ("failed", "succeeded")
    executed = _intervals(cluster, "slow")
    assert set(executed) == {r.scheduled_for for r in runs}
    # A replaced run was killed: it never reached its end mark, and it ended before its successor did.
    for earlier, later in itertools.pairwise(runs):
        assert executed[earlier.scheduled_for][1] is None
        assert from_iso(str(earlier.finished_at)) < from_iso(str(later.finished_at))


# -- catch-up -------------------------------------------------------------------------------------------------

POLICIES = ("none", "latest", "all")


@dataclass(frozen=True)
class Downtime:
    """What happened to each policy's loop around 10 s of scheduler downtime."""

    cluster: Cluster
    last_before: dict[str, int]  # the last slot (ms) executed before the scheduler stopped
    restarted_at: int  # when the new scheduler was launched (ms)
    ledgers: dict[str, list[str]]  # slots in execution order
    runs: dict[str, list[LoopRun]]


@pytest.fixture(scope="module")
def downtime(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Downtime]:
    """Three loops at 1 s (catch-up none, latest, all) and two workers that stay up; the only scheduler is
    stopped for 10 s after a few slots, then started again."""
    with contextlib.contextmanager(open_cluster)(redis_server.url, tmp_path_factory.mktemp("downtime")) as cluster:
        for policy in POLICIES:
            cluster.create(policy, cluster.ledger_cmd(), "--every", "1s", "--catch-up", policy)
        scheduler = cluster.start_all(schedulers=1, workers=2)[0]
        cluster.wait_until(lambda c=cluster: all(len(c.ledger(p)) >= 3 for p in POLICIES), 20, "three slots each")
        scheduler.terminate()
        time.sleep(1.0)  # a fire job moved just before the stop finishes (its slot counts as before the stop)
        last_before = {p: max(slots_ms([e[0] for e in cluster.ledger(p)])) for p in POLICIES}
        time.sleep(9.0)
        restarted_at = int(time.time() * 1000)
        cluster.start("scheduler")

        def caught_up(c: Cluster = cluster) -> bool:
            after = [[s for s in slots_ms([e[0] for e in c.ledger(p)]) if s > restarted_at] for p in POLICIES]
            return all(len(a) >= 3 for a in after)

        cluster.wait_until(caught_up, 30, "three on-time slots per loop after the restart")
        cluster.stop_all()
        ledgers = {p: [e[0] for e in cluster.ledger(p)] for p in POLICIES}
        yield Downtime(cluster, last_before, restarted_at, ledgers, {p: cluster.runs(p) for p in POLICIES})


def _after_stop(d: Downtime, policy: str) -> list[int]:
    return [s for s in slots_ms(d.ledgers[policy]) if s > d.last_before[policy]]


def _check_common(d: Downtime, policy: str) -> None:
    slots = d.ledgers[policy]
    assert len(set(slots)) == len(slots), f"a slot ran twice: {slots}"
    assert slots == sorted(slots), f"slots ran out of order: {slots}"
    runs = d.runs[policy]
    assert all(r.attempt == 1 for r in runs), [r.to_dict() for r in runs]
    assert {r.scheduled_for for r in runs if r.status == "succeeded"} == set(slots)
    # Every slot since the last one before the downtime has exactly one record: its run, or its place in the one
    # missed row that stands for the slots catch-up gave up (none for "all", which runs them).
    # (A slot a loaded machine fired late after the restart may add a streak of its own.)
    missed_rows = [r for r in runs if r.status == "missed" and from_iso_ms(r.scheduled_for) > d.last_before[policy]]
    assert (not missed_rows) if policy == "all" else missed_rows, [r.to_dict() for r in missed_rows]
    covered = sorted(s for s in slots_ms([r.scheduled_for for r in runs if r.status != "missed"])
                     if s > d.last_before[policy])
    if missed_rows:
        assert (missed_rows[0].missed_kind, missed_rows[0].error) == ("no_scheduler", "no scheduler ran")
    for row in missed_rows:
        first = slots_ms([row.scheduled_for])[0]
        covered += [first + 1000 * i for i in range(int(row.missed_count or 0))]
        assert slots_ms([str(row.missed_last)])[0] == covered[-1]
    expected = list(range(d.last_before[policy] + 1000, max(covered) + 1, 1000))
    assert sorted(covered) == expected, [to_iso_ms(s) for s in sorted(set(expected) ^ set(covered))]
    # Any other run is an overlap skip: a slot that comes due while the catch-up backlog's last run is still going
    # (the second worker fires it on time), or, on a loaded machine, while any run takes over a second.
    others = [r for r in runs if r.status not in ("succeeded", "missed")]
    assert all((r.status, r.error) == ("skipped", "previous run still active") for r in others), [
        r.to_dict() for r in others]
    # Once caught up, the loop is back on its 1 s phase: every later slot has its run.
    on_time = sorted(s for s in slots_ms([r.scheduled_for for r in runs if r.status != "missed"])
                     if s > d.restarted_at)
    assert all(b - a == 1000 for a, b in itertools.pairwise(on_time)), [to_iso_ms(s) for s in on_time]


def from_iso_ms(iso: str) -> int:
    return slots_ms([iso])[0]


def to_iso_ms(ms: int) -> str:
    from datetime import UTC, datetime

    return to_iso(datetime.fromtimestamp(ms / 1000, UTC))


@pytest.mark.timeout(120)
def test_catch_up_none_runs_only_the_first_missed_slot_after_downtime(downtime: Downtime) -> None:
    _check_common(downtime, "none")
    after = _after_stop(downtime, "none")
    missed = [s for s in after if s <= downtime.restarted_at]
    assert missed == [downtime.last_before["none"] + 1000], [to_iso_ms(s) for s in after]
    assert after[1] > downtime.restarted_at


@pytest.mark.timeout(120)
def test_catch_up_latest_runs_only_the_latest_missed_slot_after_downtime(downtime: Downtime) -> None:
    _check_common(downtime, "latest")
    after = _after_stop(downtime, "latest")
    first = after[0]
    # The latest slot not after the moment the restarted scheduler fired it: within a second of the restart.
    assert downtime.restarted_at - 1000 < first, [to_iso_ms(s) for s in after]
    assert first - downtime.last_before["latest"] >= 9000
    assert (first - downtime.last_before["latest"]) % 1000 == 0


@pytest.mark.timeout(120)
def test_catch_up_all_runs_every_missed_slot_in_order_after_downtime(downtime: Downtime) -> None:
    _check_common(downtime, "all")
    every_row = [r.scheduled_for for r in downtime.runs["all"]]
    assert not gaps(every_row, 1000), gaps(every_row, 1000)
    # Every slot missed while no scheduler ran was executed (none skipped), in order.
    first_missed = downtime.last_before["all"] + 1000
    missed = [s for s in slots_ms(every_row) if first_missed <= s <= downtime.restarted_at]
    executed = slots_ms(downtime.ledgers["all"])
    assert len(missed) >= 9 and set(missed) <= set(executed), [to_iso_ms(s) for s in set(missed) - set(executed)]
    runs = downtime.runs["all"]
    by_start = [r.scheduled_for for r in sorted(runs, key=lambda r: str(r.started_at))]
    assert by_start == sorted(by_start)


@pytest.mark.timeout(120)
def test_catch_up_all_with_a_limit_runs_exactly_the_oldest_missed_slots_then_the_first_after_now(
        cluster: Cluster) -> None:
    """Issue 18 point 7: four (or more) 2 s slots missed while the only scheduler was down, a limit of 3: the
    oldest 3 run, the rest are skipped, and the loop goes on from the first slot after the catch-up."""
    every = 2000
    cluster.create("cut", cluster.ledger_cmd(), "--every", "2s", "--catch-up", "all", "--catch-up-limit", "3")
    scheduler = cluster.start_all(schedulers=1, workers=2)[0]
    cluster.wait_until(lambda: len(cluster.ledger("cut")) >= 2, 20, "two slots before the downtime")
    scheduler.terminate()
    time.sleep(1.0)  # a fire job moved just before the stop finishes (its slot counts as before the stop)
    last_before = max(slots_ms([e[0] for e in cluster.ledger("cut")]))
    # The downtime is measured from the last slot that ran, so that at least four slots are missed.
    while int(time.time() * 1000) < last_before + 4 * every + every // 2:
        time.sleep(0.1)
    restarted_at = int(time.time() * 1000)
    cluster.start("scheduler")

    def after_restart() -> list[int]:
        return [s for s in slots_ms([e[0] for e in cluster.ledger("cut")]) if s > restarted_at]

    cluster.wait_until(lambda: len(after_restart()) >= 2, 30, "two slots after the catch-up")
    cluster.stop_all()
    executed = slots_ms([e[0] for e in cluster.ledger("cut")])
    missed = [s for s in executed if last_before < s <= restarted_at]
    assert missed == [last_before + every * i for i in (1, 2, 3)], [to_iso_ms(s) for s in executed]
    assert len(executed) == len(set(executed))
    # No run for the missed slots past the limit: they were given up by moving the loop, and one missed row stands
    # for them, from the first past the limit on.
    rows = slots_ms([r.scheduled_for for r in cluster.runs("cut") if r.status != "missed"])
    assert [s for s in rows if last_before + 3 * every < s <= restarted_at] == []
    (gave_up,) = [r for r in cluster.runs("cut") if r.status == "missed"]
    assert slots_ms([gave_up.scheduled_for]) == [last_before + 4 * every]
    assert gave_up.missed_count == (slots_ms([str(gave_up.missed_last)])[0] - last_before) // every - 3
    following = min(s for s in executed if s > last_before + 3 * every)
    assert following > restarted_at and (following - last_before) % every == 0
