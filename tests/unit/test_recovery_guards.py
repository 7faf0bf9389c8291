"""Recovery's guard for a live process (``engine.recovery``): a run whose lease expired is abandoned only once its
process is gone from this host (host + pid + start time), never while it still runs there.

In-process, on both backends: a real child process stands for the run's target, recorded on the run as a worker
records it (``RunStore.mark_started``); the lease key is deleted as an expiry would.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.engine.recovery import LEASE_EXPIRED, reap_host, recover_runs
from loopsq.engine.runtime import Runtime
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, RunStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.procs import hostname, is_process_alive, process_start_time

KEYS = Keys()
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def target() -> Iterator[subprocess.Popen[bytes]]:
    """A child in a process group of its own, as a run's target runs; killed and reaped at the end."""
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def running_run(client: redis.Redis, pid: int, worker_id: str = "worker:gone") -> Claim:
    """A running run of a new loop, claimed by ``worker_id`` on this host, its process ``pid`` recorded."""
    body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 10_000},
            "target": {"type": "command", "command": "true"}}
    loop_id = LoopStore(client, KEYS).create(new_loop(body, T0)).id
    store = RunStore(client, KEYS)
    now = datetime.now(UTC)
    claim = store.claim(loop_id, T0 + timedelta(seconds=10), Owner(worker_id, hostname(), 1), now)
    assert isinstance(claim, Claim), claim
    assert store.mark_started(claim.run.id, claim.token, now, pid=pid, pid_start_time=process_start_time(pid),
                              host=hostname()) is not None
    return claim


@pytest.mark.parametrize("reaper", ["maintenance", "reap_host"])
def test_a_run_whose_lease_expired_is_not_abandoned_while_its_process_lives_on_this_host(
    client: redis.Redis, target: subprocess.Popen[bytes], reaper: str
) -> None:
    claim = running_run(client, target.pid)
    client.delete(KEYS.lease(claim.run.id))  # the lease expired (its worker's liveness key is gone too)
    store = RunStore(client, KEYS)
    role = "scheduler" if reaper == "maintenance" else "worker"
    rt = Runtime(client=client, keys=KEYS, role=role)
    assert rt.owner.host == claim.run.host == hostname()

    def recover() -> list[str]:
        now = datetime.now(UTC)
        found = recover_runs(rt, now, live_hosts=set()) if reaper == "maintenance" else reap_host(rt, now)
        return [run.id for run in found]

    assert recover() == []
    assert recover() == []  # (and again: nothing changes while the process goes on)
    run = store.get(claim.run.id)
    assert run is not None and (run.status, run.attempt) == ("running", 1), run
    assert is_process_alive(target.pid, run.pid_start_time)  # left alone, not killed
    assert [f["type"] for _, f in client.xrange(KEYS.changes) if f["type"] == "run_abandoned"] == []

    target.kill()
    target.wait(timeout=10)
    assert recover() == [claim.run.id]
    run = store.get(claim.run.id)
    assert run is not None and (run.status, run.error) == ("abandoned", LEASE_EXPIRED), run


def test_a_workflow_loop_run_whose_lease_expired_is_not_abandoned_while_a_step_process_lives_on_this_host(
    client: redis.Redis, target: subprocess.Popen[bytes]
) -> None:
    # With maxParallel above 1 the loop run records no pid of its own that tells: its steps' processes do.
    body = {"name": "l", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 10_000},
            "target": {"type": "command", "command": "true"}}
    loop = LoopStore(client, KEYS).create(new_loop(body, T0))
    store = RunStore(client, KEYS)
    claim = store.claim(loop.id, T0 + timedelta(seconds=10), Owner("worker:gone", hostname(), 1), datetime.now(UTC))
    assert isinstance(claim, Claim), claim
    spec = WorkflowStore(client, KEYS).create(workflow_body_from_json({"name": "w", "steps": [
        {"id": "a", "target": {"type": "command", "command": "true"}},
        {"id": "b", "target": {"type": "command", "command": "true"}}]}), T0)
    workflows = WorkflowRunStore(client, KEYS)
    state, _ = workflows.create(spec, T0, loop=loop.to_dict(), loop_run=claim.run.to_dict(), owner="worker:gone")
    assert workflows.start_step(state, "a", T0) is True
    workflows.mark_step_pid(state, "a", T0, pid=target.pid, start_time=process_start_time(target.pid),
                            host=hostname())
    client.delete(KEYS.lease(claim.run.id))
    rt = Runtime(client=client, keys=KEYS, role="scheduler")

    assert recover_runs(rt, datetime.now(UTC), live_hosts=set()) == []
    run = store.get(claim.run.id)
    assert run is not None and run.status == "running", run
    assert is_process_alive(target.pid)

    target.kill()
    target.wait(timeout=10)
    assert [r.id for r in recover_runs(rt, datetime.now(UTC), live_hosts=set())] == [claim.run.id]
