"""``loopsq runs`` shows a missed streak on one line: its count and its range, then its reason."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from loopsq.domain.timeutil import to_iso
from loopsq.state.keys import Keys
from loopsq.state.runs import RunStore
from tests.unit.cli_helpers import NOW, Cli, make_cli

KEYS = Keys()
X = "\N{MULTIPLICATION SIGN}"  # (as printed: "missed", the sign, the count)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def test_runs_shows_a_missed_streak_with_its_count_range_and_reason(cli: Cli) -> None:
    loop_id = cli.ok("create", "command", "ingest", "--every", "10s", "--cmd", "true").split()[2]
    store = RunStore(cli.redis, KEYS)
    first, last = NOW + timedelta(hours=7, minutes=57, seconds=8), NOW + timedelta(hours=7, minutes=59, seconds=18)
    streak = store.record_missed(loop_id, first, last, 14, "no_free_worker", "no free worker for 42s", NOW)
    one = store.record_missed(loop_id, last + timedelta(seconds=10), last + timedelta(seconds=10), 1, "catch_up",
                              "catch-up latest skipped it", NOW + timedelta(seconds=1))
    assert streak is not None and one is not None
    out = cli.ok("runs", "ingest")
    assert out.splitlines() == [
        f"{one.id}  missed {X}1   slot=2026-01-01T07:59:28.000Z  ingest",
        "  missed: catch-up latest skipped it",
        f"{streak.id}  missed {X}14  slot=2026-01-01T07:57:08.000Z → 07:59:18.000Z  ingest",
        "  missed: no free worker for 42s",
    ]
    assert [r["id"] for r in cli.json("runs", "--status", "missed")] == [one.id, streak.id]
    row = cli.json("runs", "ingest")[1]
    assert (row["missedCount"], row["missedLast"], row["missedKind"]) == (14, to_iso(last), "no_free_worker")


def test_a_streak_across_midnight_shows_both_dates(cli: Cli) -> None:
    loop_id = cli.ok("create", "command", "nightly", "--every", "1h", "--cmd", "true").split()[2]
    row = RunStore(cli.redis, KEYS).record_missed(loop_id, NOW - timedelta(hours=2), NOW + timedelta(hours=1), 4,
                                                  "no_scheduler", "no scheduler ran", NOW)
    assert row is not None
    assert cli.ok("runs", "nightly").splitlines()[0] == (
        f"{row.id}  missed {X}4   slot=2025-12-31T22:00:00.000Z → 2026-01-01T01:00:00.000Z  nightly")


def test_runs_lists_missed_among_the_statuses_it_filters_by(cli: Cli) -> None:
    bad = cli.run("runs", "--status", "lost")
    assert (bad.exit_code, bad.stderr) == (
        2, "error: --status must be one of running, succeeded, failed, timed_out, abandoned, skipped, missed, "
           "got 'lost'\n")
