"""Next fire times and schedules in words (``loopsq.domain.upcoming``), and ``loopsq next`` which prints them
(the dashboard's loop page shows the same list; ``tests/integration/test_web_browser.py`` compares the two)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain.upcoming import fire_times, policies_in_words, schedule_in_words
from tests.unit.cli_helpers import Cli, make_cli

BASE: dict[str, Any] = {"status": "active", "timezone": "UTC", "nextRunAt": "2026-03-28T09:30:00.000Z"}


def utc(loop: dict[str, Any], count: int = 10) -> list[str]:
    return [t.utc for t in fire_times({**BASE, **loop}, count)]


def test_cron_fire_times_follow_the_zone_across_a_dst_change() -> None:
    loop = {"schedule": {"type": "cron", "expression": "30 10 * * *"}, "timezone": "Europe/Paris"}
    times = fire_times({**BASE, **loop}, 3)
    assert [(t.local, t.utc) for t in times] == [
        ("2026-03-28T10:30:00.000+01:00", "2026-03-28T09:30:00.000Z"),
        ("2026-03-29T10:30:00.000+02:00", "2026-03-29T08:30:00.000Z"),
        ("2026-03-30T10:30:00.000+02:00", "2026-03-30T08:30:00.000Z"),
    ]


def test_interval_fire_times_step_by_the_interval_and_stop_at_the_expiry() -> None:
    loop = {"schedule": {"type": "interval", "everyMs": 3_600_000}, "expiresAt": "2026-03-28T12:00:00.000Z"}
    assert utc(loop) == ["2026-03-28T09:30:00.000Z", "2026-03-28T10:30:00.000Z", "2026-03-28T11:30:00.000Z"]


def test_once_and_dynamic_have_one_time_and_a_paused_or_archived_loop_none() -> None:
    assert utc({"schedule": {"type": "once", "at": "2026-03-28T09:30:00Z"}}) == ["2026-03-28T09:30:00.000Z"]
    assert utc({"schedule": {"type": "dynamic"}}) == ["2026-03-28T09:30:00.000Z"]
    hourly = {"schedule": {"type": "interval", "everyMs": 3_600_000}}
    assert utc({**hourly, "status": "paused"}) == []
    assert utc({**hourly, "archivedAt": "2026-03-01T00:00:00.000Z"}) == []


def test_a_pending_retry_comes_first() -> None:
    loop = {"schedule": {"type": "interval", "everyMs": 3_600_000}, "retryAt": "2026-03-28T09:05:00.000Z"}
    times = fire_times({**BASE, **loop}, 3)
    assert [(t.utc, t.retry) for t in times] == [("2026-03-28T09:05:00.000Z", True),
                                                 ("2026-03-28T09:30:00.000Z", False),
                                                 ("2026-03-28T10:30:00.000Z", False)]


@pytest.mark.parametrize(("schedule", "words"), [
    ({"type": "interval", "everyMs": 300_000}, "every 5m, on a fixed rate"),
    ({"type": "interval", "everyMs": 300_000, "anchor": "fixed_delay"}, "every 5m after the previous run ends"),
    ({"type": "cron", "expression": "0 9 * * 1-5"}, "on cron '0 9 * * 1-5' in Europe/Paris"),
    ({"type": "once", "at": "2026-03-28T09:30:00Z"}, "once, at 2026-03-28T09:30:00Z in Europe/Paris"),
    ({"type": "dynamic", "minIntervalMs": 60_000}, "dynamic: each run sets the next, at least 1m apart"),
])
def test_schedules_in_words(schedule: dict[str, Any], words: str) -> None:
    assert schedule_in_words(schedule, "Europe/Paris") == words


def test_policies_in_words() -> None:
    assert policies_in_words({"overlap": "skip", "catchUp": "all", "catchUpLimit": 5, "maxAttempts": 3,
                              "retryDelayMs": 30_000, "retryBackoff": "exponential", "retryMaxDelayMs": 600_000}) == {
        "overlap": "skip: a slot due while a run goes on is skipped",
        "catchUp": "all: every missed slot runs (at most 5)",
        "retry": "up to 3 attempts, 30s apart (exponential), at most 10m",
    }


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def test_next_prints_the_schedule_and_each_fire_time_in_the_zone_and_utc(cli: Cli) -> None:
    loop_id = cli.ok("create", "command", "nightly", "--cmd", "true", "--cron", "0 9 * * *",
                     "--timezone", "America/New_York").split()[2]
    assert cli.ok("next", "nightly", "-n", "2") == (
        f"{loop_id}  active  on cron '0 9 * * *' in America/New_York\n"
        "  2026-01-01T09:00:00.000-05:00  2026-01-01T14:00:00.000Z\n"
        "  2026-01-02T09:00:00.000-05:00  2026-01-02T14:00:00.000Z\n")
    body = cli.json("next", "nightly", "--count", "1")
    assert body["fireTimes"] == [{"local": "2026-01-01T09:00:00.000-05:00", "utc": "2026-01-01T14:00:00.000Z"}]
    cli.ok("pause", "nightly")
    assert cli.ok("next", "nightly") == f"{loop_id}  paused  on cron '0 9 * * *' in America/New_York\n" \
                                        "  no upcoming fire times (status paused)\n"


@pytest.mark.parametrize(("args", "message"), [
    (("next", "nightly", "--count", "0"), "error: --count must be a positive integer, got '0'\n"),
    (("next", "nightly", "--count", "101"), "error: --count must be at most 100, got '101'\n"),
    (("next", "nope"), "error: loop not found: nope\n"),
])
def test_next_refuses_bad_input_with_one_line(cli: Cli, args: tuple[str, ...], message: str) -> None:
    cli.ok("create", "command", "nightly", "--cmd", "true", "--cron", "0 9 * * *")
    result = cli.run(*args)
    assert (result.exit_code, result.output) == (2 if "count" in message else 1, message)


def test_next_says_a_jittered_loops_jitter_and_offset_and_its_times_include_the_offset(cli: Cli) -> None:
    from loopsq.domain.jitter import offset_ms
    from loopsq.domain.upcoming import offset_words

    loop_id = cli.ok("create", "command", "spread", "--cmd", "true", "--cron", "0 9 * * *", "--jitter", "5m"
                     ).split()[2]
    offset = offset_ms(loop_id, 300_000)
    assert 0 < offset < 300_000
    first = (datetime(2026, 1, 1, 9, tzinfo=UTC) + timedelta(milliseconds=offset)).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")
    assert cli.ok("next", "spread", "-n", "1") == (
        f"{loop_id}  active  on cron '0 9 * * *' in UTC, jitter 5m: this loop's slots are {offset_words(offset)} "
        "after the schedule's\n"
        f"  {first.replace('Z', '+00:00')}  {first}\n")
    body = cli.json("next", "spread", "-n", "1")
    assert (body["jitterMs"], body["offsetMs"]) == (300_000, offset)
