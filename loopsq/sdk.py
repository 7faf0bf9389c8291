"""``LoopsClient``: the Python SDK for other services — create and manage loops, trigger runs with an
idempotency key, run now, read runs.

    from loopsq.sdk import LoopsClient
    client = LoopsClient("redis://127.0.0.1:6379/0")
    run_id = client.trigger("nightly-report", idempotency_key="order-42")
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from typing import Any

import redis

from loopsq import timers, timeutil
from loopsq.errors import ValidationError
from loopsq.keys import Keys
from loopsq.loop_spec import new_loop
from loopsq.models import Loop
from loopsq.redis_conn import connect
from loopsq.runs import LoopRun
from loopsq.state.commit import Committer, Tx
from loopsq.state.loops import LoopStore
from loopsq.state.runs import RunStore
from loopsq.timeutil import gen_id, to_iso, to_ms

#: How long a trigger's idempotency key stands for its run.
DEFAULT_IDEMPOTENCY_WINDOW_MS = 24 * 3600 * 1000


def trigger_with(
    client: redis.Redis,
    keys: Keys,
    id_or_name: str,
    idempotency_key: str | None,
    *,
    window_ms: int = DEFAULT_IDEMPOTENCY_WINDOW_MS,
    enqueue: bool = True,
) -> tuple[str, bool]:
    """Reserve a triggered run of a loop; returns ``(run_id, created)``.

    With an idempotency key, the first trigger reserves the run id with ``SET NX`` (in the same transition that
    records the trigger) and every later trigger with the same key within ``window_ms`` gets that run id back
    and starts nothing. With ``enqueue`` the run is handed to a worker (``worker.jobs.run_triggered``).
    """
    if idempotency_key is not None and (not isinstance(idempotency_key, str) or not idempotency_key.strip()):
        raise ValidationError(f"idempotency key must be a non-empty string, got {json.dumps(idempotency_key)}")
    if window_ms <= 0:
        raise ValidationError(f"idempotency window must be > 0 ms, got {window_ms}")
    loop = LoopStore(client, keys).require(id_or_name)
    now = timeutil.now()
    run_id = gen_id()
    request = json.dumps({"loopId": loop.id, "at": to_iso(now), "key": idempotency_key})
    tx = Tx("run_triggered", to_iso(now))
    if idempotency_key is not None:
        idem = keys.idempotency(loop.id, idempotency_key)
        tx.expect(idem, None).set(idem, run_id, px=window_ms)
    tx.set(keys.trigger(run_id), request, px=window_ms).zadd(keys.triggers, to_ms(now), run_id)
    if not Committer(client, keys).commit(tx).ok:
        existing = client.get(keys.idempotency(loop.id, str(idempotency_key)))
        if existing:
            return (existing.decode() if isinstance(existing, bytes) else str(existing)), False
        return trigger_with(client, keys, id_or_name, idempotency_key, window_ms=window_ms, enqueue=enqueue)
    if enqueue:
        timers.enqueue(timers.raw_from(client), "worker.jobs.run_triggered", run_id, job_id=f"loopsq-trigger-{run_id}")
    return run_id, True


class LoopsClient:
    """A client of one loopsq deployment (its Redis)."""

    def __init__(self, redis_url: str | None = None, *, client: redis.Redis | None = None,
                 keys: Keys | None = None) -> None:
        from loopsq.config import resolve_redis_url

        self.client = client if client is not None else connect(resolve_redis_url(redis_url))
        self.keys = keys or Keys()
        self.loops = LoopStore(self.client, self.keys)
        self.runs_store = RunStore(self.client, self.keys)

    def create(self, body: Mapping[str, Any]) -> Loop:
        """Create a loop from a camelCase body (``name``, ``schedule``, ``target``, policies)."""
        return self.loops.create(new_loop(body, timeutil.now()))

    def list(self) -> list[Loop]:
        """Every loop."""
        return self.loops.all()

    def get(self, id_or_name: str) -> Loop:
        """One loop; ``NotFoundError('loop not found: …')`` otherwise."""
        return self.loops.require(id_or_name)

    def pause(self, id_or_name: str) -> Loop:
        """Pause a loop."""
        return self.loops.pause(id_or_name, timeutil.now())

    def resume(self, id_or_name: str) -> Loop:
        """Resume a loop (a stopped one is scheduled again)."""
        return self.loops.resume(id_or_name, timeutil.now())

    def stop(self, id_or_name: str) -> Loop:
        """Stop a loop."""
        return self.loops.stop(id_or_name, timeutil.now())

    def delete(self, id_or_name: str) -> Loop:
        """Remove a loop definition."""
        return self.loops.remove(id_or_name, timeutil.now())

    def runs(self, id_or_name: str | None = None, limit: int = 100) -> builtins.list[LoopRun]:
        """Runs, newest first (of one loop when given)."""
        key = self.keys.loop_runs(self.get(id_or_name).id) if id_or_name else self.keys.runs
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in self.client.zrevrange(key, 0, limit - 1)]
        return self.runs_store.get_many(ids)

    def run(self, run_id: str) -> LoopRun | None:
        """One run by id."""
        return self.runs_store.get(run_id)

    def trigger(self, id_or_name: str, idempotency_key: str | None = None,
                window_ms: int = DEFAULT_IDEMPOTENCY_WINDOW_MS) -> str:
        """Start a run of a loop on a worker now; returns its run id.

        The same ``idempotency_key`` within ``window_ms`` (default 24 h) returns the same run id and starts
        nothing new.
        """
        return trigger_with(self.client, self.keys, id_or_name, idempotency_key, window_ms=window_ms)[0]

    def close(self) -> None:
        """Close the connection."""
        self.client.close()
