"""One clock (``state.clock``): a process measures its offset to Redis's ``TIME`` and ``timeutil.now()`` applies
it; liveness records publish it; ``doctor`` and ``status`` show it and warn above a second. Redis's clock is a
stub here (fakeredis whose ``TIME`` is skewed); the real skew, with libfaketime on real processes, is in
``tests/integration/test_clock_skew.py``."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest

from loopsq.domain import timeutil
from loopsq.engine.runtime import Runtime
from loopsq.ops.doctor import clock_checks
from loopsq.ops.health import clock_text
from loopsq.state import clock
from loopsq.state.keys import Keys

KEYS = Keys()


class SkewedRedis(fakeredis.FakeRedis):
    """fakeredis whose ``TIME`` runs ``skew_s`` ahead of this host's clock (behind when negative)."""

    skew_s = 0.0

    def time(self, **_kwargs: Any) -> tuple[int, int]:  # type: ignore[override]
        t = time.time() + self.skew_s
        return int(t), int((t - int(t)) * 1_000_000)


@pytest.fixture(autouse=True)
def _host_clock() -> Iterator[None]:
    """Every test starts, and leaves the process, on the host's clock."""
    timeutil.set_clock_offset(0)
    yield
    timeutil.set_clock_offset(0)


def skewed(skew_s: float) -> SkewedRedis:
    client = SkewedRedis(decode_responses=True)
    client.skew_s = skew_s
    return client


@pytest.mark.parametrize("skew_s", [30.0, -30.0, 0.0])
def test_now_is_redis_time_once_measured(skew_s: float) -> None:
    client = skewed(skew_s)
    assert abs((timeutil.now() - datetime.now(UTC)).total_seconds()) < 0.5  # the host's until measured
    reading = clock.RedisClock().measure(client)
    assert abs(reading.offset_ms - skew_s * 1000) < 50
    assert abs((timeutil.now() - datetime.now(UTC)).total_seconds() - skew_s) < 0.05
    # Published the other way round: how far this host is ahead of Redis.
    assert abs(clock.published_offset_ms() + skew_s * 1000) < 50
    if skew_s == 0:  # within the measurement's own error: the host's clock is left untouched
        assert timeutil.clock_offset_ms() == 0


def test_the_fastest_of_the_round_trips_is_kept() -> None:
    class Slow(SkewedRedis):
        calls = 0

        def time(self, **kwargs: Any) -> tuple[int, int]:  # type: ignore[override]
            self.calls += 1
            if self.calls != 2:
                time.sleep(0.05)  # a slow round trip: its middle is uncertain by 25 ms
            return super().time(**kwargs)

    client = Slow(decode_responses=True)
    reading = clock.read_offset(client, samples=3)
    assert client.calls == 3
    assert reading.rtt_ms < 40


def test_a_measurement_is_taken_again_only_when_due() -> None:
    client = skewed(10.0)
    rc = clock.RedisClock(every_s=3600)
    assert rc.measure_if_due(client) is not None  # none taken yet
    client.skew_s = 20.0
    assert rc.measure_if_due(client) is None
    assert round(timeutil.clock_offset_ms() / 1000) == 10
    assert rc.measure(client) is not None
    assert round(timeutil.clock_offset_ms() / 1000) == 20


def test_an_offset_over_a_second_is_logged_once_and_its_end_too(caplog: pytest.LogCaptureFixture) -> None:
    client = skewed(-30.0)
    rc = clock.RedisClock()
    with caplog.at_level(logging.INFO, logger="loopsq.state.clock"):
        rc.measure(client)
        rc.measure(client)
        client.skew_s = 0.0
        rc.measure(client)
    assert [r.getMessage() for r in caplog.records] == [
        "this host's clock is +30.0 s off Redis's; loopsq uses Redis's clock (fix the host's time sync)",
        "this host's clock is within 1.0 s of Redis's again",
    ]


def test_a_process_publishes_its_offset_in_its_liveness_record() -> None:
    client = skewed(-30.0)  # Redis behind: this host is 30 s fast
    with Runtime(client=client, keys=KEYS, role="worker", worker_id="w1") as rt:
        record = json.loads(client.get(KEYS.worker("w1")) or "{}")
        assert abs(record[clock.OFFSET_FIELD] - 30_000) < 50
        # Its timestamps are on Redis's clock too.
        assert abs(timeutil.from_iso(rt.started_at) - (datetime.now(UTC) - timedelta(seconds=30))) < timedelta(
            seconds=1)
        assert abs(timeutil.from_iso(record["beatAt"]) - timeutil.from_iso(rt.started_at)) < timedelta(seconds=2)


def test_doctor_warns_naming_each_process_whose_clock_is_off_by_more_than_a_second() -> None:
    records: list[dict[str, Any]] = [
        {"id": "scheduler:h1:10:ab", "role": "scheduler", "host": "h1", clock.OFFSET_FIELD: 30_012},
        {"id": "worker:h2:11:cd", "role": "worker", "host": "h2", clock.OFFSET_FIELD: -29_987},
        {"id": "worker:h3:12:ef", "role": "worker", "host": "h3", clock.OFFSET_FIELD: 3},
        {"id": "worker:h4:13:00", "role": "worker", "host": "h4"},  # an older loopsq: nothing published
    ]
    assert [c.line() for c in clock_checks(records)] == [
        "warn clock:scheduler:h1:10:ab scheduler:h1:10:ab clock is +30.0 s off Redis's (over 1 s); fix the time "
        "sync of host h1",
        "warn clock:worker:h2:11:cd  worker:h2:11:cd clock is -30.0 s off Redis's (over 1 s); fix the time sync of "
        "host h2",
    ]
    assert [c.line() for c in clock_checks(records[2:])] == [
        "ok   clock                  process clocks within 1 s of Redis's (largest offset 0.003 s)",
    ]
    assert [clock_text(r) for r in records] == ["+30.0 s", "-30.0 s", "+0.003 s", "?"]


def test_the_cli_and_the_sdk_write_times_on_redis_clock(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from loopsq.cli.app import App
    from loopsq.sdk import LoopsClient

    client = skewed(-30.0)  # this host 30 s fast
    monkeypatch.setattr("loopsq.cli.app.connect", lambda _url: client)
    app = App("redis://127.0.0.1:6390/0", tmp_path)
    assert app.client() is client
    assert abs((app.now() - datetime.now(UTC)).total_seconds() + 30) < 0.5
    timeutil.set_clock_offset(0)
    monkeypatch.setattr("loopsq.sdk.connect", lambda _url: client)
    loop = LoopsClient("redis://127.0.0.1:6390/0").create(
        {"name": "on-redis-time", "schedule": {"type": "interval", "everyMs": 60_000},
         "target": {"type": "command", "command": "true"}})
    assert abs((timeutil.from_iso(loop.created_at) - datetime.now(UTC)).total_seconds() + 30) < 0.5
