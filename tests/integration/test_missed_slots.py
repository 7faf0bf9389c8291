"""Missed slots on a real redis-server: a streak reaches the mirror once with its count, and the API, the
dashboard and ``/metrics`` show it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from loopsq.domain import missed
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import to_iso
from loopsq.mirror import queries
from loopsq.mirror.follow import catch_up
from loopsq.mirror.schema import open_db
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, RunStore
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, TOKEN
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

KEYS = Keys()
X = "\N{MULTIPLICATION SIGN}"  # (as printed: "missed", the sign, the count)
T0 = datetime(2026, 5, 1, 7, 57, 8, tzinfo=UTC)
EVERY_10S = {"type": "interval", "everyMs": 10_000}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def make_loop(client: redis.Redis, name: str = "ingest") -> str:
    body = {"name": name, "timezone": "UTC", "schedule": EVERY_10S, "target": {"type": "command", "command": "true"}}
    return LoopStore(client, KEYS).create(new_loop(body, T0 - timedelta(seconds=10))).id


def test_a_missed_streak_reaches_the_mirror_once_with_its_count(real_redis: redis.Redis, tmp_path: Path) -> None:
    loop_id = make_loop(real_redis)
    store = RunStore(real_redis, KEYS)
    reason = missed.no_free_worker(42_000)
    conn = open_db(tmp_path / "mirror.db")
    try:
        catch_up(real_redis, KEYS, conn)  # a new mirror starts from Redis (the loop); it follows the stream on
        row = store.record_missed(loop_id, at(0), at(130), 14, reason.kind, reason.text, at(131))
        assert row is not None
        assert catch_up(real_redis, KEYS, conn) == 1  # one transition, one change
        extended = store.record_missed(loop_id, at(140), at(190), 6, reason.kind, reason.text, at(191))
        assert extended is not None and extended.id == row.id
        # A second mirror, from scratch, and the first one again: each ends with the one row and its count.
        other = open_db(tmp_path / "other.db")
        try:
            for mirror in (conn, other):
                catch_up(real_redis, KEYS, mirror)
                assert catch_up(real_redis, KEYS, mirror) == 0  # nothing twice
                rows = queries.list_runs(mirror, loop_id=loop_id)
                assert rows == [extended.to_dict()]
                assert (rows[0]["missedCount"], rows[0]["missedLast"]) == (20, to_iso(at(190)))
        finally:
            other.close()
        # A real run ends the streak: the next one is a row of its own.
        claim = store.claim(loop_id, at(200), Owner("w", "h", 1), at(200))
        assert isinstance(claim, Claim)
        later = store.record_missed(loop_id, at(210), at(220), 2, reason.kind, reason.text, at(221))
        assert later is not None and later.id != row.id
        catch_up(real_redis, KEYS, conn)
        assert [(r["status"], r.get("missedCount")) for r in queries.list_runs(conn, loop_id=loop_id)] == [
            ("missed", 2), ("running", None), ("missed", 20)]
    finally:
        conn.close()
    assert real_redis.hgetall(KEYS.missed_counts) == {"no_free_worker": "22"}


@pytest.fixture
def web(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("TZ", "UTC")
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False,
                           rq_dashboard=False)
    with TestClient(create_app(settings), headers=AUTH) as client:
        yield client


def test_the_api_the_dashboard_and_metrics_show_a_missed_streak(web: TestClient, real_redis: redis.Redis) -> None:
    loop_id = make_loop(real_redis)
    store = RunStore(real_redis, KEYS)
    reason = missed.no_free_worker(42_000)
    row = store.record_missed(loop_id, at(0), at(130), 14, reason.kind, reason.text, at(131))
    assert row is not None
    store.record_missed(loop_id, at(140), at(150), 2, "catch_up", "catch-up latest skipped it", at(151))

    page = web.get("/api/runs", params={"status": "missed"}).json()
    shown = {item["id"]: item for item in page["items"]}
    assert shown[row.id] == row.to_dict()
    assert {i["missedKind"]: i["missedCount"] for i in page["items"]} == {"no_free_worker": 14, "catch_up": 2}
    assert web.get(f"/api/runs/{row.id}").json() == row.to_dict()
    doc = web.get("/api/openapi.json").json()
    run_schema = doc["components"]["schemas"]["RunOut"]["properties"]
    assert "missed" in run_schema["status"]["enum"]
    assert run_schema["missedKind"]["enum"] == [*missed.KINDS, None]
    assert {"missedLast", "missedCount"} <= set(run_schema)
    for item in page["items"]:  # what the API returns is what its document says
        jsonschema.validate(item, doc["components"]["schemas"]["RunOut"])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**row.to_dict(), "missedKind": "bored"}, doc["components"]["schemas"]["RunOut"])

    html = web.get("/runs", headers={"Accept": "text/html"}).text
    assert f"missed {X}14</span>" in html
    assert f"{to_iso(at(0))} → {to_iso(at(130))}" in html
    assert "no free worker for 42s" in html
    detail = web.get(f"/runs/{row.id}", headers={"Accept": "text/html"}).text
    assert "Missed because" in detail and f"14 from {to_iso(at(0))} to {to_iso(at(130))}" in detail

    families = text_string_to_metric_families(web.get("/metrics").text)
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}
    assert {dict(k[1])["reason"]: v for k, v in got.items() if k[0] == "loopsq_slots_missed_total"} == {
        "catch_up": 2, "no_free_worker": 14, "no_worker_labels": 0, "no_scheduler": 0, "stalled": 0}
    assert got[("loopsq_runs_current", (("status", "missed"),))] == 2
    assert not any(k[0] == "loopsq_runs_total" and dict(k[1])["status"] == "missed" for k in got)
