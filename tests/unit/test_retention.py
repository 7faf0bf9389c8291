"""The history window in Redis: what a trim removes (atomically, with its change entry), and what it never
removes. Run on fakeredis and on the real server (``client``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from loopsq.domain import run_rules as rules
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import from_iso, to_iso
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.state import run_codec
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.retention import Retention, Windows
from loopsq.state.runs import CLAIM_TTL_MS, Claim, Owner, Refusal, RunStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = Owner("worker:a", "host-a", 100)
WINDOWS = Windows(keep_runs=100, keep_workflow_runs=100)


def make_loop(client: redis.Redis, **policies: Any) -> str:
    body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 1000},
            "target": {"type": "command", "command": "true"}, **policies}
    return LoopStore(client, KEYS).create(new_loop(body, T0)).id


def next_slot(client: redis.Redis, loop_id: str) -> datetime:
    loop = LoopStore(client, KEYS).get(loop_id)
    assert loop is not None
    if loop.retry_scheduled_for is not None:
        return from_iso(loop.retry_scheduled_for)
    assert loop.next_run_at is not None
    return from_iso(loop.next_run_at)


def claim_next(client: redis.Redis, loop_id: str) -> Claim:
    slot = next_slot(client, loop_id)
    claim = RunStore(client, KEYS).claim(loop_id, slot, OWNER, slot)
    assert isinstance(claim, Claim), claim
    return claim


def settle(client: redis.Redis, loop_id: str, status: str = "succeeded") -> str:
    """Claim the loop's next slot and finalize it with ``status``; returns the run id."""
    claim = claim_next(client, loop_id)
    done = RunStore(client, KEYS).finalize(
        claim.run.id, claim.token, from_iso(claim.run.scheduled_for) + timedelta(milliseconds=5), status=status,
        exit_code=0 if status == "succeeded" else 1, duration_ms=5, stdout="x" * 100, stderr="",
        error=None if status == "succeeded" else "boom", pid=None)
    assert done is not None
    return claim.run.id


def trim(client: redis.Redis, when: datetime | None = None, windows: Windows = WINDOWS) -> Any:
    return Retention(client, KEYS).trim_due(when or T0 + timedelta(days=1), windows)


def run_ids(client: redis.Redis, loop_id: str) -> list[str]:
    return list(client.zrange(KEYS.loop_runs(loop_id), 0, -1))


def trim_changes(client: redis.Redis) -> list[dict[str, Any]]:
    return [json.loads(f["data"]) for _, f in client.xrange(KEYS.changes) if f["type"] == "runs_trimmed"]


def test_a_loop_keeps_its_newest_keep_runs_settled_runs_and_the_rest_leave_with_every_key(
    client: redis.Redis,
) -> None:
    loop_id = make_loop(client, keepRuns=3)
    ids = [settle(client, loop_id) for _ in range(6)]
    runs = RunStore(client, KEYS).get_many(ids)
    report = trim(client)
    assert (report.loop_runs, report.protected) == (3, 0)
    assert run_ids(client, loop_id) == ids[3:]
    assert client.zrange(KEYS.runs, 0, -1) == ids[3:]
    for run in runs[:3]:
        for key in (KEYS.run(run.id), KEYS.claim(loop_id, run.scheduled_for, 1), KEYS.lease(run.id), KEYS.live(run.id)):
            assert not client.exists(key), key
        assert not client.hexists(KEYS.slots(loop_id), run.scheduled_for)
    for run in runs[3:]:
        assert client.hget(KEYS.slots(loop_id), run.scheduled_for) == run.id
    # One transition, with its change entry naming the trimmed runs (mirrors keep them).
    assert trim_changes(client) == [{"trim": {"loop_runs": ids[:3]}}]
    assert client.zscore(KEYS.retention_due, f"loop:{loop_id}") is None
    assert trim(client).loop_runs == 0  # nothing more beyond the window


def test_without_keep_runs_the_deployment_default_applies(client: redis.Redis) -> None:
    loop_id = make_loop(client)
    ids = [settle(client, loop_id) for _ in range(5)]
    assert trim(client, windows=Windows(keep_runs=2, keep_workflow_runs=100)).loop_runs == 3
    assert run_ids(client, loop_id) == ids[3:]


def test_a_settled_attempt_drops_its_claim_key(client: redis.Redis) -> None:
    loop_id = make_loop(client)
    claim = claim_next(client, loop_id)
    key = KEYS.claim(loop_id, claim.run.scheduled_for, 1)
    assert client.get(key) == claim.token
    RunStore(client, KEYS).finalize(claim.run.id, claim.token, T0 + timedelta(seconds=2), status="succeeded",
                                    exit_code=0, duration_ms=1, stdout="", stderr="", error=None, pid=None)
    assert not client.exists(key)


def shutdown_rerun(client: redis.Redis, loop_id: str) -> Claim:
    """Claim the loop's next slot, give it up as a worker shutdown does, and claim its re-run (same attempt)."""
    store = RunStore(client, KEYS)
    first = claim_next(client, loop_id)
    assert store.finalize(first.run.id, first.token, T0 + timedelta(seconds=2), status="abandoned", exit_code=None,
                          duration_ms=1, stdout="", stderr="", error=rules.SHUTDOWN_ERROR, pid=None) is not None
    rerun = claim_next(client, loop_id)
    assert (rerun.run.id, rerun.run.attempt, rerun.run.rerun) == (first.run.id, 1, 1), rerun.run
    return rerun


def claim_keys(client: redis.Redis, loop_id: str) -> list[str]:
    """Every claim key of the loop's slots (attempts and re-runs)."""
    prefix = KEYS.claim(loop_id, "SLOT", 1).split("SLOT")[0]
    return sorted(client.scan_iter(match=f"{prefix}*"))


@pytest.mark.parametrize("status", ["succeeded", "failed", "abandoned"])
def test_a_settled_re_run_after_a_shutdown_drops_its_claim_key(client: redis.Redis, status: str) -> None:
    loop_id = make_loop(client)
    rerun = shutdown_rerun(client, loop_id)
    key = KEYS.claim(loop_id, rerun.run.scheduled_for, 1, 1)
    assert client.get(key) == rerun.token
    assert claim_keys(client, loop_id) == [key]  # (the first run's went when it settled)
    store = RunStore(client, KEYS)
    if status == "abandoned":  # its worker died: recovery settles it
        assert store.abandon(rerun.run.id, T0 + timedelta(seconds=3), error="worker gone",
                             seen_lease=rerun.token) is not None
    else:
        assert store.finalize(rerun.run.id, rerun.token, T0 + timedelta(seconds=3), status=status,
                              exit_code=0 if status == "succeeded" else 1, duration_ms=1, stdout="", stderr="",
                              error=None if status == "succeeded" else "boom", pid=None) is not None
    assert claim_keys(client, loop_id) == []


def test_a_trimmed_re_run_leaves_no_claim_key_of_any_attempt_or_re_run(client: redis.Redis) -> None:
    loop_id = make_loop(client, keepRuns=1, maxAttempts=2)
    rerun = shutdown_rerun(client, loop_id)
    slot = rerun.run.scheduled_for
    store = RunStore(client, KEYS)
    assert store.finalize(rerun.run.id, rerun.token, T0 + timedelta(seconds=3), status="failed", exit_code=1,
                          duration_ms=1, stdout="", stderr="", error="boom", pid=None) is not None
    retry = claim_next(client, loop_id)  # attempt 2 of the same row
    assert (retry.run.id, retry.run.attempt, retry.run.rerun) == (rerun.run.id, 2, None), retry.run
    assert store.finalize(retry.run.id, retry.token, T0 + timedelta(seconds=4), status="succeeded", exit_code=0,
                          duration_ms=1, stdout="", stderr="", error=None, pid=None) is not None
    # Keys an older version left behind (a re-run's claim outlived its settle, for 30 days) go with the row too.
    for attempt, rerun_n in ((1, None), (1, 1), (2, None)):
        client.set(KEYS.claim(loop_id, slot, attempt, rerun_n), "left-over", px=CLAIM_TTL_MS)
    settle(client, loop_id)  # a newer run: the re-run's row leaves the window
    assert trim(client).trimmed_ids == [rerun.run.id]
    assert claim_keys(client, loop_id) == []


def test_a_running_run_is_never_trimmed_and_does_not_count_in_the_window(client: redis.Redis) -> None:
    loop_id = make_loop(client, keepRuns=1, overlap="allow")
    running = claim_next(client, loop_id)  # the oldest, still going
    ids = [settle(client, loop_id) for _ in range(3)]
    assert trim(client).loop_runs == 2
    assert run_ids(client, loop_id) == [running.run.id, ids[2]]
    assert client.exists(KEYS.run(running.run.id))


def test_the_slot_of_a_pending_retry_is_never_trimmed(client: redis.Redis) -> None:
    loop_id = make_loop(client, keepRuns=1, maxAttempts=2, retryDelayMs=1000)
    failed = settle(client, loop_id, status="failed")  # a retry of its slot is now pending
    loop = LoopStore(client, KEYS).get(loop_id)
    assert loop is not None and loop.retry_scheduled_for is not None
    # Another settled run makes the failed one fall out of a window of 1, but its retry still needs the row.
    RunStore(client, KEYS).skip(loop_id, from_iso(str(loop.next_run_at)), T0 + timedelta(seconds=3))
    report = trim(client)
    assert (report.loop_runs, report.protected) == (0, 1)
    assert client.exists(KEYS.run(failed))
    assert client.zscore(KEYS.retention_due, f"loop:{loop_id}") is not None  # looked at again later


def test_a_run_an_idempotency_key_points_to_is_kept_until_the_key_expires(client: redis.Redis) -> None:
    loop_id = make_loop(client, keepRuns=1)
    store = RunStore(client, KEYS)
    claim = store.claim(loop_id, T0, OWNER, T0, source="trigger", run_id="trig1", idempotency_key="order-42")
    assert isinstance(claim, Claim)
    store.finalize("trig1", claim.token, T0 + timedelta(seconds=1), status="succeeded", exit_code=0, duration_ms=1,
                   stdout="", stderr="", error=None, pid=None)
    client.set(KEYS.idempotency(loop_id, "order-42"), "trig1", px=60_000)
    ids = [settle(client, loop_id) for _ in range(2)]
    report = trim(client)
    assert (report.loop_runs, report.protected) == (1, 1)
    assert run_ids(client, loop_id) == ["trig1", ids[1]]
    due = client.zscore(KEYS.retention_due, f"loop:{loop_id}")
    assert due is not None and due > 0  # looked at again once the key has expired
    assert trim(client).loop_runs == 0  # not before then
    client.delete(KEYS.idempotency(loop_id, "order-42"))
    assert trim(client, T0 + timedelta(days=2)).loop_runs == 1
    assert run_ids(client, loop_id) == [ids[1]]


def test_a_removed_loop_keeps_no_window_in_redis(client: redis.Redis) -> None:
    loop_id = make_loop(client, keepRuns=5)
    ids = [settle(client, loop_id) for _ in range(3)]
    LoopStore(client, KEYS).remove(loop_id, T0 + timedelta(seconds=10))
    assert trim(client).loop_runs == 3
    assert not client.exists(KEYS.loop_runs(loop_id))
    assert not any(client.exists(KEYS.run(i)) for i in ids)


def test_a_trim_whose_run_changed_meanwhile_writes_nothing(client: redis.Redis) -> None:
    loop_id = make_loop(client, keepRuns=1)
    ids = [settle(client, loop_id) for _ in range(3)]
    retention = Retention(client, KEYS)
    plan = retention.plan_loop(loop_id, T0, 100, 100)
    assert plan is not None and plan.runs == 2
    stored = run_codec.read(client, KEYS.run(ids[0]))
    assert stored is not None
    client.set(KEYS.run(ids[0]), run_codec.decode(stored).to_json() + " ")  # it changed after the plan was read
    before = client.xlen(KEYS.changes)
    assert not retention.committer.commit(plan.tx).ok
    assert client.xlen(KEYS.changes) == before
    assert all(client.exists(KEYS.run(i)) for i in ids)
    assert run_ids(client, loop_id) == ids


def test_a_stale_claimer_cannot_run_a_slot_the_loop_has_passed_once_its_row_is_gone(client: redis.Redis) -> None:
    loop_id = make_loop(client, keepRuns=1)
    first_slot = next_slot(client, loop_id)
    settle(client, loop_id)
    settle(client, loop_id)
    assert trim(client).loop_runs == 1  # the first slot's row and its claim are gone
    assert not client.hexists(KEYS.slots(loop_id), to_iso(first_slot))
    refused = RunStore(client, KEYS).claim(loop_id, first_slot, OWNER, first_slot + timedelta(seconds=5))
    assert isinstance(refused, Refusal) and refused.reason == "past"


def _workflow(client: redis.Redis) -> dict[str, Any]:
    body = {"name": "wf", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}
    return WorkflowStore(client, KEYS).create(workflow_body_from_json(body), T0)


def _finished_workflow_run(client: redis.Redis, spec: dict[str, Any], when: datetime, **kw: Any) -> str:
    store = WorkflowRunStore(client, KEYS)
    state, _ = store.create(spec, when, **kw)
    store.start_step(state, "a", when)
    store.finish_step(state, "a", when, status="succeeded", exit_code=0, duration_ms=1, stdout="hi", stderr="",
                      error=None)
    store.finish_run(state, "succeeded", when, error=None)
    return state.run_id


def test_a_workflow_keeps_a_window_of_its_own_runs_with_their_steps_and_events(client: redis.Redis) -> None:
    spec = _workflow(client)
    ids = [_finished_workflow_run(client, spec, T0 + timedelta(seconds=i)) for i in range(4)]
    report = trim(client, windows=Windows(keep_runs=100, keep_workflow_runs=2))
    assert report.workflow_runs == 2
    assert client.zrange(KEYS.workflow_runs(spec["id"]), 0, -1) == ids[2:]
    for run_id in ids[:2]:
        for key in (KEYS.wf_run(run_id), KEYS.wf_steps(run_id), KEYS.wf_events(run_id)):
            assert not client.exists(key), key
    assert set(client.zrange(KEYS.wf_runs, 0, -1)) == set(ids[2:])
    assert trim_changes(client) == [{"trim": {"workflow_runs": ids[:2]}}]


def test_a_workflow_loop_run_leaves_with_its_workflow_runs(client: redis.Redis) -> None:
    spec = _workflow(client)
    loop_id = make_loop(client, keepRuns=1, target={"type": "workflow", "workflowId": spec["id"]})
    loop = LoopStore(client, KEYS).get(loop_id)
    assert loop is not None
    wf_ids = []
    for _ in range(2):
        claim = claim_next(client, loop_id)
        wf_ids.append(_finished_workflow_run(
            client, spec, T0, loop=loop.to_dict(), loop_run=claim.run.to_dict(),
            idempotency_key=f"{loop_id}:{claim.run.scheduled_for}:attempt:1"))
        RunStore(client, KEYS).finalize(claim.run.id, claim.token, T0 + timedelta(seconds=30), status="succeeded",
                                        exit_code=0, duration_ms=1, stdout="", stderr="", error=None, pid=None)
    first = run_ids(client, loop_id)[0]
    report = trim(client)
    assert (report.loop_runs, report.workflow_runs) == (1, 1)
    assert not client.exists(KEYS.wf_run(wf_ids[0])) and client.exists(KEYS.wf_run(wf_ids[1]))
    assert not client.exists(KEYS.loop_run_workflows(first))
    assert client.zcard(KEYS.workflow_runs(spec["id"])) == 0  # a loop run's workflow runs have no window of their own
    assert trim_changes(client) == [{"trim": {"loop_runs": [first], "workflow_runs": [wf_ids[0]]}}]


def test_a_workflow_loop_runs_key_written_under_the_old_spelling_leaves_with_it(client: redis.Redis) -> None:
    spec = _workflow(client)
    loop_id = make_loop(client, keepRuns=1, target={"type": "workflow", "workflowId": spec["id"]})
    loop = LoopStore(client, KEYS).get(loop_id)
    assert loop is not None
    wf_ids, idem_keys = [], []
    for _ in range(2):
        claim = claim_next(client, loop_id)
        key = f"{loop_id}:{claim.run.scheduled_for}:attempt:1"
        wf_ids.append(_finished_workflow_run(client, spec, T0, loop=loop.to_dict(), loop_run=claim.run.to_dict(),
                                             idempotency_key=key))
        # As a version before the key encoding wrote it (the raw spelling, no TTL).
        old = KEYS.before_encoding.wf_idempotency(spec["id"], key)
        client.rename(KEYS.wf_idempotency(spec["id"], key), old)
        idem_keys.append(old)
        RunStore(client, KEYS).finalize(claim.run.id, claim.token, T0 + timedelta(seconds=30), status="succeeded",
                                        exit_code=0, duration_ms=1, stdout="", stderr="", error=None, pid=None)
    assert trim(client).workflow_runs == 1
    assert not client.exists(KEYS.wf_run(wf_ids[0]))
    assert not client.exists(idem_keys[0])  # not left behind for ever
    assert client.get(idem_keys[1]) == wf_ids[1]


def test_a_run_a_trigger_key_in_the_old_spelling_points_to_is_kept_until_it_expires(client: redis.Redis) -> None:
    loop_id = make_loop(client, keepRuns=1)
    store = RunStore(client, KEYS)
    claim = store.claim(loop_id, T0, OWNER, T0, source="trigger", run_id="trig1", idempotency_key="order:42")
    assert isinstance(claim, Claim)
    store.finalize("trig1", claim.token, T0 + timedelta(seconds=1), status="succeeded", exit_code=0, duration_ms=1,
                   stdout="", stderr="", error=None, pid=None)
    client.set(f"loopsq:idem:{loop_id}:order:42", "trig1", px=60_000)  # written before the key encoding
    ids = [settle(client, loop_id) for _ in range(2)]
    report = trim(client)
    assert (report.loop_runs, report.protected) == (1, 1)
    assert run_ids(client, loop_id) == ["trig1", ids[1]]
    client.delete(f"loopsq:idem:{loop_id}:order:42")
    assert trim(client, T0 + timedelta(days=2)).loop_runs == 1
    assert run_ids(client, loop_id) == [ids[1]]


@pytest.mark.parametrize("budget", [1, 2])
def test_a_pass_trims_a_bounded_batch_and_leaves_the_rest_due(client: redis.Redis, budget: int) -> None:
    loop_id = make_loop(client, keepRuns=1)
    ids = [settle(client, loop_id) for _ in range(5)]
    report = Retention(client, KEYS).trim_due(T0 + timedelta(days=1), WINDOWS, max_runs=budget)
    assert report.loop_runs == budget
    assert run_ids(client, loop_id) == ids[budget:]
    assert client.zscore(KEYS.retention_due, f"loop:{loop_id}") is not None
    while trim(client).loop_runs:
        pass
    assert run_ids(client, loop_id) == ids[4:]


def test_a_running_runs_pid_and_lease_entries_carry_only_what_changed(client: redis.Redis) -> None:
    loop_id = make_loop(client, maxAttempts=2, retryDelayMs=1)
    settle(client, loop_id, status="failed")  # its retry carries the first attempt's output along
    claim = claim_next(client, loop_id)
    assert claim.run.previous_attempts
    store = RunStore(client, KEYS)
    store.mark_started(claim.run.id, claim.token, T0 + timedelta(seconds=3), pid=42, pid_start_time=1.5, host="h")
    assert store.renew_lease(claim.run.id, claim.token, 60_000, T0 + timedelta(seconds=4))
    started, renewed = [json.loads(f["data"]) for _, f in client.xrange(KEYS.changes)[-2:]]
    assert started == {"patch": {"loop_runs": [{"id": claim.run.id, "pid": 42, "pidStartTime": 1.5, "host": "h",
                                                "updatedAt": "2026-01-01T00:00:03.000Z"}]}}
    assert renewed == {"patch": {"loop_runs": [{"id": claim.run.id,
                                                "leaseExpiresAt": "2026-01-01T00:01:04.000Z"}]}}


def test_history_from_before_windows_is_marked_due_once(client: redis.Redis) -> None:
    loop_id = make_loop(client, keepRuns=1)
    ids = [settle(client, loop_id) for _ in range(3)]
    client.delete(KEYS.retention_due)  # as a deployment written before history windows has it
    retention = Retention(client, KEYS)
    assert retention.seed(T0) == 1
    assert retention.seed(T0) == 0
    assert trim(client).loop_runs == 2
    assert run_ids(client, loop_id) == ids[2:]


def test_the_sdk_takes_keep_runs(client: redis.Redis) -> None:
    from loopsq.sdk import LoopsClient

    loop = LoopsClient(client=client).create({"name": "s", "schedule": {"type": "interval", "everyMs": 1000},
                                             "target": {"type": "command", "command": "true"}, "keepRuns": 5})
    assert (loop.keep_runs, json.loads(client.get(KEYS.loop(loop.id)))["keepRuns"]) == (5, 5)


def test_a_slot_before_the_loops_next_one_is_past_but_never_its_pending_retry() -> None:
    from loopsq.domain.run_rules import slot_is_past

    loop = new_loop({"name": "p", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 1000},
                     "target": {"type": "command", "command": "true"}}, T0)
    nxt = str(loop.next_run_at)
    before = to_iso(from_iso(nxt) - timedelta(seconds=1))
    assert (slot_is_past(loop, before), slot_is_past(loop, nxt)) == (True, False)
    assert not slot_is_past(loop.with_changes(retry_scheduled_for=before), before)
    assert slot_is_past(loop.with_changes(next_run_at=None), nxt)  # running a fixed-delay loop: nothing is due
