"""Who is alive and how far behind things are: whether Redis takes writes, live schedulers and workers, queue
depth, mirror lag, counts,
what Redis's memory holds (used and max memory, eviction policy, bytes per loop and per run in the window), and
the fleet (``engine.fleet``: slots, each queue's backlog, timers overdue).

Shared by ``loopsq doctor`` and ``loopsq status``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import Any

import redis

from loopsq.engine import timers
from loopsq.mirror.follow import mirror_lag
from loopsq.state import run_codec
from loopsq.state.clock import OFFSET_FIELD, offset_text
from loopsq.state.keys import Keys
from loopsq.state.outages import WRITE_PROBE, describe_refusal, refusal


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def writes_refused(client: redis.Redis) -> str | None:
    """Why Redis refuses writes now, in its own words (``OOM command not allowed when used memory >
    'maxmemory'.``), or None when it takes them. A server without script flags (Redis < 7) is judged from
    ``INFO``: used memory over ``maxmemory`` under ``noeviction``, or a read-only replica; one that refuses
    both is taken as taking writes.

    Raises:
        redis.RedisError: Redis cannot be reached (or another error than a refusal).
    """
    try:
        client.eval(WRITE_PROBE, 0)
        return None
    except redis.ResponseError as exc:
        if refusal(exc) is not None:
            return describe_refusal(exc)
        # (Redis < 7 reads the shebang as Lua and fails to compile it; a server may refuse EVAL altogether)
    try:
        info = client.info()
    except redis.ResponseError:  # INFO refused too (a managed Redis that renames it, a test double): no figures
        return None
    maximum = int(info.get("maxmemory", 0) or 0)
    if maximum and int(info.get("used_memory", 0)) > maximum and info.get("maxmemory_policy") == "noeviction":
        return "OOM command not allowed when used memory > 'maxmemory'."
    if info.get("role") == "slave" and int(info.get("slave_read_only", 1) or 0):
        return "READONLY You can't write against a read only replica."
    return None


#: Run keys whose MEMORY USAGE is sampled for the bytes per run in the window (the newest ones).
MEMORY_SAMPLE = 20
#: The most keys of the namespace whose MEMORY USAGE is summed (``namespace_memory``): beyond, the sum is a floor.
NAMESPACE_SCAN_LIMIT = 200_000


def namespace_memory(client: redis.Redis, keys: Keys, limit: int = NAMESPACE_SCAN_LIMIT) -> tuple[int, int, bool]:
    """(bytes, keys, complete): the MEMORY USAGE of the keys of ``keys``' namespace only (``SCAN MATCH <ns>:*``
    and its timer set), so that a deployment sharing its Redis with others counts its own. ``complete`` is False
    when more than ``limit`` keys were found (the figures are then those of the first ``limit``) or MEMORY USAGE
    is refused."""
    names = [keys.scheduled_jobs] if not keys.scheduled_jobs.startswith(keys.namespace + ":") else []
    complete = True
    for key in client.scan_iter(match=keys.pattern, count=1000):
        if len(names) >= limit:
            complete = False
            break
        names.append(key)
    total = 0
    for start in range(0, len(names), 1000):
        pipe = client.pipeline(transaction=False)
        for key in names[start:start + 1000]:
            pipe.memory_usage(key, samples=0)
        try:
            total += sum(int(n) for n in pipe.execute() if n)
        except redis.ResponseError:
            return total, len(names), False
    return total, len(names), complete


def redis_memory(client: redis.Redis, keys: Keys) -> dict[str, Any]:
    """``usedMemory``, ``maxMemory`` (0: no limit) and ``policy`` from ``INFO memory`` (the whole server's);
    ``namespace``, ``namespaceBytes``, ``namespaceKeys`` and ``namespaceComplete`` (``namespace_memory``: this
    deployment's keys only); ``loops`` and ``runs`` (in Redis's windows); ``bytesPerLoop`` (the namespace's bytes
    over its loops) and ``bytesPerRun`` (the mean MEMORY USAGE of the newest run keys), None when there is nothing
    to divide by."""
    try:
        info = client.info("memory")
    except redis.ResponseError:  # INFO refused (a managed Redis that renames it, a test double): no figures
        info = {}
    used, maximum = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0) or 0)
    pipe = client.pipeline(transaction=False)
    pipe.scard(keys.loops)
    pipe.zcard(keys.runs)
    pipe.zrevrange(keys.runs, 0, MEMORY_SAMPLE - 1)
    loops, runs, newest = pipe.execute()
    sizes: list[int] = []
    if newest:
        pipe = client.pipeline(transaction=False)
        for run_id in newest:
            pipe.memory_usage(keys.run(_text(run_id)), samples=0)
        try:
            sizes = [int(n) for n in pipe.execute() if n]
        except redis.ResponseError:
            sizes = []
    own, own_keys, complete = namespace_memory(client, keys)
    return {
        "usedMemory": used, "maxMemory": maximum, "policy": str(info.get("maxmemory_policy", "unknown")),
        "namespace": keys.namespace, "namespaceBytes": own, "namespaceKeys": own_keys, "namespaceComplete": complete,
        "loops": int(loops), "runs": int(runs),
        "bytesPerLoop": own // int(loops) if loops else None,
        "bytesPerRun": sum(sizes) // len(sizes) if sizes else None,
    }


def human_bytes(n: int | None) -> str:
    """``1.5 KB``, ``12.3 MB`` (powers of 1024), ``-`` for None."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"  # pragma: no cover - the loop returns


def memory_line(memory: dict[str, Any]) -> str:
    """One line: used of max (percent), policy, the namespace's own keys, per loop and per run in the window."""
    used, maximum = memory["usedMemory"], memory["maxMemory"]
    of = f" of {human_bytes(maximum)} ({100 * used / maximum:.0f}%)" if maximum else " (no maxmemory)"
    floor = "" if memory["namespaceComplete"] else "at least "
    return (f"{human_bytes(used)}{of}, policy {memory['policy']}; namespace {memory['namespace']}: {floor}"
            f"{human_bytes(memory['namespaceBytes'])} in {memory['namespaceKeys']} keys; "
            f"{human_bytes(memory['bytesPerLoop'])} per loop "
            f"({memory['loops']}), {human_bytes(memory['bytesPerRun'])} per run in the window ({memory['runs']})")


def live_processes(client: redis.Redis, keys: Keys, role: str) -> list[dict[str, Any]]:
    """Liveness records of the live schedulers (``role='scheduler'``) or workers, sorted by id."""
    registry = keys.schedulers if role == "scheduler" else keys.workers
    ids = sorted(_text(i) for i in client.smembers(registry))
    if not ids:
        return []
    key = keys.scheduler if role == "scheduler" else keys.worker
    records = client.mget([key(i) for i in ids])
    return [json.loads(_text(r)) for r in records if r]


def clock_text(record: Mapping[str, Any]) -> str:
    """A liveness record's clock offset (how far its host's clock is ahead of Redis's) for people: ``+30.0 s``;
    ``?`` for a process that publishes none (an older loopsq)."""
    offset = record.get(OFFSET_FIELD)
    return offset_text(float(offset)) if isinstance(offset, int | float) else "?"


def prune_dead(client: redis.Redis, keys: Keys) -> int:
    """Forget registered processes whose liveness key has expired and who hold no running run."""
    removed = 0
    running_owners = set()
    for run in run_codec.load_many(client, [keys.run(_text(i)) for i in client.smembers(keys.running)]):
        running_owners.add(run.worker_id)
    for registry, key in ((keys.workers, keys.worker), (keys.schedulers, keys.scheduler)):
        for member in client.smembers(registry):
            pid = _text(member)
            if not client.exists(key(pid)) and pid not in running_owners:
                client.srem(registry, pid)
                removed += 1
    return removed


def status_report(client: redis.Redis, keys: Keys, conn: sqlite3.Connection | None) -> dict[str, Any]:
    """Everything ``loopsq status`` shows."""
    from loopsq.engine.fleet import read_fleet
    from loopsq.state.loops import LoopStore
    from loopsq.state.runs import RunStore

    raw = timers.raw_from(client)
    loops = LoopStore(client, keys).all()
    by_status: dict[str, int] = {}
    for loop in loops:
        if not loop.archived:  # archived loops are left out of counts (0.3.15)
            by_status[loop.status] = by_status.get(loop.status, 0) + 1
    runs: dict[str, int] = {}
    if conn is not None:
        for row in conn.execute("SELECT status, COUNT(*) FROM loop_runs GROUP BY status ORDER BY status"):
            runs[str(row[0])] = int(row[1])
    running = RunStore(client, keys).get_many(RunStore(client, keys).running_ids())
    return {
        "redisMemory": redis_memory(client, keys),
        "schedulers": live_processes(client, keys, "scheduler"),
        "workers": live_processes(client, keys, "worker"),
        "queueDepth": timers.queue_depth(raw, keys),
        "timersArmed": timers.scheduled_count(raw, keys),
        "mirrorLag": mirror_lag(client, keys, conn) if conn is not None else None,
        "loops": by_status,
        "runs": runs,
        "running": [{"id": r.id, "loop": r.loop_name, "worker": r.worker_id, "host": r.host, "pid": r.pid,
                     "startedAt": r.started_at} for r in running],
        "fleet": read_fleet(client, keys).to_dict(),
    }
