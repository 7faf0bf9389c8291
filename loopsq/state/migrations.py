"""``loopsq migrate``: move loopsq's state in Redis forward, one layout at a time (``state.layout``).

Each transition works in bounded batches (``BATCH`` keys a round trip), each batch idempotent: a migration killed
half-way is resumed by running it again, which finds what is left by scanning for it. While one works,
``keys.meta`` says ``migratingTo`` (every other process of any versioned release refuses the state meanwhile) and
``keys.migrate_lock`` names it (a second migrate waits or refuses). The stamp of the new layout is its last write.

v1 -> v2 (0.1.0, commit 9923ab3 -> 0.2.0):
- each ``<ns>:slot:<loop>:<scheduledFor>`` key (the run id holding that slot) becomes the field ``scheduledFor``
  of ``keys.slots(loop)`` and is deleted: today's claim finds a slot's run there, so a pending retry is claimed as
  its next attempt of the same row, not as attempt 1 of a new one;
- each settled run row stored as JSON is compressed as ``run_codec`` stores it (running rows stay JSON);
- each active loop is put in maintenance's watch (and expiry) index, so its timer is looked at right away.
Claims (``<ns>:claim:<loop>:<slot>:<attempt>``), leases, running sets, triggers and pending retries (the loop's
``retryScheduledFor`` and its armed timer) are the same keys in both layouts and are carried over as they are.

Layout 1 processes know nothing of versions, so this transition needs them stopped: it refuses while any loopsq
process is live on the Redis (its liveness key).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import redis
from redis.client import NEVER_DECODE

from loopsq.domain.timeutil import from_iso, gen_id, to_ms
from loopsq.state import layout, owned_key, run_codec
from loopsq.state.keys import Keys

#: Keys per round trip.
BATCH = 500
LOCK_MS = 60_000

_CAS_SET = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL') return 1 end
return 0
"""


class MigrationRefused(layout.StateLayoutError):
    """``migrate`` cannot or need not run (exit status 2, nothing changed)."""


@dataclass
class Report:
    """What a migration did (or, dry, would do)."""

    start: int
    end: int
    dry_run: bool
    lines: list[str] = field(default_factory=list)


def _live_processes(client: redis.Redis, keys: Keys) -> list[str]:
    return layout.live_processes(client, keys)


def _batches(client: redis.Redis, pattern: str, accept: Callable[[str], bool]) -> Iterator[list[str]]:
    batch: list[str] = []
    for key in client.scan_iter(match=pattern, count=BATCH):
        name = key.decode() if isinstance(key, bytes) else str(key)
        if accept(name):
            batch.append(name)
            if len(batch) >= BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


class _Lock:
    """The owner-checked migrate lock, extended as batches go."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.key, self.token = client, keys.migrate_lock, gen_id()
        self._extend = client.register_script(owned_key.EXTEND)
        self._release = client.register_script(owned_key.RELEASE)

    def take(self, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while not self.client.set(self.key, self.token, nx=True, px=LOCK_MS):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)
        return True

    def keep(self) -> None:
        if int(self._extend(keys=[self.key], args=[self.token, LOCK_MS])) != 1:
            raise MigrationRefused("the migrate lock was lost (another `loopsq migrate` took over); run it again")

    def release(self) -> None:
        self._release(keys=[self.key], args=[self.token])


def migrate(client: redis.Redis, keys: Keys, *, dry_run: bool = False, wait_s: float = 0.0,
            say: Callable[[str], None] = lambda _line: None) -> Report:
    """Move the state under ``keys`` to ``layout.LAYOUT``; ``say`` gets one line per transition's outcome.

    Raises:
        MigrationRefused: nothing of loopsq is there, the state is newer than this release, v1 processes are
            live, or another migrate holds the lock beyond ``wait_s``; nothing was changed.
    """
    found = layout.read(client, keys)
    if found.version == layout.EMPTY:
        others = client.dbsize()
        suffix = f" (it holds {others} other keys)" if others else ""
        raise MigrationRefused(f"this Redis holds no loopsq state under '{keys.namespace}:'{suffix}: "
                               "nothing to migrate")
    if found.version > layout.LAYOUT:
        raise MigrationRefused(f"this Redis holds loopsq state v{found.version}; this loopsq reads "
                               f"{layout.reads()}: upgrade it")
    report = Report(found.version, layout.LAYOUT, dry_run)
    if found.version == layout.LAYOUT and found.migrating_to is None:
        if not found.stamped and not dry_run:
            layout.stamp(client, keys)
        line = (f"state is v{layout.LAYOUT}: nothing to migrate"
                + ("" if found.stamped else f" (would stamp v{layout.LAYOUT})" if dry_run else
                   f" (stamped v{layout.LAYOUT})"))
        report.lines.append(line)
        say(line)
        return report
    if dry_run:
        line = _v1_to_v2(client, keys, dry_run=True, keep=lambda: None)
        report.lines.append(line)
        say(line)
        return report
    lock = _Lock(client, keys)
    if not lock.take(wait_s):
        raise MigrationRefused("another `loopsq migrate` is moving this state now (its lock "
                               f"{keys.migrate_lock} is held); wait for it")
    try:
        found = layout.read(client, keys)  # (under the lock: another may have finished meanwhile)
        if found.version == layout.LAYOUT and found.migrating_to is None:
            report.lines.append(f"state is v{layout.LAYOUT}: nothing to migrate")
            say(report.lines[-1])
            return report
        live = _live_processes(client, keys)
        if live:
            shown = ", ".join(live[:3]) + (f" and {len(live) - 3} more" if len(live) > 3 else "")
            raise MigrationRefused(f"{len(live)} loopsq process(es) are live on this Redis ({shown}); stop "
                                   "every 0.1.0 scheduler and worker before migrating from v1")
        client.hset(keys.meta, mapping={layout.LAYOUT_FIELD: "1", layout.READABLE_FIELD: "1",
                                        layout.MIGRATING_FIELD: str(layout.LAYOUT)})
        line = _v1_to_v2(client, keys, dry_run=False, keep=lock.keep)
        if layout.has_keys(client, keys.old_slot_pattern):  # (a v1 process that came back meanwhile)
            raise MigrationRefused("v1 slot keys appeared while migrating (is a 0.1.0 process running?); "
                                   "stop it and run `loopsq migrate` again")
        layout.stamp(client, keys)
        report.lines.append(line)
        say(line)
        return report
    finally:
        lock.release()


def _is_old_slot(keys: Keys) -> Callable[[str], bool]:
    head = f"{keys.namespace}:slot:"
    return lambda name: name.startswith(head) and ":" in name[len(head):]


def _is_run_row(keys: Keys) -> Callable[[str], bool]:
    head = f"{keys.namespace}:run:"
    return lambda name: name.startswith(head) and ":" not in name[len(head):]


def _v1_to_v2(client: redis.Redis, keys: Keys, *, dry_run: bool, keep: Callable[[], None]) -> str:
    head = len(f"{keys.namespace}:slot:")
    slots = 0
    loops_with_slots: set[str] = set()
    for batch in _batches(client, keys.old_slot_pattern, _is_old_slot(keys)):
        values = client.mget(batch)
        pipe = client.pipeline(transaction=True)
        for name, run_id in zip(batch, values, strict=True):
            if run_id is None:
                continue
            loop_id, scheduled_for = name[head:].split(":", 1)
            loops_with_slots.add(loop_id)
            slots += 1
            pipe.hsetnx(keys.slots(loop_id), scheduled_for, run_id)
            pipe.delete(name)
        if not dry_run:
            pipe.execute()
            keep()
    compressed = 0
    cas = client.register_script(_CAS_SET)
    for batch in _batches(client, f"{keys.namespace}:run:*", _is_run_row(keys)):
        stored = client.execute_command("MGET", *batch, **{NEVER_DECODE: []})  # type: ignore[no-untyped-call]
        pipe = client.pipeline(transaction=False)
        for name, value in zip(batch, stored, strict=True):
            if not isinstance(value, bytes) or value[:1] != b"{":
                continue  # gone, or compressed already
            try:
                status = json.loads(value).get("status")
            except ValueError:
                continue
            if status == "running":
                continue
            packed = run_codec.compress_text(value.decode())
            if isinstance(packed, bytes):
                compressed += 1
                cas(keys=[name], args=[value, packed], client=pipe)
        if not dry_run:
            pipe.execute()
            keep()
    indexed = 0
    now_ms = int(time.time() * 1000)
    loop_ids = sorted(str(i) for i in client.smembers(keys.loops))
    for start in range(0, len(loop_ids), BATCH):
        chunk = loop_ids[start:start + BATCH]
        pipe = client.pipeline(transaction=False)
        for loop_id, text in zip(chunk, client.mget([keys.loop(i) for i in chunk]), strict=True):
            loop = json.loads(str(text)) if text is not None else {}
            if loop.get("status") != "active":
                continue
            indexed += 1
            pipe.zadd(keys.loop_watch, {loop_id: now_ms}, nx=True)
            if loop.get("expiresAt"):
                pipe.zadd(keys.loop_expiry, {loop_id: to_ms(from_iso(str(loop["expiresAt"])))})
        if not dry_run:
            pipe.execute()
            keep()
    verb = ("would move", "would compress", "would index", "would stamp") if dry_run else (
        "moved", "compressed", "indexed", "stamped")
    return (f"v1 -> v2: {verb[0]} {slots} slot keys into {len(loops_with_slots)} loops' slot hashes, "
            f"{verb[1]} {compressed} settled JSON rows, {verb[2]} {indexed} active loops for maintenance, "
            f"{verb[3]} layout v2")
