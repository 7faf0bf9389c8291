"""The mirror is the archive: a trim change keeps the row (archived), and a rebuild merges Redis in without
dropping what Redis no longer has."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.errors import LoopsqError
from loopsq.mirror import queries
from loopsq.mirror.apply import apply_changes
from loopsq.mirror.follow import catch_up, rebuild
from loopsq.mirror.merge import merge_all
from loopsq.mirror.schema import open_db
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.retention import Retention, Windows
from loopsq.state.runs import Claim, Owner, RunStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def run_entity(run_id: str, loop_id: str = "l1", slot: str = "2026-01-01T00:00:00.000Z") -> dict[str, object]:
    return {"id": run_id, "loopId": loop_id, "loopName": "l", "scheduledFor": slot, "attempt": 1,
            "status": "succeeded", "createdAt": slot, "updatedAt": slot}


def test_a_trim_change_keeps_the_row_and_marks_it_archived(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "m.db")
    apply_changes(conn, [{"id": "1-0", "upsert": {"loop_runs": [run_entity("r1")]}},
                         {"id": "2-0", "at": "2026-01-02T00:00:00.000Z", "trim": {"loop_runs": ["r1"]}}])
    row = queries.get_run(conn, "r1")
    assert row is not None and row["archivedAt"] == "2026-01-02T00:00:00.000Z"
    # A replayed trim changes nothing (the first archive time stays).
    apply_changes(conn, [{"id": "3-0", "at": "2026-01-03T00:00:00.000Z", "trim": {"loop_runs": ["r1"]}}])
    assert queries.get_run(conn, "r1")["archivedAt"] == "2026-01-02T00:00:00.000Z"  # type: ignore[index]


def test_a_trim_of_a_definition_table_is_refused_as_malformed(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "m.db")
    with pytest.raises(LoopsqError, match="cannot trim table 'loops'"):
        apply_changes(conn, [{"id": "1-0", "trim": {"loops": ["x"]}}])


def test_a_merge_keeps_runs_redis_no_longer_has_and_drops_definitions_it_no_longer_has(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "m.db")
    loop = {"id": "l1", "name": "l", "status": "active", "schedule": {"type": "interval", "everyMs": 1000},
            "target": {"type": "command", "command": "true"}, "catchUp": "latest", "catchUpLimit": 1,
            "overlap": "skip", "maxAttempts": 1, "retryDelayMs": 1, "leaseMs": 1, "createdAt": "x", "updatedAt": "x"}
    step = {"id": "s1", "workflowRunId": "w1", "stepId": "a", "sequence": 0, "status": "succeeded",
            "createdAt": "x", "updatedAt": "x"}
    wf_run = {"id": "w1", "workflowId": "wf", "workflowName": "wf", "status": "succeeded", "createdAt": "x",
              "updatedAt": "x"}
    apply_changes(conn, [{"id": "1-0", "upsert": {
        "loops": [loop, {**loop, "id": "gone", "name": "gone"}],
        "loop_runs": [run_entity("old"), run_entity("kept", slot="2026-01-01T00:00:01.000Z")],
        "workflow_runs": [wf_run], "workflow_step_runs": [step]}}])
    kept = merge_all(conn, {"loops": [loop], "loop_runs": [run_entity("kept", slot="2026-01-01T00:00:01.000Z")]},
                     "5-0", at="2026-02-01T00:00:00.000Z")
    assert kept == 2  # the loop run "old" and the workflow run "w1"
    assert [r["id"] for r in queries.list_loops(conn)] == ["l1"]
    assert queries.get_run(conn, "old")["archivedAt"] == "2026-02-01T00:00:00.000Z"  # type: ignore[index]
    assert "archivedAt" not in queries.get_run(conn, "kept")  # type: ignore[operator]
    assert queries.get_workflow_run(conn, "w1")["archivedAt"] == "2026-02-01T00:00:00.000Z"  # type: ignore[index]
    assert [s["id"] for s in queries.list_step_runs(conn, "w1")] == ["s1"]  # an archived run keeps its steps


def _settled(client: redis.Redis, loop_id: str, n: int) -> list[str]:
    store, owner, ids = RunStore(client, KEYS), Owner("w", "h", 1), []
    for i in range(n):
        at = T0 + timedelta(seconds=i)
        claim = store.claim(loop_id, at, owner, at, source="ad_hoc")
        assert isinstance(claim, Claim)
        store.finalize(claim.run.id, claim.token, at, status="succeeded", exit_code=0, duration_ms=1, stdout="",
                       stderr="", error=None, pid=None)
        ids.append(claim.run.id)
    return ids


def test_a_new_mirror_rebuilt_from_redis_still_gets_the_trimmed_runs_the_stream_holds(
    client: redis.Redis, tmp_path: Path
) -> None:
    loop_id = LoopStore(client, KEYS).create(new_loop(
        {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 3_600_000},
         "target": {"type": "command", "command": "true"}, "keepRuns": 1}, T0)).id
    ids = _settled(client, loop_id, 3)
    assert Retention(client, KEYS).trim_due(T0 + timedelta(days=1), Windows(100, 100)).loop_runs == 2
    conn = open_db(tmp_path / "new.db")  # never followed anything: its first read rebuilds
    assert catch_up(client, KEYS, conn) >= 1
    rows = {r["id"]: r for r in queries.list_runs(conn, loop_id=loop_id)}
    assert set(rows) == set(ids)
    assert [("archivedAt" in rows[i]) for i in ids] == [True, True, False]
    assert rebuild(client, KEYS, conn) == 2
    assert {r["id"] for r in queries.list_runs(conn, loop_id=loop_id)} == set(ids)


def test_a_flushed_redis_keeps_the_old_runs_archived(client: redis.Redis, tmp_path: Path) -> None:
    loop_id = LoopStore(client, KEYS).create(new_loop(
        {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 3_600_000},
         "target": {"type": "command", "command": "true"}}, T0)).id
    ids = _settled(client, loop_id, 2)
    conn = open_db(tmp_path / "m.db")
    catch_up(client, KEYS, conn)
    client.flushall()
    LoopStore(client, KEYS).create(new_loop(
        {"name": "fresh", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 3_600_000},
         "target": {"type": "command", "command": "true"}}, T0))
    catch_up(client, KEYS, conn)
    assert [loop["name"] for loop in queries.list_loops(conn)] == ["fresh"]
    runs = queries.list_runs(conn, loop_name="l")
    assert {r["id"] for r in runs} == set(ids) and all(r.get("archivedAt") for r in runs)


def test_a_patch_sets_only_the_fields_it_names_and_clears_those_set_to_null(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "m.db")
    row = {**run_entity("r1"), "status": "running", "leaseExpiresAt": "2026-01-01T00:30:00.000Z",
           "previousAttempts": [{"attempt": 1, "stdout": "x" * 2048}]}
    apply_changes(conn, [{"id": "1-0", "upsert": {"loop_runs": [row]}},
                         {"id": "2-0", "patch": {"loop_runs": [{"id": "r1", "pid": 42, "leaseExpiresAt": None}]}},
                         {"id": "3-0", "patch": {"loop_runs": [{"id": "absent", "pid": 7}]}}])
    got = queries.get_run(conn, "r1")
    assert got is not None
    assert (got["pid"], got.get("leaseExpiresAt"), got["previousAttempts"]) == (42, None, row["previousAttempts"])
    assert queries.get_run(conn, "absent") is None  # a row the mirror does not hold waits for its snapshot
