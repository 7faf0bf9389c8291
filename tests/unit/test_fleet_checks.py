"""What ``doctor`` and ``status`` say about the fleet, from snapshots built by hand: the exact lines, and which
states fail, warn or pass."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from loopsq.cli.health_cmds import fleet_lines
from loopsq.engine.fleet import FleetQueue, FleetSnapshot, FleetTimers, FleetWorker
from loopsq.errors import ValidationError
from loopsq.ops.doctor import fleet_checks, queue_age_warn_ms

AT = datetime(2026, 12, 1, tzinfo=UTC)
GPU = FleetWorker("w-gpu", "h1", ("gpu", "host:h1"), 3, 1, ("loopsq+gpu", "loopsq"), None)
PLAIN = FleetWorker("w-plain", "h2", ("host:h2",), 4, 4, ("loopsq",), None)
NO_TIMERS = FleetTimers(armed=2, overdue=0, oldest_late_ms=None)


def queue(name: str, labels: tuple[str, ...], depth: int, age_ms: int | None, served: tuple[str, ...],
          missing: tuple[str, ...] = ()) -> FleetQueue:
    return FleetQueue(name, labels, depth, age_ms, served, missing)


def lines(snapshot: FleetSnapshot, needed: dict[str, list[str]] | None = None, warn_ms: int = 60_000) -> list[str]:
    return [c.line() for c in fleet_checks(snapshot, needed or {}, warn_ms)]


def test_a_queue_with_waiting_runs_no_live_worker_can_take_fails_naming_the_labels() -> None:
    snap = FleetSnapshot(AT, (GPU, PLAIN), (
        queue("loopsq", (), 0, None, ("w-gpu", "w-plain")),
        queue("loopsq+nvme", ("nvme",), 3, 42_300, (), ("nvme",)),
    ), NO_TIMERS)
    assert lines(snap) == [
        "ok   queue:loopsq           0 run(s) waiting (5 of 7 slots busy on the 2 live worker(s) serving it)",
        "fail queue:loopsq+nvme      no live worker has labels nvme (3 run(s) waiting, oldest 42s)",
        "ok   timers                 2 timer(s) armed, none overdue",
    ]


def test_an_active_loops_requirement_set_no_live_worker_satisfies_fails_even_with_nothing_waiting() -> None:
    snap = FleetSnapshot(AT, (GPU,), (queue("loopsq+gpu+nvme", ("gpu", "nvme"), 0, None, (), ("nvme",)),),
                         NO_TIMERS)
    needed = {"loopsq+gpu+nvme": ["train", "eval", "tune", "bench"]}
    assert lines(snap, needed)[0] == (
        "fail queue:loopsq+gpu+nvme  no live worker has labels nvme "
        "(needed by active loop(s): train, eval, tune and 1 more)")


def test_waiting_runs_and_active_loops_are_both_named() -> None:
    snap = FleetSnapshot(AT, (PLAIN,), (queue("loopsq+gpu", ("gpu",), 1, 5_000, (), ("gpu",)),), NO_TIMERS)
    assert lines(snap, {"loopsq+gpu": ["train"]})[0] == (
        "fail queue:loopsq+gpu       no live worker has labels gpu "
        "(1 run(s) waiting, oldest 5s; needed by active loop(s): train)")


def test_with_no_live_worker_at_all_waiting_runs_fail_and_an_idle_loop_only_warns() -> None:
    snap = FleetSnapshot(AT, (), (
        queue("loopsq", (), 2, 7_000, ()),
        queue("loopsq+gpu", ("gpu",), 0, None, (), ("gpu",)),
    ), NO_TIMERS)
    assert lines(snap, {"loopsq+gpu": ["train"]})[:2] == [
        "fail queue:loopsq           no live worker is running (2 run(s) waiting, oldest 7s)",
        "warn queue:loopsq+gpu       no live worker has labels gpu (needed by active loop(s): train)",
    ]


def test_an_unserved_queue_nothing_waits_in_and_no_active_loop_needs_passes() -> None:
    snap = FleetSnapshot(AT, (PLAIN,), (queue("loopsq+gpu", ("gpu",), 0, None, (), ("gpu",)),), NO_TIMERS)
    assert lines(snap)[0] == "ok   queue:loopsq+gpu       0 run(s) waiting; no live worker serves it, no active loop needs it"


def test_a_served_queue_whose_oldest_run_waited_past_the_threshold_warns_with_its_workers_slots() -> None:
    snap = FleetSnapshot(AT, (GPU, PLAIN), (queue("loopsq", (), 9, 95_000, ("w-gpu", "w-plain")),), NO_TIMERS)
    assert lines(snap)[0] == (
        "warn queue:loopsq           oldest waiting run has waited 95s, over LOOPSQ_QUEUE_AGE_WARN=1m "
        "(9 run(s) waiting; 5 of 7 slots busy on the 2 live worker(s) serving it)")
    assert lines(snap, warn_ms=120_000)[0] == (
        "ok   queue:loopsq           9 run(s) waiting, oldest 95s (5 of 7 slots busy on the 2 live worker(s) "
        "serving it)")


def test_timers_past_their_time_warn() -> None:
    snap = FleetSnapshot(AT, (), (), FleetTimers(armed=5, overdue=2, oldest_late_ms=8_400))
    assert lines(snap) == ["warn timers                 2 armed timer(s) past their time, the oldest by 8s: "
                           "is a scheduler running?"]


@pytest.mark.parametrize(("value", "ms"), [(None, 60_000), ("", 60_000), ("90s", 90_000), ("5m", 300_000)])
def test_the_age_threshold_comes_from_loopsq_queue_age_warn(value: str | None, ms: int) -> None:
    assert queue_age_warn_ms({} if value is None else {"LOOPSQ_QUEUE_AGE_WARN": value}) == ms


@pytest.mark.parametrize("value", ["soon", "0s", "-5s", "1h30m"])
def test_a_bad_age_threshold_is_bad_input_naming_the_variable_and_the_value(value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        queue_age_warn_ms({"LOOPSQ_QUEUE_AGE_WARN": value})
    assert caught.value.message == (
        f"LOOPSQ_QUEUE_AGE_WARN must be a duration greater than zero such as 60s, got '{value}'")


def test_status_lists_each_worker_and_queue_marking_the_unserved_and_the_timers_overdue() -> None:
    snap = FleetSnapshot(AT, (GPU, PLAIN), (
        queue("loopsq", (), 0, None, ("w-gpu", "w-plain")),
        queue("loopsq+gpu", ("gpu",), 3, 42_000, ("w-gpu",)),
        queue("loopsq+nvme", ("nvme",), 1, 12_000, (), ("nvme",)),
    ), FleetTimers(armed=4, overdue=2, oldest_late_ms=8_000))
    assert fleet_lines(snap.to_dict()) == [
        "fleet: 2 worker(s), 5/7 slots busy",
        "  worker w-gpu  busy=1/3  labels=gpu,host:h1",
        "  worker w-plain  busy=4/4  labels=host:h2",
        "  queue loopsq  depth=0",
        "  queue loopsq+gpu  depth=3  oldest=42s",
        "  queue loopsq+nvme  depth=1  oldest=12s  unserved: no live worker has labels nvme",
        "timers overdue: 2 (oldest 8s late)",
    ]


def test_status_with_no_worker_says_the_base_queue_has_none_running() -> None:
    snap = FleetSnapshot(AT, (), (queue("loopsq", (), 0, None, ()),), FleetTimers(0, 0, None))
    assert fleet_lines(snap.to_dict()) == [
        "fleet: 0 worker(s), 0/0 slots busy",
        "  queue loopsq  depth=0  unserved: no live worker is running",
        "timers overdue: 0",
    ]
