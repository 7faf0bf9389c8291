"""Loop and workflow stores: atomic transitions, unique names, optimistic updates under races."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.errors import ConflictError, NotFoundError
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.workflows import WorkflowStore

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)
BODY = {"name": "hello", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 10_000},
        "target": {"type": "command", "command": "echo hi", "shell": True}}


def _types(client: redis.Redis) -> list[str]:
    return [fields["type"] for _, fields in client.xrange(KEYS.changes)]


def test_create_stores_the_loop_its_name_and_one_change(client: redis.Redis) -> None:
    loop = LoopStore(client, KEYS).create(new_loop(BODY, T0))
    assert json.loads(client.get(KEYS.loop(loop.id)) or "") == loop.to_dict()
    assert client.hget(KEYS.loop_names, "hello") == loop.id
    assert client.smembers(KEYS.loops) == {loop.id}
    assert _types(client) == ["loop_created"]


def test_a_second_loop_with_the_same_name_is_refused_and_nothing_changes(client: redis.Redis) -> None:
    store = LoopStore(client, KEYS)
    first = store.create(new_loop(BODY, T0))
    with pytest.raises(ConflictError, match=r"^loop name already exists: hello$"):
        store.create(new_loop(BODY, T0))
    assert client.smembers(KEYS.loops) == {first.id}
    assert _types(client) == ["loop_created"]


def test_lifecycle_transitions_each_append_their_change(client: redis.Redis) -> None:
    store = LoopStore(client, KEYS)
    store.create(new_loop(BODY, T0))
    assert store.pause("hello", T0).status == "paused"
    assert store.resume("hello", T0).status == "active"
    stopped = store.stop("hello", T0)
    assert (stopped.status, stopped.next_run_at) == ("stopped", None)
    resumed = store.resume("hello", T0 + timedelta(hours=1))
    assert resumed.next_run_at == "2026-01-01T01:00:10.000Z"
    store.remove("hello", T0)
    assert store.find("hello") is None
    assert client.hlen(KEYS.loop_names) == 0
    assert _types(client) == ["loop_created", "loop_paused", "loop_resumed", "loop_stopped", "loop_resumed",
                              "loop_removed"]


def test_a_removed_name_can_be_used_again(client: redis.Redis) -> None:
    store = LoopStore(client, KEYS)
    store.create(new_loop(BODY, T0))
    store.remove("hello", T0)
    assert store.create(new_loop(BODY, T0)).name == "hello"


def test_unknown_loops_are_not_found(client: redis.Redis) -> None:
    with pytest.raises(NotFoundError, match=r"^loop not found: nope$"):
        LoopStore(client, KEYS).pause("nope", T0)


@pytest.mark.integration
def test_racing_creates_of_one_name_store_exactly_one_loop(real_redis: redis.Redis) -> None:
    outcomes: list[str] = []

    def create() -> None:
        store = LoopStore(redis.Redis(connection_pool=real_redis.connection_pool), KEYS)
        try:
            store.create(new_loop(BODY, T0))
            outcomes.append("ok")
        except ConflictError:
            outcomes.append("conflict")

    threads = [threading.Thread(target=create) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["conflict"] * 15 + ["ok"]
    assert real_redis.scard(KEYS.loops) == 1
    assert _types(real_redis) == ["loop_created"]


@pytest.mark.integration
def test_racing_updates_all_apply_and_each_appends_exactly_one_change(real_redis: redis.Redis) -> None:
    store = LoopStore(real_redis, KEYS)
    store.create(new_loop(BODY, T0))

    def bump(i: int) -> None:
        own = LoopStore(redis.Redis(connection_pool=real_redis.connection_pool), KEYS)
        for _ in range(10):
            own.update("hello", "test_bumped", T0, lambda loop: loop.with_changes(catch_up_limit=loop.catch_up_limit + 1))

    threads = [threading.Thread(target=bump, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(_types(real_redis)) == 1 + 80
    assert store.require("hello").catch_up_limit == 50 + 80  # no update was lost
    last = json.loads(real_redis.xrevrange(KEYS.changes, count=1)[0][1]["data"])["upsert"]["loops"][0]
    assert last == json.loads(real_redis.get(KEYS.loop(last["id"])) or "")


def test_workflow_names_are_unique_among_active_specs_only(client: redis.Redis) -> None:
    wfs = WorkflowStore(client, KEYS)
    body = {"name": "wf", "version": 1, "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}
    first = wfs.create(body, T0)
    with pytest.raises(ConflictError):
        wfs.create(body, T0)
    archived = wfs.archive("wf", T0)
    assert archived["status"] == "archived"
    assert wfs.archive(first["id"], T0)["status"] == "archived"  # archiving twice changes nothing
    second = wfs.create(body, T0)
    assert wfs.require("wf")["id"] == second["id"]
    assert wfs.require(first["id"])["status"] == "archived"
    assert _types(client) == ["workflow_created", "workflow_archived", "workflow_created"]
