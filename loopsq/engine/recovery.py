"""Recovery of runs whose owner is gone: abandoned when the lease expired or the worker died, never while the
run's process is alive (host + pid + start time); a worker's share of it on its own host (``reap_host``), which
kills the orphaned process groups there first; workflow runs of their own whose worker died.
"""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Callable
from datetime import datetime
from typing import Any

import redis

from loopsq.domain.run_rules import MANUAL_SOURCES, LoopRun
from loopsq.domain.timeutil import from_iso, to_ms
from loopsq.engine.grace import recovery_paused as recovery_paused  # (re-exported: it lived here)
from loopsq.engine.runner import ensure_timer
from loopsq.engine.runtime import HOST_LIVE_MS, Runtime
from loopsq.state.keys import Keys
from loopsq.state.workflow_run_state import WorkflowRunState
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.system.procs import hostname, is_process_alive, kill_process_group

log = logging.getLogger("loopsq.recovery")

LEASE_EXPIRED = "run lease expired before completion"


def _is_orphan_alive(run: LoopRun, host: str) -> bool:
    return bool(run.host == host and run.pid and is_process_alive(run.pid, run.pid_start_time))


def live_step_processes(rt: Runtime, loop_run_id: str) -> list[tuple[str, int]]:
    """(step id, pid) of the running workflow steps of a loop run whose process is alive on this host.

    With ``maxParallel`` above 1 a workflow loop run has several step processes; the loop run records only the
    last pid, so recovery looks at every running step (host, pid and start time, against pid reuse).
    """
    store = WorkflowRunStore(rt.client, rt.keys, rt.committer)
    out: list[tuple[str, int]] = []
    for wf_run_id in store.for_loop_run(loop_run_id):
        state = store.load(wf_run_id)
        if state is not None and not state.terminal:
            out += _live_steps(state, rt.owner.host)
    return out


def _live_steps(state: WorkflowRunState, host: str) -> list[tuple[str, int]]:
    """(step id, pid) of a workflow run's running steps whose process is alive on ``host`` (pid + start time)."""
    out: list[tuple[str, int]] = []
    for step in state.steps.values():
        pid = step.get("pid")
        if (step.get("status") == "running" and pid and step.get("host") == host
                and is_process_alive(int(pid), step.get("pidStartTime"))):
            out.append((str(step["stepId"]), int(pid)))
    return out


def kill_orphans_of(rt: Runtime, run: LoopRun) -> int:
    """Kill the live process groups (the run's and its workflow steps') a dead owner left on this host."""
    killed = 0
    if _is_orphan_alive(run, rt.owner.host) and run.pid:
        log.warning("killing orphaned process group %d of dead worker %s (run %s)", run.pid, run.worker_id, run.id)
        kill_process_group(run.pid, signal.SIGKILL)
        killed += 1
    for step_id, pid in live_step_processes(rt, run.id):
        log.warning("killing orphaned process group %d of step %s (run %s)", pid, step_id, run.id)
        kill_process_group(pid, signal.SIGKILL)
        killed += 1
    return killed


def recovery_reason(rt: Runtime, run: LoopRun, lease: str | None, worker_alive: bool) -> str | None:
    """Why ``run`` must be recovered now, or None to leave it.

    - Lease expired: recovered, unless its process is alive on this host (checked with the recorded start
      time against pid reuse) — a lease never expires under a live process.
    - Lease live but the worker's liveness key gone (killed, or cut off for longer than the liveness TTL): a
      live orphan on this host is killed first (nobody could record its outcome), then the run is recovered.
    """
    if lease is None:
        if _is_orphan_alive(run, rt.owner.host) or live_step_processes(rt, run.id):
            return None
        return LEASE_EXPIRED
    if worker_alive or run.worker_id is None:
        return None
    kill_orphans_of(rt, run)
    return f"worker {run.worker_id} died before completion"


#: A host without a worker beat for this long leaves the hosts hash (containers get a new host name each time).
HOST_FORGET_MS = 24 * 3600 * 1000


def live_worker_hosts(rt: Runtime, now: datetime) -> set[str]:
    """Hosts where a worker beat within ``HOST_LIVE_MS`` (each reaps its own host: ``reap_host``). Hosts silent
    for ``HOST_FORGET_MS`` are dropped from the hash on the way."""
    beats = {str(host): int(at) for host, at in rt.client.hgetall(rt.keys.hosts).items()}
    old = [host for host, at in beats.items() if at < to_ms(now) - HOST_FORGET_MS]
    if old:
        rt.client.hdel(rt.keys.hosts, *old)
    since = to_ms(now) - HOST_LIVE_MS
    return {host for host, at in beats.items() if at >= since}


def recover_runs(rt: Runtime, now: datetime, live_hosts: set[str] | None = None) -> list[LoopRun]:
    """Abandon running runs whose lease expired or whose worker died; their loops advance (retry if allowed).

    A dead worker's run on another host where a worker is still live is left to that worker (``reap_host``)
    while the run's lease lasts: only there can its process be checked and killed, and a run must never be
    recovered while its process lives. Where no worker is live any more (the host is gone), or once the lease
    has expired, it is recovered from here. ``live_hosts``: ``live_worker_hosts``, when the caller has it.
    """
    running = rt.runs.get_many(rt.runs.running_ids())
    if not running:
        return []
    live = live_hosts if live_hosts is not None else live_worker_hosts(rt, now)
    return _recover(rt, running, now, defer_to=live - {rt.owner.host})


def reap_host(rt: Runtime, now: datetime) -> list[LoopRun]:
    """A worker's share of recovery, on its beat: the runs whose process was started on this host and whose
    worker died (its orphaned process groups killed first), and the workflow runs with steps here. Nothing
    during the grace after an outage (``recovery_paused``)."""
    key = rt.keys.host_runs(rt.owner.host)
    # The runs this worker holds are alive by definition: reading them back every half second would cost about
    # eight commands a second per held run (a worker with 100 slots: 800/s).
    mine = set(rt.held_ids())
    ids = sorted(i for i in (str(i) for i in rt.client.smembers(key)) if i not in mine)
    runs = rt.runs.get_many(ids) if ids else []
    deleted = set(ids) - {run.id for run in runs}
    if deleted:
        rt.client.srem(key, *deleted)  # (a run that ends leaves the set in the same transition)
    running = [run for run in runs if run.status == "running"]
    recovered = _recover(rt, running, now, defer_to=set())
    recovered += _recover_unheld(rt, [run for run in running if run.id not in {r.id for r in recovered}], now)
    recover_workflow_runs(rt, now, host=rt.owner.host)
    return recovered


#: How long after its claim a run this very worker claimed and does not hold is taken for one it will never
#: execute or record. Its claim is held within moments (after ``durability.settle``, up to ``CONFIRM_S``); a run
#: claimed by hand may wait for a pool slot first, so those are left to their lease.
UNHELD_GRACE_MS = 30_000
UNHELD = "claimed by worker {worker}, which does not run it (a reply or a write lost, as in a failover)"


def _recover_unheld(rt: Runtime, running: list[LoopRun], now: datetime) -> list[LoopRun]:
    """Abandon the runs recorded running under this very worker that it does not hold (``reap_host`` passes the
    runs of this host it does not hold), claimed ``UNHELD_GRACE_MS`` ago or more, with no live process.

    The worker is live and their lease unexpired, so nothing else recovers them before the lease runs out (30
    minutes by default), and meanwhile their loop skips every slot as overlapping: a claim whose reply was lost
    (a connection closed under it) or a finalize that a failover discarded left them so (issue 27)."""
    mine = [run for run in running if run.worker_id == rt.owner.worker_id and run.source not in MANUAL_SOURCES
            and run.started_at and to_ms(now) - to_ms(from_iso(run.started_at)) >= UNHELD_GRACE_MS
            and not _is_orphan_alive(run, rt.owner.host) and not live_step_processes(rt, run.id)]
    if not mine or recovery_paused(rt):
        return []
    held = set(rt.held_ids())  # (read again: a run taken since the caller read them is no orphan)
    recovered: list[LoopRun] = []
    for run in mine:
        lease = rt.client.get(rt.keys.lease(run.id))
        if run.id in held or lease is None:
            continue  # (an expired lease is ``_recover``'s)
        reason = UNHELD.format(worker=run.worker_id)
        done = rt.runs.abandon(run.id, now, error=reason,
                               seen_lease=lease.decode() if isinstance(lease, bytes) else str(lease))
        if done is None:
            continue
        final, new_loop = done
        log.warning("run %s abandoned loop=%s slot=%s attempt=%d: %s", final.id, final.loop_name,
                    final.scheduled_for, final.attempt, reason)
        recovered.append(final)
        _fail_child_workflows(rt, final, now, reason)
        if new_loop is not None:
            ensure_timer(rt, new_loop)
    return recovered


def _recover(rt: Runtime, running: list[LoopRun], now: datetime, defer_to: set[str]) -> list[LoopRun]:
    if not running:
        return []
    pipe = rt.client.pipeline(transaction=False)
    for run in running:
        pipe.get(rt.keys.lease(run.id))
        pipe.exists(rt.keys.worker(run.worker_id or "-"))
    replies = pipe.execute()
    suspects: list[tuple[LoopRun, str | None, bool]] = []
    for i, run in enumerate(running):
        lease, alive = replies[2 * i], bool(replies[2 * i + 1])
        lease = lease.decode() if isinstance(lease, bytes) else lease
        if lease is not None and (alive or run.host in defer_to):
            continue
        suspects.append((run, lease, alive))
    # Judged on what was read just now: if Redis was away before that read (even while this pass waited for
    # it), the liveness keys may be gone for that reason alone.
    if not suspects or recovery_paused(rt):
        return []
    recovered: list[LoopRun] = []
    for run, lease, alive in suspects:
        reason = recovery_reason(rt, run, lease, alive)
        if reason is None:
            continue
        done = rt.runs.abandon(run.id, now, error=reason, seen_lease=lease)
        if done is None:
            continue
        final, new_loop = done
        log.info("run %s abandoned loop=%s slot=%s attempt=%d: %s", final.id, final.loop_name, final.scheduled_for,
                 final.attempt, reason)
        recovered.append(final)
        _fail_child_workflows(rt, final, now, reason)
        if new_loop is not None:
            ensure_timer(rt, new_loop)
    return recovered


PARENT_EXPIRED = "parent loop run lease expired before completion"


def recover_workflow_runs(rt: Runtime, now: datetime, host: str | None = None,
                          live_hosts: set[str] | None = None) -> int:
    """Fail the workflow runs of their own (``workflows run``, the API, the SDK) whose worker died: nothing else
    would ever end them. As for a loop run whose worker died, live step processes it left on this host are killed
    first (nobody could record their outcome). Runs of a loop run are left to that run's recovery.

    With ``host`` (a worker reaping its host), only the runs with a step running on that host; without it
    (maintenance), all but those with a step running on another host where a worker is live (left to it;
    ``live_hosts``: ``live_worker_hosts``, when the caller has it).
    """
    ids = sorted(str(i) for i in rt.client.smembers(rt.keys.wf_running))
    if not ids:
        return 0
    # Two round trips for the common case, where every owner lives: the runs, then their owners' liveness.
    runs = [json.loads(raw) if raw else None for raw in rt.client.mget([rt.keys.wf_run(i) for i in ids])]
    ended = [run_id for run_id, run in zip(ids, runs, strict=True) if run is None or run.get("status") != "running"]
    if ended:
        rt.client.srem(rt.keys.wf_running, *ended)  # deleted, or left by an older version
    orphans = [(run_id, str(run["workerId"])) for run_id, run in zip(ids, runs, strict=True)
               if run and run.get("status") == "running" and run.get("workerId") and not run.get("loopRunId")]
    pipe = rt.client.pipeline(transaction=False)
    for _, owner in orphans:
        pipe.exists(rt.keys.worker(owner))
    alive = pipe.execute() if orphans else []
    orphans = [(run_id, owner) for (run_id, owner), live_owner in zip(orphans, alive, strict=True) if not live_owner]
    if not orphans or recovery_paused(rt):
        return 0
    store = WorkflowRunStore(rt.client, rt.keys, rt.committer)
    failed = 0
    for run_id, owner in orphans:
        state = store.load(run_id)
        if state is None or state.terminal:
            rt.client.srem(rt.keys.wf_running, run_id)
            continue
        step_hosts = {str(s["host"]) for s in state.steps.values() if s.get("status") == "running" and s.get("host")}
        if host is not None and host not in step_hosts:
            continue
        if host is None and step_hosts - {rt.owner.host}:
            live_hosts = live_worker_hosts(rt, now) if live_hosts is None else live_hosts
            if step_hosts & live_hosts - {rt.owner.host}:
                continue
        for step_id, pid in _live_steps(state, rt.owner.host):
            log.warning("killing orphaned process group %d of step %s (workflow run %s)", pid, step_id, run_id)
            kill_process_group(pid, signal.SIGKILL)
        error = f"worker {owner} died before completion"
        store.fail_for_owner(run_id, now, error)
        log.info("workflow run %s failed: %s", run_id, error)
        failed += 1
    return failed


def _fail_child_workflows(rt: Runtime, run: LoopRun, now: datetime, reason: str) -> None:
    """A workflow run whose parent loop run was abandoned fails, its open steps skipped (§3.8). The reference's
    message for an expired lease; for a dead worker the run says so."""
    store = WorkflowRunStore(rt.client, rt.keys, rt.committer)
    for wf_run_id in store.for_loop_run(run.id):
        state = store.load(wf_run_id)
        if state is not None and not state.terminal:
            error = PARENT_EXPIRED if reason == LEASE_EXPIRED else f"parent loop run abandoned: {reason}"
            store.fail_for_parent(wf_run_id, run.id, now, error)


def step_alive(client: redis.Redis, keys: Keys, state_run: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """A liveness test for a step's process that is right across hosts: on this host the pid with its start
    time; on another host, whether the worker executing the step is still alive (the step's own worker when
    another worker than the run's ran it: ``engine.remote_steps``)."""
    local = hostname()

    def alive(step: dict[str, Any]) -> bool:
        pid = step.get("pid")
        if not pid:
            return False
        if step.get("host", local) == local:
            return is_process_alive(int(pid), step.get("pidStartTime"))
        worker = step.get("workerId") or state_run.get("workerId")
        return bool(worker and client.exists(keys.worker(worker)))

    return alive
