"""Feeding the SQLite mirror from Redis: catch-up reads, the following consumer, and rebuilds.

- ``catch_up`` brings a mirror file up to the newest change (every CLI read calls it first: read-your-writes
  whether or not a ``loopsq mirror`` process runs).
- ``follow`` is the data dir's one follower (``loopsq mirror``, or ``loopsq web``'s thread; ``follower_lock``): a
  consumer group of its own per data dir (``identity``), so every mirror on every host receives every change.
- ``rebuild`` merges what Redis holds into the mirror (``merge.merge_all``): every row Redis has is rewritten from
  Redis's entities, and the runs Redis no longer has (trimmed from its history window, or gone with a flushed
  Redis) are kept, archived. It runs on request, and by itself when the mirror cannot be trusted to follow on:
  Redis was flushed or replaced (its instance id changed), or the stream was trimmed past the last change this
  mirror applied.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from loopsq.domain import timeutil
from loopsq.mirror.apply import (
    LAST_APPLIED_KEY,
    REDIS_INSTANCE_KEY,
    apply_changes,
    get_meta,
    last_applied_id,
    set_meta,
)
from loopsq.mirror.merge import merge_all
from loopsq.mirror.schema import transaction
from loopsq.state.keys import Keys
from loopsq.state.outages import errors, is_configuration_error, is_transient
from loopsq.state.snapshot import snapshot_tables
from loopsq.system.procs import hostname

log = logging.getLogger(__name__)

BATCH = 1000
INSTANCE_META = REDIS_INSTANCE_KEY


def parse_entry(entry_id: str, fields: dict[str, str]) -> dict[str, Any]:
    """A stream entry -> a change dict (``id``, ``type``, ``at``, ``upsert``, ``delete``)."""
    data = json.loads(fields.get("data") or "{}")
    return {
        "id": entry_id,
        "type": fields.get("type", ""),
        "at": fields.get("at", ""),
        "upsert": data.get("upsert", {}),
        "delete": data.get("delete", {}),
        "trim": data.get("trim", {}),
        "patch": data.get("patch", {}),
    }


def _parse_id(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _needs_rebuild(client: redis.Redis, keys: Keys, conn: sqlite3.Connection) -> str | None:
    """Why the mirror must be rebuilt before it can follow the stream, or None."""
    instance = _str(client.get(keys.instance))
    mine = get_meta(conn, INSTANCE_META)
    if instance != mine:
        return f"redis instance changed ({mine} -> {instance})"
    last = last_applied_id(conn)
    if last is None:
        return None
    if client.xrange(keys.changes, last, last):
        return None
    first = _entries([(keys.changes, client.xrange(keys.changes, "-", "+", count=1))])
    if first and _parse_id(first[0][0]) > _parse_id(last):
        return f"change stream trimmed past {last}"
    if first:
        # Older changes are still there, the mirror's last one is not: Redis lost changes the mirror applied (the
        # old master's writes discarded by a failover). The mirror would keep their rows, Redis the ones before.
        return f"change stream lost {last} (a failover or a restart discarded changes the mirror applied)"
    return None


def catch_up(client: redis.Redis, keys: Keys, conn: sqlite3.Connection) -> int:
    """Apply every change newer than the mirror's last one; rebuild first when following is impossible.

    Returns the number of changes applied (a rebuild counts as one).
    """
    reason = _needs_rebuild(client, keys, conn)
    applied = 0
    if reason is not None:
        log.info("rebuilding mirror: %s", reason)
        kept = rebuild(client, keys, conn)
        log.info("mirror rebuilt from Redis; kept %d archived run(s) that Redis no longer holds", kept)
        applied = 1
    while True:
        last = last_applied_id(conn)
        start = f"({last}" if last else "-"
        entries = _entries([(keys.changes, client.xrange(keys.changes, start, "+", count=BATCH))])
        if not entries:
            return applied
        applied += apply_changes(conn, [parse_entry(i, f) for i, f in entries])
        if len(entries) < BATCH:
            return applied


def rebuild(client: redis.Redis, keys: Keys, conn: sqlite3.Connection) -> int:
    """Merge every entity Redis holds into the mirror, then follow on from the stream's tail. Returns how many
    archived runs (not in Redis any more) the mirror kept.

    The stream's last id is read *before* the entities: changes after it are replayed by the next catch-up, and
    since each change carries full snapshots, replaying one that the scan already saw converges to the same rows.
    """
    tail = _entries([(keys.changes, client.xrevrange(keys.changes, "+", "-", count=1))])
    tail_id = tail[0][0] if tail else "0-0"
    instance = _str(client.get(keys.instance))
    _replay_until(client, keys, conn, tail_id, same_dataset=instance == get_meta(conn, INSTANCE_META))
    tables = snapshot_tables(client, keys)
    return merge_all(conn, tables, tail_id, {INSTANCE_META: str(instance)} if instance else None,
                     at=timeutil.to_iso(timeutil.now()))


def _replay_until(client: redis.Redis, keys: Keys, conn: sqlite3.Connection, tail_id: str, *,
                  same_dataset: bool) -> None:
    """Before a rebuild merges Redis's entities, apply what the stream still holds up to ``tail_id``, even past a
    gap: a run trimmed from Redis since then has its final state there, and the mirror keeps it archived. (Rows
    Redis still has are rewritten from its entities by the merge anyway.)"""
    last = last_applied_id(conn) if same_dataset else None
    if not same_dataset and last_applied_id(conn) is not None:
        with transaction(conn):
            set_meta(conn, LAST_APPLIED_KEY, "0-0")  # another dataset's stream: its ids say nothing about ours
    start = f"({last}" if last else "-"
    while True:
        entries = _entries([(keys.changes, client.xrange(keys.changes, start, tail_id, count=BATCH))])
        if not entries:
            return
        apply_changes(conn, [parse_entry(i, f) for i, f in entries])
        if len(entries) < BATCH:
            return
        start = f"({entries[-1][0]}"


def follow(
    client: redis.Redis,
    keys: Keys,
    conn: sqlite3.Connection,
    group: str,
    stop: threading.Event,
    *,
    block_ms: int = 1000,
    on_applied: Any = None,
) -> None:
    """Follow the change stream with consumer group ``group`` until ``stop`` is set.

    The caller must be the data dir's one follower (``follower_lock``): the group is this mirror's alone, read
    under this host's name, and any other consumer in it was left by an earlier follower of this data dir (under
    another host name: a dyno restarted with its disk) and is removed, so that entries it never acknowledged do
    not hold the stream back. Each batch is applied in one SQLite transaction and then acknowledged. Changes the
    mirror already holds (applied by a CLI catch-up, or redelivered after a crash) are skipped by
    ``apply_changes``. After a read that waited ``block_ms`` for nothing, the group's pending entries are read
    (none, normally): on Redis 7.0 only that refreshes the consumer's idle time, which tells the stream trim that
    this mirror still reads (``LOOPSQ_MIRROR_IDLE``). A group removed meanwhile (``XGROUP DESTROY``) is made again.

    A Redis error that is neither an outage, a refusal (``OOM``: the caller waits those out) nor a configuration
    error (``WRONGTYPE``, a script's error: a bug or corrupted data) is logged once per kind and the follow starts
    over a second later: it never ends the mirror.
    """
    while not stop.is_set():
        try:
            _follow(client, keys, conn, group, stop, block_ms=block_ms, on_applied=on_applied)
            return
        except redis.RedisError as exc:
            if is_transient(exc) or is_configuration_error(exc):
                raise
            errors.report("the mirror follower", exc)
            stop.wait(1.0)


def _follow(client: redis.Redis, keys: Keys, conn: sqlite3.Connection, group: str, stop: threading.Event, *,
            block_ms: int, on_applied: Any) -> None:
    consumer = hostname()
    catch_up(client, keys, conn)
    _ensure_group(client, keys, group, last_applied_id(conn) or "0-0")
    _remove_other_consumers(client, keys, group, consumer)
    pending_first = True
    while not stop.is_set():
        if _needs_rebuild(client, keys, conn) is not None:
            catch_up(client, keys, conn)
            _ensure_group(client, keys, group, last_applied_id(conn) or "0-0")
        reading_pending = pending_first
        try:
            if reading_pending:
                reply = client.xreadgroup(group, consumer, {keys.changes: "0"}, count=BATCH)
            else:
                reply = client.xreadgroup(group, consumer, {keys.changes: ">"}, count=BATCH, block=block_ms)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            log.warning("mirror group %s is gone from Redis (XGROUP DESTROY?); making it again", group)
            catch_up(client, keys, conn)
            _ensure_group(client, keys, group, last_applied_id(conn) or "0-0")
            pending_first = True
            continue
        entries = _entries(reply)
        # Pending entries until there are none; then new ones; after a wait for nothing, the pending ones again.
        pending_first = bool(entries) if reading_pending else not entries
        if not entries:
            continue
        applied = apply_changes(conn, [parse_entry(i, f) for i, f in entries])
        client.xack(keys.changes, group, *[i for i, _ in entries])
        if on_applied is not None and applied:
            on_applied(applied)


def _ensure_group(client: redis.Redis, keys: Keys, group: str, start: str) -> None:
    try:
        client.xgroup_create(keys.changes, group, id=start, mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _remove_other_consumers(client: redis.Redis, keys: Keys, group: str, consumer: str) -> None:
    """Remove the consumers of ``group`` other than ``consumer``, with their pending entries (the mirror has
    caught up from the stream itself, so nothing they held is lost)."""
    for other in client.xinfo_consumers(keys.changes, group):
        name = _str(other.get("name")) or ""
        if name != consumer:
            client.xgroup_delconsumer(keys.changes, group, name)
            log.info("mirror group %s: removed consumer %s left by an earlier follower of this data dir "
                     "(%s pending, idle %ss)", group, name, other.get("pending"), int(other.get("idle") or 0) // 1000)


def _entries(reply: Iterable[Any] | None) -> Sequence[tuple[str, dict[str, str]]]:
    """Stream entries of an XRANGE/XREADGROUP reply as ``(id, fields)`` with str keys and values."""
    out: list[tuple[str, dict[str, str]]] = []
    for _stream, items in reply or []:
        for entry_id, fields in items or []:
            if fields is not None:
                out.append((_str(entry_id) or "", {_str(k) or "": _str(v) or "" for k, v in fields.items()}))
    return out


def _str(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def mirror_lag(client: redis.Redis, keys: Keys, conn: sqlite3.Connection) -> int:
    """How many changes the mirror has not applied yet (0 when it is current)."""
    last = last_applied_id(conn)
    start = f"({last}" if last else "-"
    return len(_entries([(keys.changes, client.xrange(keys.changes, start, "+", count=100_000))]))
