"""A workflow step's workspace (``engine.step_workspaces``) is held under the step's own lease: a step whose own
lease is lost, or cannot be taken, never runs without the workspace. It is not started (the block gets the error
the step fails with) when the lease is lost before the workspace is taken, and it is stopped (its cancel event
set) when the lease is lost while it runs."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from loopsq.engine import step_workspaces
from loopsq.engine.step_workspaces import holder_id, step_workspace
from loopsq.state.commit import CommitResult, Committer, Tx
from loopsq.state.keys import Keys
from loopsq.state.runs import RunStore
from loopsq.state.workspaces import WorkspaceLeases

KEYS = Keys()
WS = "repo"
HOLDER = holder_id("wr1", "edit")


class LosesLeaseBeforeAcquiring(Committer):
    """Deletes the step's own lease (as if it expired) right before the workspace acquisition commits."""

    def commit(self, tx: Tx, **options: Any) -> CommitResult:
        if tx.type == "workspace_acquired":
            self.client.delete(KEYS.lease(HOLDER))
        return super().commit(tx, **options)


def enter(store: RunStore, cancel: threading.Event | None = None, wait_ms: int | None = None) -> list[str | None]:
    """Enter the step's workspace block; what it yielded, and whether the block ran (``"ran"`` appended)."""
    seen: list[str | None] = []
    with step_workspace(store, WS, "wr1", "edit", wait_ms=wait_ms, cancel=cancel or threading.Event()) as busy:
        seen.append(busy)
        if busy is None:
            seen.append("ran")
    return seen


def test_a_step_whose_own_lease_is_held_under_another_token_is_not_started(client: redis.Redis) -> None:
    store = RunStore(client, KEYS)
    assert WorkspaceLeases(store).take_own_lease(HOLDER, "someone-else", 10_000)
    assert enter(store) == [f"workspace {WS}: could not take the step's own lease"]
    assert client.get(KEYS.workspace(WS)) is None
    assert client.get(KEYS.lease(HOLDER)) == "someone-else"  # not dropped: it is not ours


def test_a_step_whose_own_lease_is_lost_before_it_takes_the_workspace_is_not_started(client: redis.Redis) -> None:
    store = RunStore(client, KEYS, LosesLeaseBeforeAcquiring(client, KEYS))
    assert enter(store) == [f"workspace {WS}: the step's own lease was lost"]
    assert client.get(KEYS.workspace(WS)) is None


def test_a_step_whose_own_lease_is_lost_while_it_waits_for_the_workspace_is_not_started(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(client, KEYS)
    leases = WorkspaceLeases(store)
    other = holder_id("wr0", "edit")
    assert leases.take_own_lease(other, "t0", 60_000)
    assert leases.acquire_as(WS, other, "t0", datetime.now(UTC)) == (1, None)
    original = leases.first_waiting

    def first_waiting(key: str) -> str | None:
        # The step's turn comes (the other holder gives the workspace up) just as its own lease is gone.
        assert leases.release(WS, other, "t0")
        turn = original(key)
        client.delete(KEYS.lease(HOLDER))
        return turn

    monkeypatch.setattr(WorkspaceLeases, "first_waiting", lambda _self, key: first_waiting(key))
    assert enter(store, wait_ms=30_000) == [f"workspace {WS}: the step's own lease was lost"]
    assert client.get(KEYS.workspace(WS)) is None


def test_a_step_whose_own_lease_is_lost_while_it_runs_is_stopped(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_workspaces, "STEP_LEASE_MS", 300)  # beaten every 100 ms
    store = RunStore(client, KEYS)
    cancel = threading.Event()
    with step_workspace(store, WS, "wr1", "edit", wait_ms=None, cancel=cancel) as busy:
        assert busy is None
        assert client.get(KEYS.workspace(WS)) is not None
        client.delete(KEYS.lease(HOLDER))  # expired: the worker could not beat it (frozen, or cut off)
        assert cancel.wait(10), "the step went on running without its workspace"


def test_a_step_whose_own_lease_is_lost_while_it_waits_stops_waiting_and_is_not_started(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(step_workspaces, "STEP_LEASE_MS", 300)  # beaten every 100 ms
    store = RunStore(client, KEYS)
    leases = WorkspaceLeases(store)
    other = holder_id("wr0", "edit")
    assert leases.take_own_lease(other, "t0", 60_000)
    assert leases.acquire_as(WS, other, "t0", datetime.now(UTC)) == (1, None)
    original = leases.first_waiting

    def first_waiting(key: str) -> str | None:
        client.delete(KEYS.lease(HOLDER))  # expired while it waited; the beat finds out
        return original(key)

    monkeypatch.setattr(WorkspaceLeases, "first_waiting", lambda _self, key: first_waiting(key))
    cancel = threading.Event()
    assert enter(store, cancel, wait_ms=15_000) == [f"workspace {WS}: the step's own lease was lost"]
    assert cancel.is_set()
    assert client.get(KEYS.workspace(WS)) == f"{other}|t0|1"
