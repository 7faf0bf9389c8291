"""Placement: which RQ queue a run goes to, and which queues a worker listens on.

A run is routed through RQ's own multi-queue dequeue: it goes to the queue of its requirement set
(``domain.labels``), and a worker listens on every queue whose requirements its labels satisfy, most specific
first (a worker with a GPU serves GPU runs before anyone's), the base queue last. Queues are found in the queue
registry (``keys.queues``), which every arm and enqueue of a new requirement set writes, so a worker picks up a
requirement set created while it runs within ``QUEUE_REFRESH_S``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis

from loopsq.domain import labels
from loopsq.domain.models import Loop
from loopsq.engine import timers
from loopsq.executor.spec import PROVIDER_EXECUTABLES
from loopsq.state.keys import Keys

#: How often a worker looks for requirement sets created since (one HKEYS).
QUEUE_REFRESH_S = 1.0


def loop_requirements(loop: Loop) -> tuple[str, ...]:
    """What a run of ``loop`` needs of its worker (its ``requires`` and, for an agent, its provider)."""
    return labels.requirement_set(loop.target, loop.requires or ())


def loop_queue(loop: Loop, keys: Keys) -> str:
    """The RQ queue of ``loop``'s runs in ``keys``' namespace."""
    return labels.queue_name(loop_requirements(loop), keys.base_queue)


def workflow_queue(spec: Mapping[str, Any], keys: Keys) -> str:
    """The RQ queue of a workflow run of its own (its spec's top-level ``requires``) in ``keys``' namespace."""
    return labels.queue_name(labels.requirement_set(None, spec.get("requires") or ()), keys.base_queue)


def worker_labels(can: Mapping[str, Any], host: str, declared: Iterable[str]) -> list[str]:
    """A worker's labels: ``host:<host>``, ``provider:<p>`` for each provider CLI on its targets' PATH (``can``:
    ``executor.capabilities.probe``), and the declared ones."""
    tools = can.get("tools") or {}
    found = {labels.provider_label(provider) for provider, executable in PROVIDER_EXECUTABLES.items()
             if executable in tools}
    return sorted({labels.host_label(host), *found, *declared})


def listening_order(queues: Mapping[str, tuple[str, ...]], worker: Iterable[str]) -> list[str]:
    """The queues a worker with labels ``worker`` serves, most requirements first, the base queue last."""
    have = set(worker)
    served = [name for name, needs in queues.items() if labels.satisfies(have, needs)]
    return sorted(served, key=lambda name: (-len(queues[name]), name))


class QueueWatch:
    """The queues one worker listens on, refreshed from the registry at most every ``QUEUE_REFRESH_S``."""

    def __init__(self, client: redis.Redis, keys: Keys, worker: Iterable[str]) -> None:
        self.client, self.keys = client, keys
        self.labels = sorted(set(worker))
        self._lock = threading.Lock()
        self._names: list[str] = [keys.base_queue]
        self._next = 0.0

    def names(self) -> list[str]:
        """The queue names to listen on now (a failed refresh keeps the last known ones)."""
        with self._lock:
            now = time.monotonic()
            if now >= self._next:
                self._next = now + QUEUE_REFRESH_S
                # (On an error the dequeue itself meets the outage and reports it.)
                with contextlib.suppress(redis.RedisError):
                    self._names = listening_order(timers.registered_queues(self.client, self.keys), self.labels)
            return list(self._names)


def enqueue_for_loop(client: redis.Redis, keys: Keys, loop: Loop | str, func: str, *args: Any,
                     **kwargs: Any) -> str:
    """Enqueue a job of one of ``loop``'s runs (``worker.jobs.run_now``, ``run_triggered``, ``run_backfill``) on
    the loop's queue (``loop``: the loop, or its id: read here; a loop that is gone goes to the base queue, where
    its job finds it gone). Returns the job id."""
    if isinstance(loop, str):
        from loopsq.state.loops import LoopStore

        found = LoopStore(client, keys).get(loop)
        name = loop_queue(found, keys) if found is not None else keys.base_queue
    else:
        name = loop_queue(loop, keys)
    return timers.enqueue(timers.raw_from(client), func, *args, queue_name=name, keys=keys, **kwargs)


def enqueue_for_workflow(client: redis.Redis, keys: Keys, spec: Mapping[str, Any], run_id: str) -> str:
    """Enqueue a workflow run of its own (``worker.jobs.run_workflow``) on its workflow's queue."""
    return timers.enqueue(timers.raw_from(client), "worker.jobs.run_workflow", spec["id"], run_id,
                          queue_name=workflow_queue(spec, keys), keys=keys)


def live_worker_labels(client: redis.Redis, keys: Keys) -> dict[str, list[str]]:
    """Every live worker's labels, by worker id (from their liveness records)."""
    ids = sorted(str(i.decode() if isinstance(i, bytes) else i) for i in client.smembers(keys.workers))
    if not ids:
        return {}
    out: dict[str, list[str]] = {}
    for worker_id, raw in zip(ids, client.mget([keys.worker(i) for i in ids]), strict=True):
        if raw is None:
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        out[worker_id] = [str(label) for label in record.get("labels") or ()]
    return out


def unserved(client: redis.Redis, keys: Keys, requirements: Iterable[str]) -> list[str] | None:
    """The labels no live worker has all of, for runs needing ``requirements`` (those no single live worker
    covers, fewest missing first); None when a live worker can run them."""
    needs = sorted(set(requirements))
    workers = live_worker_labels(client, keys)
    if any(labels.satisfies(have, needs) for have in workers.values()):
        return None
    if not workers:
        return needs
    return min((labels.missing(have, needs) for have in workers.values()), key=len)


def waiting_note(client: redis.Redis, keys: Keys, loop: Loop) -> str | None:
    """``no live worker has labels gpu, repo:web`` when no live worker can run ``loop``'s runs (they wait in
    their queue), None otherwise (or when the loop requires nothing)."""
    needs = loop_requirements(loop)
    if not needs:
        return None
    lacking = unserved(client, keys, needs)
    return f"no live worker has labels {', '.join(lacking)}" if lacking else None


def arm_created(client: redis.Redis, keys: Keys, loop: Loop) -> Loop:
    """Arm a loop's timer right after its creation (every interface that creates one calls this), on its queue:
    its first slot runs on time instead of when maintenance next looks (``WRITE_GRACE_MS`` after the write),
    which for a loop every second meant its first slots missed. Returns ``loop``."""
    from loopsq.domain.run_rules import timer_at

    at = timer_at(loop)
    if at is not None:
        timers.arm(timers.raw_from(client), keys, loop.id, at, queue_name=loop_queue(loop, keys))
    return loop


def arm_updated(client: redis.Redis, keys: Keys, loop: Loop) -> Loop:
    """Arm a loop's timer right after an edit in place (``LoopStore.edit``) at its (possibly moved) next slot,
    on its (possibly new) queue, replacing the entry armed under the old definition; only while the loop is
    still exactly ``loop`` (a later write arms its own timer, or maintenance does). An entry already armed for
    the same millisecond is left alone. A loop that is not active keeps what it has: its timer, if it fires,
    finds nothing to run. Returns ``loop``."""
    from loopsq.domain.run_rules import timer_at

    at = timer_at(loop)
    if at is not None:
        timers.arm(timers.raw_from(client), keys, loop.id, at, expect_loop=loop.to_json(),
                   queue_name=loop_queue(loop, keys))
    return loop
