"""Who is alive and how far behind things are: live schedulers and workers, queue depth, mirror lag, counts.

Shared by ``loopsq doctor`` and ``loopsq status``.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import redis

from loopsq.engine import timers
from loopsq.mirror.follow import mirror_lag
from loopsq.state.keys import Keys


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def live_processes(client: redis.Redis, keys: Keys, role: str) -> list[dict[str, Any]]:
    """Liveness records of the live schedulers (``role='scheduler'``) or workers, sorted by id."""
    registry = keys.schedulers if role == "scheduler" else keys.workers
    ids = sorted(_text(i) for i in client.smembers(registry))
    if not ids:
        return []
    key = keys.scheduler if role == "scheduler" else keys.worker
    records = client.mget([key(i) for i in ids])
    return [json.loads(_text(r)) for r in records if r]


def prune_dead(client: redis.Redis, keys: Keys) -> int:
    """Forget registered processes whose liveness key has expired and who hold no running run."""
    removed = 0
    running_owners = set()
    for raw in client.mget([keys.run(_text(i)) for i in client.smembers(keys.running)] or ["-"]):
        if raw:
            running_owners.add(json.loads(_text(raw)).get("workerId"))
    for registry, key in ((keys.workers, keys.worker), (keys.schedulers, keys.scheduler)):
        for member in client.smembers(registry):
            pid = _text(member)
            if not client.exists(key(pid)) and pid not in running_owners:
                client.srem(registry, pid)
                removed += 1
    return removed


def status_report(client: redis.Redis, keys: Keys, conn: sqlite3.Connection | None) -> dict[str, Any]:
    """Everything ``loopsq status`` shows."""
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
        "schedulers": live_processes(client, keys, "scheduler"),
        "workers": live_processes(client, keys, "worker"),
        "queueDepth": timers.queue_depth(raw),
        "timersArmed": timers.scheduled_count(raw),
        "mirrorLag": mirror_lag(client, keys, conn) if conn is not None else None,
        "loops": by_status,
        "runs": runs,
        "running": [{"id": r.id, "loop": r.loop_name, "worker": r.worker_id, "host": r.host, "pid": r.pid,
                     "startedAt": r.started_at} for r in running],
    }
