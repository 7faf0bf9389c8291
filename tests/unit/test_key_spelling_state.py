"""User-chosen names that look like each other's keys (``X`` and ``X:fence``, ``*``, ``{}``, a 100 KB value) live side
by side in Redis: workspace leases, trigger and workflow idempotency keys, pools. Keys an older version wrote under
the raw spelling are still honoured where they matter (a workspace's fence, a pending idempotency key). Each test on
fakeredis and on a real redis-server (``client``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.sdk import LoopsClient
from loopsq.state.keys import MAX_PART_LENGTH, Keys
from loopsq.state.pools import Acquired, PoolStore
from loopsq.state.runs import RunStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.state.workspaces import WorkspaceLeases

KEYS = Keys()
OLD = KEYS.before_encoding
T0 = datetime(2026, 1, 1, tzinfo=UTC)
HUGE = "w" * 100_000
#: Workspace names whose raw spelling is another name's lease, fence counter or queue.
NAMES = ["X", "X:fence", "X:queue", "X:fence:fence", "*", "{}", "{X}:queue", "X%3Afence", HUGE]
#: A key holds at most one user-chosen value, spelled in at most MAX_PART_LENGTH characters, and a few ids.
LONGEST_KEY = MAX_PART_LENGTH + 50


@pytest.fixture
def leases(client: redis.Redis) -> WorkspaceLeases:
    return WorkspaceLeases(RunStore(client, KEYS))


def take(leases: WorkspaceLeases, name: str, holder: str) -> int:
    assert leases.take_own_lease(holder, f"tok-{holder}", 60_000)
    fence, busy = leases.acquire_as(name, holder, f"tok-{holder}", T0)
    assert busy is None and fence is not None, (name, holder, busy)
    return fence


def assert_short_keys(client: redis.Redis) -> None:
    keys = [str(k) for k in client.keys("*")]
    assert keys and max(len(k) for k in keys) <= LONGEST_KEY, sorted(keys, key=len)[-1][:300]


def test_workspaces_named_like_each_others_keys_each_hold_their_own_lease(client: redis.Redis,
                                                                          leases: WorkspaceLeases) -> None:
    for round_ in (1, 2):  # the second time round, each fence counter moves on from its own last value
        for i, name in enumerate(NAMES):
            holder = f"h{round_}-{i}"
            assert take(leases, name, holder) == round_, name
            leases.enqueue(name, f"waiter-{i}", T0)  # each queue is a sorted set of its own
            assert leases.first_waiting(name) is None  # no lease for the waiter: dropped, not another's member
        for i, name in enumerate(NAMES):
            found = leases.live_holder(name)
            assert found is not None and found.run_id == f"h{round_}-{i}" and found.fence == round_, name
            # Another holder finds it busy, held by the right one.
            assert leases.take_own_lease(f"other-{round_}-{i}", "t", 60_000)
            fence, busy = leases.acquire_as(name, f"other-{round_}-{i}", "t", T0)
            assert fence is None and busy is not None and busy.run_id == f"h{round_}-{i}", name
        for i, name in enumerate(NAMES):
            assert leases.release(name, f"h{round_}-{i}", f"tok-h{round_}-{i}")
            leases.drop_own_lease(f"h{round_}-{i}", f"tok-h{round_}-{i}")
            leases.drop_own_lease(f"other-{round_}-{i}", "t")
    assert client.get(KEYS.workspace_fence("X")) == "2" and client.get(KEYS.workspace_fence("X:fence")) == "2"
    assert client.get("loopsq:workspace:X%3Afence:fence") == "2"
    assert_short_keys(client)


def test_a_fence_counted_under_the_raw_spelling_carries_over_so_fences_never_go_back(
        client: redis.Redis, leases: WorkspaceLeases) -> None:
    client.set("loopsq:workspace:repo:web:fence", "41")  # what a version before the encoding counted
    assert take(leases, "repo:web", "a") == 42
    assert client.get("loopsq:workspace:repo%3Aweb:fence") == "42"
    assert client.get("loopsq:workspace:repo:web:fence") == "41"  # left for old processes of a rolling upgrade
    leases.release("repo:web", "a", "tok-a")
    assert take(leases, "repo:web", "b") == 43
    # A plain name has one spelling: its counter is the one it always had, nothing to carry over.
    client.set("loopsq:workspace:repo:fence", "7")
    assert KEYS.workspace_fence("repo") == OLD.workspace_fence("repo") == "loopsq:workspace:repo:fence"
    assert take(leases, "repo", "c") == 8
    # The raw spelling may instead hold another name's lease (``X:fence`` was workspace X's counter too): no number.
    client.set("loopsq:workspace:c:d:fence", "run1|tok|3")
    assert take(leases, "c:d", "d") == 1


def test_trigger_idempotency_keys_that_look_alike_stand_for_runs_of_their_own(client: redis.Redis) -> None:
    sdk = LoopsClient(client=client)
    for name in ("l", "m"):
        sdk.create({"name": name, "schedule": {"type": "interval", "everyMs": 3_600_000},
                    "target": {"type": "command", "command": "true"}})
    keys = ["k", "k:x", "k%3Ax", "k%253Ax", "*", "{}", "{k}", "k x", "é", "x" * 200]
    first = {(loop, key): sdk.trigger(loop, idempotency_key=key) for loop in ("l", "m") for key in keys}
    assert len(set(first.values())) == len(first)
    again = {(loop, key): sdk.trigger(loop, idempotency_key=key) for loop in ("l", "m") for key in keys}
    assert again == first
    loop_id = str(client.hget(KEYS.loop_names, "l"))
    assert client.get(f"loopsq:idem:{loop_id}:k%3Ax") == first[("l", "k:x")]
    assert client.get(f"loopsq:idem:{loop_id}:k%253Ax") == first[("l", "k%3Ax")]
    assert 0 < client.pttl(f"loopsq:idem:{loop_id}:%7Bk%7D") <= 24 * 3_600_000


def test_a_pending_trigger_key_in_the_raw_spelling_still_stands_for_its_run(client: redis.Redis) -> None:
    sdk = LoopsClient(client=client)
    sdk.create({"name": "l", "schedule": {"type": "interval", "everyMs": 3_600_000},
                "target": {"type": "command", "command": "true"}})
    loop_id = str(client.hget(KEYS.loop_names, "l"))
    client.set(f"loopsq:idem:{loop_id}:order:42", "old-run", px=60_000)  # written before the upgrade
    assert sdk.trigger("l", idempotency_key="order:42") == "old-run"
    assert client.exists(f"loopsq:idem:{loop_id}:order%3A42") == 0  # nothing new reserved
    client.set(f"loopsq:idem:{loop_id}:order-42", "plain-run", px=60_000)  # a plain key: the same key both ways
    assert sdk.trigger("l", idempotency_key="order-42") == "plain-run"


def _spec(client: redis.Redis) -> dict[str, Any]:
    body = {"name": "wf", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}
    return WorkflowStore(client, KEYS).create(workflow_body_from_json(body), T0)


def test_workflow_idempotency_keys_that_look_alike_stand_for_runs_of_their_own(client: redis.Redis) -> None:
    spec = _spec(client)
    store = WorkflowRunStore(client, KEYS)
    keys = ["loop1:2026-01-01T00:00:00.000Z:attempt:1", "loop1:2026-01-01T00:00:00.000Z:attempt:1:x", "*", "{}",
            "%", "%25", HUGE, HUGE + "!"]
    runs = {key: store.create(spec, T0, idempotency_key=key) for key in keys}
    assert all(created for _state, created in runs.values())
    assert len({state.run_id for state, _ in runs.values()}) == len(keys)
    for key in keys:
        state, created = store.create(spec, T0, idempotency_key=key)
        assert not created and state.run_id == runs[key][0].run_id
    assert_short_keys(client)


def test_a_workflow_run_an_older_version_keyed_under_the_raw_spelling_is_found_not_started_twice(
        client: redis.Redis) -> None:
    spec = _spec(client)
    store = WorkflowRunStore(client, KEYS)
    key = "loop1:2026-01-01T00:00:00.000Z:attempt:1"  # what a loop run's workflow run is keyed by: it has ":"
    state, _ = store.create(spec, T0, idempotency_key=key)
    client.rename(KEYS.wf_idempotency(spec["id"], key), OLD.wf_idempotency(spec["id"], key))  # as an old one wrote
    assert client.get(f"loopsq:wfidem:{spec['id']}:{key}") == state.run_id
    again, created = store.create(spec, T0, idempotency_key=key)
    assert not created and again.run_id == state.run_id
    assert store.by_idempotency(spec["id"], key) == state.run_id


def test_pools_named_like_each_others_keys_count_their_own_holders(client: redis.Redis) -> None:
    store = PoolStore(client, KEYS)
    names = ["a", "a:holders", "a:b", "a:b:fence", "a/b"]
    for name in names:
        store.set(name, 1)
    for name in names:
        got = store.acquire(name, f"h-{name}", 60_000)
        assert isinstance(got, Acquired), name
    for name in names:
        state = store.state(name)
        assert state is not None and [h.holder for h in state.holders] == [f"h-{name}"], name
    assert client.exists("loopsq:pool:a%3Ab:fence") == 1


def test_deleting_a_pool_removes_what_an_older_version_kept_under_the_raw_spelling(client: redis.Redis) -> None:
    store = PoolStore(client, KEYS)
    store.set("a:b", 1)
    client.set("loopsq:pool:a:b:fence", "123")  # an older version's counter: no TTL
    client.hset("loopsq:pool:a:b:holders", "h", "x|t|1|0")
    assert isinstance(store.acquire("a:b", "h", 60_000), Acquired)
    assert store.delete("a:b")
    assert [k for k in client.keys("loopsq:pool*")] == []
