"""One read of the fleet, for ``status``, ``doctor``, the dashboard's Fleet page and ``/metrics``: the live workers
(labels, slots, slots in use, queues), every queue (its requirement set, how many runs wait there, how long the
oldest has waited, which live workers can take them, and, when none can, the labels they lack), the timers
overdue, and the totals.

Three pipelined round trips at most, whatever the number of loops or armed timers: the time (Redis's clock, the one
clock lateness is judged on), the worker registry, the queue registry and the oldest armed timer; then the workers'
liveness records, each queue's length and head, and the count of overdue timers; then when each queue's head job
was enqueued. Everything RQ and rq-scheduler spell (their keys and fields) comes from ``engine.timers``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis

from loopsq.domain import labels as label_rules
from loopsq.domain.durations import format_duration
from loopsq.domain.timeutil import to_iso, to_ms
from loopsq.engine import timers
from loopsq.state.keys import Keys
from loopsq.state.pools import PoolState, PoolStore

#: A timer counts as overdue once its time is this far past: the schedulers move due timers every few ms, so a
#: timer still armed seconds after its time means none is moving them (or they are far behind).
OVERDUE_AFTER_MS = 5_000
#: Job ids read from the head of each queue to find the oldest one's enqueue time (a head id whose job hash is
#: gone, which RQ's dequeue skips, would otherwise leave the age unknown).
HEAD_SAMPLE = 3


@dataclass(frozen=True)
class FleetWorker:
    """A live worker, as its liveness record (``Runtime.describe``) says.

    A record without fleet fields (a worker of an older loopsq) counts as one slot, busy while it holds a run,
    with no labels: it listens on the base queue alone.
    """

    id: str
    host: str
    labels: tuple[str, ...]
    slots: int
    busy: int
    queues: tuple[str, ...]
    started_at: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "host": self.host, "labels": list(self.labels), "slots": self.slots,
                "busy": self.busy, "queues": list(self.queues), "startedAt": self.started_at}


@dataclass(frozen=True)
class FleetQueue:
    """One of loopsq's RQ queues: its requirement set, its runs waiting, and who serves it.

    Attributes:
        name: The queue (``domain.labels.queue_name``).
        labels: Its requirement set (empty for the base queue).
        depth: Runs waiting (the length of RQ's list).
        oldest_age_ms: How long the run at its head has waited (Redis's clock); None when none waits or its
            enqueue time cannot be read.
        served_by: The live workers whose labels satisfy its requirement set.
        missing: When none does (``unserved``): the labels the closest live worker lacks, fewest first; all of
            them when no worker is live (then empty for the base queue).
    """

    name: str
    labels: tuple[str, ...]
    depth: int
    oldest_age_ms: int | None
    served_by: tuple[str, ...]
    missing: tuple[str, ...]

    @property
    def unserved(self) -> bool:
        """No live worker can take its runs: they wait until one with the labels starts."""
        return not self.served_by

    def why_unserved(self) -> str:
        """Why no live worker takes its runs (``unserved_reason``)."""
        return unserved_reason(self.missing)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "labels": list(self.labels), "depth": self.depth,
                "oldestAgeMs": self.oldest_age_ms, "servedBy": list(self.served_by), "unserved": self.unserved,
                "missing": list(self.missing)}


@dataclass(frozen=True)
class FleetTimers:
    """rq-scheduler's armed timers: how many, and those past their time by more than ``OVERDUE_AFTER_MS``."""

    armed: int
    overdue: int
    oldest_late_ms: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"armed": self.armed, "overdue": self.overdue, "oldestLateMs": self.oldest_late_ms,
                "overdueAfterMs": OVERDUE_AFTER_MS}


@dataclass(frozen=True)
class FleetSnapshot:
    """The fleet at one moment (``at``: Redis's clock)."""

    at: datetime
    workers: tuple[FleetWorker, ...]
    queues: tuple[FleetQueue, ...]
    timers: FleetTimers
    #: The fleet-wide pools (``state.pools``): each one's limit, holders and waiters.
    pools: tuple[PoolState, ...] = ()

    @property
    def capacity(self) -> int:
        """Slots across the live workers."""
        return sum(w.slots for w in self.workers)

    @property
    def busy(self) -> int:
        """Slots in use across the live workers."""
        return sum(w.busy for w in self.workers)

    def serving(self, queue: FleetQueue) -> list[FleetWorker]:
        """The live workers that can take ``queue``'s runs."""
        return [w for w in self.workers if w.id in queue.served_by]

    def to_dict(self) -> dict[str, Any]:
        """camelCase JSON (``status --json``)."""
        return {"at": to_iso(self.at), "capacity": self.capacity, "busy": self.busy,
                "workers": [w.to_dict() for w in self.workers], "queues": [q.to_dict() for q in self.queues],
                "timers": self.timers.to_dict(), "pools": [p.to_dict() for p in self.pools]}


def unserved_reason(missing: Sequence[str]) -> str:
    """``no live worker has labels gpu, nvme`` (the labels the closest live worker lacks), or ``no live worker is
    running`` (nothing is missing: the base queue, with no worker live)."""
    return f"no live worker has labels {', '.join(missing)}" if missing else "no live worker is running"


def age_text(ms: int | None) -> str:
    """An age in whole seconds, as lines and pages show it: ``42s``, ``2m``, ``0s``; ``-`` for None."""
    if ms is None:
        return "-"
    seconds = max(ms, 0) // 1000
    return format_duration(seconds * 1000) if seconds else "0s"


def read_fleet(client: redis.Redis, keys: Keys) -> FleetSnapshot:
    """The fleet now, in at most three pipelined round trips (see the module's docstring), and one more per
    fleet-wide pool."""
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.smembers(keys.workers)
    pipe.hkeys(keys.queues)
    pipe.zcard(timers.scheduled_key(keys))
    pipe.zrange(timers.scheduled_key(keys), 0, 0, withscores=True)
    pipe.hkeys(keys.pools)
    (seconds, micros), members, registered, armed, first, pool_names = pipe.execute()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    worker_ids = sorted(_text(m) for m in members)
    queues = timers.queues_named(registered, keys.base_queue)
    names = sorted(queues, key=lambda n: (n != keys.base_queue, n))
    cutoff_s = (now_ms - OVERDUE_AFTER_MS) / 1000.0
    first_s = float(first[0][1]) if first else None

    pipe = client.pipeline(transaction=False)
    if worker_ids:
        pipe.mget([keys.worker(i) for i in worker_ids])
    for name in names:
        pipe.llen(timers.queue_key(name))
        pipe.lrange(timers.queue_key(name), 0, HEAD_SAMPLE - 1)
    overdue_now = first_s is not None and first_s <= cutoff_s
    if overdue_now:
        pipe.zcount(timers.scheduled_key(keys), "-inf", repr(cutoff_s))
    replies = iter(pipe.execute())
    records = next(replies) if worker_ids else []
    depths: dict[str, int] = {}
    heads: dict[str, list[str]] = {}
    for name in names:
        depths[name] = int(next(replies))
        heads[name] = [_text(i) for i in next(replies)]
    overdue = int(next(replies)) if overdue_now else 0

    sampled = [(name, job_id) for name in names for job_id in heads[name]]
    enqueued: dict[str, datetime] = {}
    if sampled:
        pipe = client.pipeline(transaction=False)
        for _, job_id in sampled:
            pipe.hget(timers.job_key(job_id), timers.ENQUEUED_AT)
        for (name, _), value in zip(sampled, pipe.execute(), strict=True):
            when = timers.enqueued_time(value)
            if when is not None and name not in enqueued:
                enqueued[name] = when

    workers = tuple(w for w in (_worker(i, raw) for i, raw in zip(worker_ids, records, strict=True)) if w)
    out: list[FleetQueue] = []
    for name in names:
        needs = queues[name]
        served = tuple(w.id for w in workers if label_rules.satisfies(w.labels, needs))
        waited = enqueued.get(name)
        age = max(0, now_ms - to_ms(waited)) if waited is not None and depths[name] else None
        out.append(FleetQueue(name, needs, depths[name], age, served,
                              () if served else tuple(lacking(needs, (w.labels for w in workers)))))
    late = max(0, now_ms - round(first_s * 1000)) if overdue_now and first_s is not None else None
    store = PoolStore(client, keys)  # (a round trip per pool: pools are few)
    pools = tuple(state for state in (store.state(_text(name)) for name in sorted(pool_names)) if state is not None)
    return FleetSnapshot(datetime.fromtimestamp(now_ms / 1000, UTC), workers, tuple(out),
                         FleetTimers(int(armed), overdue, late), pools)


def lacking(needs: Sequence[str], workers: Iterable[Iterable[str]]) -> list[str]:
    """The labels that keep the closest of ``workers`` (their labels) from runs needing ``needs``: the fewest
    missing (the first such worker's); all of ``needs`` when there is no worker. Empty when one satisfies them."""
    best: list[str] | None = None
    for have in workers:
        gap = label_rules.missing(have, needs)
        if best is None or len(gap) < len(best):
            best = gap
    return sorted(needs) if best is None else best


def _worker(worker_id: str, raw: Any) -> FleetWorker | None:
    """Worker ``worker_id``'s liveness record as a ``FleetWorker``; None when it expired, is unreadable, or is not a worker's
    (``run-now --local`` registers with the workers too, and takes nothing from the queues)."""
    if raw is None:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(record, dict) or record.get("role", "worker") != "worker":
        return None
    runs = record.get("runs") or []
    slots = _count(record.get("slots"), 1)
    return FleetWorker(
        id=worker_id, host=str(record.get("host") or "?"),
        labels=tuple(sorted(str(label) for label in record.get("labels") or ())),
        slots=slots, busy=_count(record.get("busy"), min(len(runs), slots)),
        queues=tuple(str(q) for q in record.get("queues") or (timers.QUEUE_NAME,)),
        started_at=str(record["startedAt"]) if record.get("startedAt") else None,
    )


def _count(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
