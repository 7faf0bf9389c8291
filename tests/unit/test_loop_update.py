"""``LoopStore.edit`` and ``domain.loop_update`` (issue 31, point 2) on fakeredis: one ``loop_updated`` transition
per real edit, validated exactly like a create; a loop's own definition, given back, changes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import fakeredis
import pytest

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.loop_update import UPDATABLE, create_body, updated_loop
from loopsq.domain.models import Loop
from loopsq.domain.timeutil import from_iso, to_ms
from loopsq.errors import ConflictError, NotFoundError, ValidationError
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LATER = NOW + timedelta(minutes=10)
COMMAND = {"type": "command", "command": "true", "shell": True}

#: Loops of every kind and with every optional field, whose definition must survive a no-op update unchanged.
BODIES: list[dict[str, Any]] = [
    {"name": "plain", "schedule": {"type": "interval", "everyMs": 3_600_000}, "target": COMMAND},
    {"name": "full", "timezone": "Europe/Paris", "description": "d",
     "schedule": {"type": "cron", "expression": "0 9 * * 1-5"}, "jitterMs": 60_000,
     "target": {"type": "command", "command": "echo", "args": ["a"], "cwd": "/tmp", "env": {"A": "1"},
                "timeoutMs": None, "idleTimeoutMs": 5000, "account": {"profile": "p", "tool": "codex"}},
     "catchUp": "all", "catchUpLimit": 3, "overlap": "allow", "maxAttempts": 4, "retryDelayMs": 2000,
     "retryBackoff": "exponential", "retryMaxDelayMs": 60_000, "leaseMs": 120_000,
     "expiresAt": "2027-01-01T00:00:00Z", "expiresAfterRuns": 5, "pauseAfterFailures": 0, "keepRuns": 7,
     "steerable": True, "minIntervalMs": 2000, "maxIntervalMs": 9000, "gate": {"command": "true", "timeoutMs": 9},
     "workspace": "repo", "workspaceWaitMs": 1000, "requires": ["gpu"],
     "budgetRuns": {"limit": 3, "per": "day"}, "budgetCost": {"limit": 1.5, "per": "week"}},
    {"name": "agent", "schedule": {"type": "dynamic", "minIntervalMs": 60_000},
     "target": {"type": "agent", "provider": "claude", "prompt": "hi", "model": "m", "extraArgs": ["-x"],
                "configIsolation": "none", "promptVia": "argv"}},
    {"name": "once", "schedule": {"type": "once", "at": "2026-03-01T00:00:00Z"},
     "target": {"type": "workflow", "workflowId": "wf1", "timeoutMs": 1000}},
]


@pytest.fixture
def redis() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


@pytest.fixture
def store(redis: fakeredis.FakeRedis) -> LoopStore:
    return LoopStore(redis, Keys())


def changes(redis: fakeredis.FakeRedis) -> list[dict[str, Any]]:
    return [{**fields, "data": json.loads(fields["data"])} for _, fields in redis.xrange("loopsq:changes")]


def everything(redis: fakeredis.FakeRedis) -> dict[str, Any]:
    return {key: redis.dump(key) for key in sorted(redis.keys("*"))}


@pytest.mark.parametrize("body", BODIES, ids=[b["name"] for b in BODIES])
def test_a_loops_own_definition_given_back_changes_nothing(body: dict[str, Any]) -> None:
    loop = new_loop(body, NOW)
    assert new_loop(create_body(loop), NOW, loop_id=loop.id) == loop.with_changes()  # (validated again as is)
    for key in UPDATABLE:
        stored = loop.to_dict().get(key)
        if stored is not None:
            assert updated_loop(loop, {key: create_body(loop)[key]}, LATER, "x") is loop


def test_edit_is_one_loop_updated_change_with_the_new_snapshot(store: LoopStore, redis: fakeredis.FakeRedis) -> None:
    loop = store.create(new_loop(BODIES[0], NOW))
    edited = store.edit(loop.name, {"schedule": {"type": "interval", "everyMs": 60_000}, "maxAttempts": 3}, LATER)
    assert (edited.id, edited.name, edited.created_at, edited.status) == (loop.id, "plain", loop.created_at, "active")
    assert edited.next_run_at == "2026-01-01T00:11:00.000Z"  # one new interval after now, not after creation
    assert edited.updated_at == "2026-01-01T00:10:00.000Z" and edited.max_attempts == 3
    assert Loop.from_json(redis.get(f"loopsq:loop:{loop.id}")) == edited
    last = changes(redis)[-1]
    assert [c["type"] for c in changes(redis)] == ["loop_created", "loop_updated"]
    assert last["data"]["upsert"]["loops"] == [edited.to_dict()]
    before = everything(redis)
    assert store.edit(loop.id, {"maxAttempts": 3}, LATER + timedelta(minutes=1)) == edited  # a no-op
    assert everything(redis) == before


def test_a_field_set_to_null_returns_to_its_default(store: LoopStore) -> None:
    loop = store.create(new_loop({**BODIES[0], "maxAttempts": 5, "description": "d", "requires": ["gpu"]}, NOW))
    edited = store.edit(loop.id, {"maxAttempts": None, "description": None, "requires": None}, LATER)
    assert (edited.max_attempts, edited.description, edited.requires) == (1, None, None)


def test_only_the_schedule_moves_the_next_slot_and_history_counters_stay(store: LoopStore) -> None:
    loop = store.create(new_loop({**BODIES[0], "expiresAfterRuns": 3}, NOW))
    store.client.set(f"loopsq:loop:{loop.id}",
                     loop.with_changes(failure_streak=2, success_streak=1, usage={"runs": 1}).to_json())
    edited = store.edit(loop.id, {"target": {"type": "command", "command": "echo"}}, LATER)
    assert edited.next_run_at == loop.next_run_at
    assert (edited.failure_streak, edited.success_streak, edited.usage) == (2, 1, {"runs": 1})
    assert store.edit(loop.id, {"expiresAfterRuns": None}, LATER).success_streak is None


@pytest.mark.parametrize(("patch", "message"), [
    ([], "loop update must be an object, got []"),
    ({}, "loop update must change at least one field, got {}"),
    ({"name": "x"}, 'name is changed by rename, not update, got "x"'),
    ({"bogus": 1}, 'unknown loop field: "bogus"'),
    ({"schedule": None}, "schedule must not be null, got null"),
    ({"maxAttempts": 0}, "maxAttempts must be a positive integer, got 0"),
    ({"catchUp": "sometimes"}, 'catchUp must be one of none, latest, all, got "sometimes"'),
    ({"schedule": {"type": "interval", "everyMs": 1}}, "interval everyMs must be at least 1000 (1s), got 1"),
    ({"target": {"type": "command"}}, "target.command must be a non-empty string"),  # (as create says it)
    ({"pool": "missing"}, 'pool "missing" does not exist (create it with: loopsq pool set missing --limit N)'),
])
def test_bad_input_names_the_field_and_value_and_writes_nothing(store: LoopStore, redis: fakeredis.FakeRedis,
                                                                 patch: Any, message: str) -> None:
    loop = store.create(new_loop(BODIES[0], NOW))
    before = everything(redis)
    with pytest.raises(ValidationError) as caught:
        store.edit(loop.id, patch, LATER)
    assert caught.value.message == message
    assert everything(redis) == before


def test_an_unknown_or_archived_loop_is_refused(store: LoopStore) -> None:
    with pytest.raises(NotFoundError, match=r"^loop not found: nope$"):
        store.edit("nope", {"maxAttempts": 2}, LATER)
    loop = store.create(new_loop(BODIES[0], NOW))
    store.archive(loop.id, NOW)
    with pytest.raises(ConflictError, match=r"^loop is archived; unarchive it before updating: plain$"):
        store.edit("plain", {"maxAttempts": 2}, LATER)


def test_a_concurrent_write_is_not_lost(store: LoopStore, redis: fakeredis.FakeRedis) -> None:
    """The edit is guarded on the JSON it read: a write in between makes it read again and keep that write."""
    loop = store.create(new_loop(BODIES[0], NOW))
    real_get = redis.get
    reads: list[str] = []

    def racing_get(key: str) -> Any:
        value = real_get(key)
        reads.append(key)
        if len(reads) == 2:  # the edit's read of the loop it changes (the first: looking it up)
            store.pause(loop.id, NOW)  # lands after our read, before our commit
        return value

    redis.get = racing_get  # type: ignore[method-assign]
    edited = store.edit(loop.id, {"maxAttempts": 2}, LATER)
    assert (edited.status, edited.max_attempts) == ("paused", 2)


def test_the_sdk_updates_in_place_and_arms_the_new_schedule(redis: fakeredis.FakeRedis) -> None:
    from loopsq.sdk import LoopsClient

    client = LoopsClient(client=redis)
    created = client.create(BODIES[0])
    edited = client.update("plain", {"schedule": {"type": "interval", "everyMs": 2000}, "maxAttempts": 2})
    assert (edited.id, edited.max_attempts, client.get("plain").schedule.every_ms) == (created.id, 2, 2000)
    job_id = redis.get(f"loopsq:timer:{created.id}")
    assert job_id is not None and f"-{to_ms(from_iso(str(edited.next_run_at)))}-" in job_id
    with pytest.raises(ValidationError, match=r"^maxAttempts must be a positive integer, got 0$"):
        client.update("plain", {"maxAttempts": 0})
    with pytest.raises(NotFoundError, match=r"^loop not found: ghost$"):
        client.update("ghost", {"maxAttempts": 2})
