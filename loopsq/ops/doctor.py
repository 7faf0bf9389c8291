"""``loopsq doctor``: checks that fit loopsq (reference §4.5, adapted): Redis (its memory and eviction policy
too), the data dir, the mirror and the mirror groups, live schedulers and workers (with what each can run), every
active loop judged against the live workers, loops the progress watchdog found stalled (``engine.stalls``: not
repaired fails, repaired within the hour warns), and the fleet's backlog: each queue (runs no live worker can take
fail; a run waiting past ``LOOPSQ_QUEUE_AGE_WARN`` warns) and the timers overdue.

What runs a loop is a worker, whose ``PATH`` may differ from the caller's: each active loop is judged against what
the live workers publish (``loopsq.ops.fit``). The caller's own checks (provider CLIs, the accounts CLI, a
preflight of each loop) are still shown, labelled ``local``."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

from loopsq.domain.durations import duration_setting, format_duration
from loopsq.domain.stalls import Stall
from loopsq.domain.timeutil import now
from loopsq.engine import stalls
from loopsq.engine.fleet import FleetQueue, FleetSnapshot, age_text, read_fleet
from loopsq.errors import LoopsqError
from loopsq.executor import PROVIDER_EXECUTABLES
from loopsq.ops.fit import WorkflowSource, describe_worker, executable_targets, fit
from loopsq.ops.health import writes_refused
from loopsq.state import clock
from loopsq.state.connection import connect, server_version
from loopsq.state.keys import Keys
from loopsq.state.outages import describe_refusal, refusal
from loopsq.system import config
from loopsq.system.exec_path import normalize_execution_path


@dataclass(frozen=True)
class Check:
    """One check: ``ok``, ``warn`` or ``fail``, a message, and an optional detail."""

    id: str
    status: str
    message: str
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "status": self.status, "message": self.message}
        if self.detail:
            out["detail"] = self.detail
        return out

    def line(self) -> str:
        text = f"{self.status:<4} {self.id:<22} {self.message}"
        return text + (f" ({self.detail})" if self.detail else "")


def check_data_dir(data_dir: Path) -> Check:
    """The data directory can be created and written."""
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=data_dir, prefix=".doctor-"):
            pass
        return Check("data-dir", "ok", "data directory is writable", str(data_dir))
    except OSError as exc:
        return Check("data-dir", "fail", "data directory is not writable", f"{data_dir}: {exc.strerror or exc}")


def check_tools(env: dict[str, str] | None = None) -> list[Check]:
    """The accounts CLI and each provider CLI on the PATH targets run with (``normalize_execution_path``; warnings:
    only loops that use them need them)."""
    path = normalize_execution_path(env if env is not None else os.environ)
    checks = []
    accounts = shutil.which("accounts", path=path)
    ok = False
    if accounts:
        try:
            ok = subprocess.run([accounts, "--version"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
    checks.append(Check("accounts", "ok", "local: accounts CLI is available") if ok else
                  Check("accounts", "warn", "local: accounts CLI is not available here"))
    for cmd in dict.fromkeys(PROVIDER_EXECUTABLES.values()):
        found = shutil.which(cmd, path=path)
        checks.append(Check(f"provider:{cmd}", "ok", f"local: {cmd} is available", found) if found else
                      Check(f"provider:{cmd}", "warn", f"local: {cmd} is not on PATH"))
    return checks


def run_doctor(url: str, data_dir: Path, keys: Keys | None = None) -> tuple[bool, list[Check]]:
    """Every check; ``ok`` is False when any check failed.

    Raises:
        ValidationError: ``LOOPSQ_QUEUE_AGE_WARN`` is not a duration above zero (before anything is checked).
    """
    keys = keys or Keys()
    age_warn_ms = queue_age_warn_ms()
    checks: list[Check] = []
    try:
        client = connect(url)
        checks.append(Check("redis", "ok", f"redis is reachable (version {server_version(client)})"))
    except LoopsqError as exc:
        checks.append(Check("redis", "fail", exc.message))
        client = None
    if client is not None:
        try:
            refused = writes_refused(client)
        except redis.RedisError as exc:
            refused = describe_refusal(exc) if refusal(exc) is not None else None
        if refused is not None:  # reachable, but runs cannot be recorded until it takes writes again
            checks.append(Check("redis", "fail", f"writes refused: {refused}"))
    checks.append(check_data_dir(data_dir))
    if client is not None:
        try:
            checks.extend(_redis_checks(client, keys, data_dir, age_warn_ms))
        except redis.RedisError as exc:
            checks.append(Check("redis", "fail", f"redis failed during checks: {exc}"))
    checks.extend(check_tools())
    return all(c.status != "fail" for c in checks), checks


def _redis_checks(client: redis.Redis, keys: Keys, data_dir: Path, age_warn_ms: int) -> list[Check]:
    from loopsq.engine.routing import loop_queue
    from loopsq.executor.preflight import preflight_loop_target
    from loopsq.mirror.follow import mirror_lag
    from loopsq.mirror.schema import open_db
    from loopsq.ops.health import live_processes
    from loopsq.state.loops import LoopStore
    from loopsq.state.workflows import WorkflowStore

    checks: list[Check] = []
    path = config.mirror_path(data_dir)
    if path.exists():
        try:
            conn = open_db(path)
            lag = mirror_lag(client, keys, conn)
            conn.close()
            checks.append(Check("mirror", "ok", "mirror is current", str(path)) if lag == 0 else
                          Check("mirror", "warn", f"mirror is {lag} change(s) behind; run `loopsq mirror`", str(path)))
        except (LoopsqError, OSError) as exc:
            checks.append(Check("mirror", "fail", "mirror database cannot be opened", f"{path}: {exc}"))
    else:
        checks.append(Check("mirror", "ok", "mirror not created yet (any read creates it)", str(path)))
    workers: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    for role in ("scheduler", "worker"):
        live = live_processes(client, keys, role)
        processes += live
        if live:
            hosts = ", ".join(sorted({f"{p['host']}:{p['pid']}" for p in live}))
            checks.append(Check(role, "ok", f"{len(live)} {role}(s) alive", hosts))
        else:
            checks.append(Check(role, "warn", f"no {role} is running; start `loopsq {role}`"))
        if role == "worker":
            workers = live
            for record in live:
                can = record.get("can")
                search = can.get("path") if isinstance(can, dict) else None
                # A worker's id already starts with its role (``worker:<host>:<pid>:<suffix>``): show it as is.
                rid = str(record["id"])
                checks.append(Check(rid if rid.startswith("worker:") else f"worker:{rid}", "ok", describe_worker(record),
                                    f"PATH {search}" if search else None))
    checks.extend(clock_checks(processes))
    checks.extend(memory_checks(client, keys))
    failed = sum(1 for run in _recent_failed(client, keys))
    checks.append(Check("loop-runs", "ok", "no failed loop runs recorded") if failed == 0 else
                  Check("loop-runs", "warn", f"{failed} failed loop run(s) recorded"))

    class _Workflows:
        def workflows(self) -> WorkflowStore:
            return WorkflowStore(client, keys)

    needed: dict[str, list[str]] = {}
    loops = LoopStore(client, keys).all()
    checks.extend(stall_checks(stalls.records(client, keys), {loop.id: loop.name for loop in loops}, now()))
    for loop in loops:
        if loop.status != "active":
            continue
        needed.setdefault(loop_queue(loop, keys), []).append(loop.name)
        checks.append(_workers_check(client, keys, loop.id, loop.name, loop.target, WorkflowStore(client, keys),
                                     workers))
        try:
            preflight_loop_target(loop.target, loop, _Workflows())
            checks.append(Check(f"loop:{loop.id}:local", "ok", f"local: active loop target is ready: {loop.name}"))
        except LoopsqError as exc:
            checks.append(Check(f"loop:{loop.id}:local", "warn",
                                f"local: active loop target preflight failed: {loop.name}",
                                exc.message.removeprefix("preflight failed: ")))
    checks.extend(fleet_checks(read_fleet(client, keys), needed, age_warn_ms))
    return checks


def stall_checks(records: Mapping[str, Stall], names: Mapping[str, str], at: datetime) -> list[Check]:
    """The progress watchdog's records (``engine.stalls``): a loop found stalled and not repaired **fails**; one
    repaired within the last hour **warns**; none of either is one ``ok`` line."""
    checks: list[Check] = []
    for loop_id, stall in sorted(records.items()):
        name = names.get(loop_id)
        if name is None:
            continue  # deleted since
        check_id = f"loop:{loop_id}:stall"
        if not stall.repaired:
            checks.append(Check(check_id, "fail", f"loop is stalled and was not repaired: {name}",
                                f"{stall.text()}; found at {stall.at}"))
        elif stall.is_recent(at):
            checks.append(Check(check_id, "warn", f"loop was stalled and has been repaired: {name}",
                                f"{stall.text()}; repaired at {stall.at}"))
    return checks or [Check("stalls", "ok", "no loop stalled within the last hour")]


def clock_checks(records: list[dict[str, Any]]) -> list[Check]:
    """Each live process whose host clock is off Redis's by more than ``clock.WARN_MS`` (its published offset)
    **warns**, one line naming it and the offset: loopsq judges time on Redis's clock, so nothing runs early, but
    the host's other software does not. Otherwise one ``ok`` line with the largest offset."""
    checks: list[Check] = []
    largest = 0.0
    for record in records:
        offset = record.get(clock.OFFSET_FIELD)
        if not isinstance(offset, int | float):
            continue
        largest = max(largest, abs(offset))
        if abs(offset) > clock.WARN_MS:
            rid, role = str(record["id"]), str(record.get("role", "process"))
            name = rid if rid.startswith(f"{role}:") else f"{role}:{rid}"
            checks.append(Check(f"clock:{name}", "warn", f"{name} clock is {clock.offset_text(offset)} off Redis's "
                                f"(over {clock.WARN_MS / 1000:.0f} s); fix the time sync of host {record.get('host')}"))
    return checks or [Check("clock", "ok", f"process clocks within {clock.WARN_MS / 1000:.0f} s of Redis's "
                            f"(largest offset {clock.offset_text(largest).lstrip('+')})")]


#: Memory use (of ``maxmemory``) from which doctor warns.
MEMORY_WARN_RATIO = 0.8


def memory_checks(client: redis.Redis, keys: Keys) -> list[Check]:
    """Redis memory (warn from 80% of ``maxmemory``), its eviction policy (anything but ``noeviction`` fails), and
    the mirror groups on the change stream (one idle past ``LOOPSQ_MIRROR_IDLE`` is named)."""
    from loopsq.ops.health import memory_line, redis_memory
    from loopsq.state.stream_trim import mirror_groups
    from loopsq.system import limits

    memory = redis_memory(client, keys)
    line = memory_line(memory)
    used, maximum, policy = memory["usedMemory"], memory["maxMemory"], memory["policy"]
    checks = [
        Check("redis-memory", "warn", f"redis memory is above {MEMORY_WARN_RATIO:.0%} of maxmemory: {line}",
              "lower --keep-runs or LOOPSQ_KEEP_RUNS, or raise maxmemory")
        if maximum and used >= MEMORY_WARN_RATIO * maximum else Check("redis-memory", "ok", f"redis memory: {line}"),
        Check("redis-eviction", "ok", "maxmemory-policy is noeviction") if policy == "noeviction" else
        Check("redis-eviction", "fail", f"maxmemory-policy is {policy}, not noeviction: an LRU policy silently "
              "evicts leases and claims, which breaks exactly-once", "set maxmemory-policy noeviction"),
    ]
    idle_ms = limits.mirror_idle_ms()
    groups = mirror_groups(client, keys, idle_ms)
    for group in groups:
        if group.idle:
            since = ("has no consumer" if group.idle_ms is None
                     else f"idle for {format_duration(group.idle_ms // 1000 * 1000 or 1000)}")
            checks.append(Check(f"mirror-group:{group.name}", "warn",
                                f"mirror group {group.name} {since} (over LOOPSQ_MIRROR_IDLE="
                                f"{format_duration(idle_ms)}): it no longer holds the change stream back",
                                f"if its mirror is gone: XGROUP DESTROY {keys.changes} {group.name}"))
    live = [g for g in groups if not g.idle]
    checks.append(Check("mirror-groups", "ok", f"{len(live)} mirror group(s) following the change stream",
                        ", ".join(g.name for g in live) or None))
    return checks


def _workers_check(client: redis.Redis, keys: Keys, loop_id: str, name: str, target: dict[str, Any],
                   workflows: WorkflowSource, workers: list[dict[str, Any]]) -> Check:
    """Can a live worker run the loop? ``fail`` when none can (every run would fail), ``warn`` when none is
    live or none can tell."""
    check_id = f"loop:{loop_id}:workers"
    if not workers:
        return Check(check_id, "warn", f"no live worker to run it: {name}")
    try:
        result = fit(client, keys, executable_targets(target, workflows), workers)
    except LoopsqError as exc:
        return Check(check_id, "fail", f"no live worker can run it: {name}", exc.message)
    if result.can:
        return Check(check_id, "ok", f"{len(result.can)} of {result.live} live worker(s) can run it: {name}",
                     result.summary() or None)
    if result.cannot:
        return Check(check_id, "fail", f"no live worker can run it: {name}", result.summary())
    return Check(check_id, "warn", f"no live worker can tell whether it can run it: {name}", result.summary())


def _recent_failed(client: redis.Redis, keys: Keys) -> list[str]:
    from loopsq.state.runs import RunStore

    ids = [i.decode() if isinstance(i, bytes) else str(i) for i in client.zrevrange(keys.runs, 0, 9999)]
    return [r.id for r in RunStore(client, keys).get_many(ids) if r.status == "failed"]


QUEUE_AGE_WARN_ENV = "LOOPSQ_QUEUE_AGE_WARN"
#: How long the oldest run in a queue may wait before doctor warns (``LOOPSQ_QUEUE_AGE_WARN``).
DEFAULT_QUEUE_AGE_WARN_MS = 60_000
#: Active loops named in a check's detail at most.
NAMED_LOOPS = 3


def queue_age_warn_ms(env: Mapping[str, str] | None = None) -> int:
    """``LOOPSQ_QUEUE_AGE_WARN`` (a duration such as ``60s``) in ms, default 60 s.

    Raises:
        ValidationError: a value that is not a duration above zero, naming the variable and quoting the value.
    """
    return duration_setting(os.environ if env is None else env, QUEUE_AGE_WARN_ENV, DEFAULT_QUEUE_AGE_WARN_MS, "60s")


def fleet_checks(fleet: FleetSnapshot, needed: Mapping[str, list[str]], age_warn_ms: int) -> list[Check]:
    """A check per queue (``queue:<name>``) and one of the timers.

    A queue **fails** when no live worker satisfies its requirement set while runs wait there, or while an active
    loop routes its runs there (``needed``: queue -> active loop names) and workers are live (none live at all: a
    warning, as ``worker`` warns already). A served queue whose oldest run has waited past ``age_warn_ms``
    **warns**: its workers' slots are full. Timers past their time (``engine.fleet.OVERDUE_AFTER_MS``) warn: no
    scheduler is moving them.
    """
    checks = [_queue_check(fleet, queue, needed.get(queue.name, []), age_warn_ms) for queue in fleet.queues]
    timers = fleet.timers
    checks.append(
        Check("timers", "warn", f"{timers.overdue} armed timer(s) past their time, the oldest by "
              f"{age_text(timers.oldest_late_ms)}: is a scheduler running?") if timers.overdue else
        Check("timers", "ok", f"{timers.armed} timer(s) armed, none overdue"))
    return checks


def _queue_check(fleet: FleetSnapshot, queue: FleetQueue, loops: list[str], age_warn_ms: int) -> Check:
    check_id = f"queue:{queue.name}"
    waiting = f"{queue.depth} run(s) waiting"
    if queue.oldest_age_ms is not None:
        waiting += f", oldest {age_text(queue.oldest_age_ms)}"
    if queue.unserved:
        parts = [waiting] if queue.depth else []
        if loops:
            more = f" and {len(loops) - NAMED_LOOPS} more" if len(loops) > NAMED_LOOPS else ""
            parts.append(f"needed by active loop(s): {', '.join(loops[:NAMED_LOOPS])}{more}")
        if queue.depth or (loops and fleet.workers):
            return Check(check_id, "fail", queue.why_unserved(), "; ".join(parts))
        if loops:
            return Check(check_id, "warn", queue.why_unserved(), "; ".join(parts))
        return Check(check_id, "ok", f"{waiting}; no live worker serves it, no active loop needs it")
    serving = fleet.serving(queue)
    slots = (f"{sum(w.busy for w in serving)} of {sum(w.slots for w in serving)} slots busy on the "
             f"{len(serving)} live worker(s) serving it")
    if queue.oldest_age_ms is not None and queue.oldest_age_ms > age_warn_ms:
        return Check(check_id, "warn", f"oldest waiting run has waited {age_text(queue.oldest_age_ms)}, over "
                     f"{QUEUE_AGE_WARN_ENV}={format_duration(age_warn_ms)}", f"{queue.depth} run(s) waiting; {slots}")
    return Check(check_id, "ok", waiting, slots)
