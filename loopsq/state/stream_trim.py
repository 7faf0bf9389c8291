"""Trimming the change stream behind its readers: an entry goes once every live mirror group has acknowledged it,
keeping ``STREAM_MARGIN`` entries more; the length cap of every ``XADD`` (``commit.STREAM_MAXLEN``) still holds.

A mirror group is live while one of its consumers read within ``idle_ms`` (``LOOPSQ_MIRROR_IDLE``); a group idle
for longer (or with no consumer at all) no longer holds the stream back, and ``doctor`` names it. One silent for
``FORGET_FACTOR`` times as long is removed, so that the groups of mirrors gone for good (one per restart of a
platform's ephemeral disk) do not pile up, each costing every pass a look; a follower whose group was removed
makes it again. A mirror that
comes back after the stream moved on rebuilds by merge and keeps its archive. Without any live group the stream
keeps only the margin: CLI reads of a mirror that no process follows catch up from Redis's entities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from loopsq.state.keys import Keys

#: Entries kept before the oldest one a live mirror group still needs (a rebuilding mirror's replay, a CLI read).
STREAM_MARGIN = 100
#: A group silent for this many times the idle limit is removed (7 days with the default 24 h).
FORGET_FACTOR = 7

# Keep everything from ARGV[1] on (all but the newest margin entries when empty), plus the margin before it.
# A group that has read nothing yet needs '0-0' on: everything stays (and Redis 7.0 refuses the exclusive end
# '(0-0' of XREVRANGE with "invalid end ID for the interval").
_TRIM = """
local margin = tonumber(ARGV[2])
local before
if ARGV[1] == '0-0' then return 0 end
if ARGV[1] == '' then
  before = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', margin)
else
  before = redis.call('XREVRANGE', KEYS[1], '(' .. ARGV[1], '-', 'COUNT', margin)
end
if #before < margin then return 0 end
return redis.call('XTRIM', KEYS[1], 'MINID', before[#before][1])
"""


@dataclass(frozen=True)
class MirrorGroup:
    """A consumer group on the change stream (one per following mirror) as the stream sees it."""

    name: str
    consumers: int
    #: Milliseconds since a consumer of the group last read (None: it has no consumer).
    idle_ms: int | None
    pending: int
    last_delivered: str
    #: Entries not delivered to it yet (None when Redis cannot tell).
    lag: int | None
    #: Idle for longer than the limit (or without a consumer): it no longer holds the stream back.
    idle: bool


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _id_key(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def mirror_groups(client: redis.Redis, keys: Keys, idle_ms: int) -> list[MirrorGroup]:
    """Every consumer group of the change stream, with its idle time and how far it has read."""
    try:
        groups = client.xinfo_groups(keys.changes)
    except redis.ResponseError:  # no stream yet
        return []
    out: list[MirrorGroup] = []
    for group in groups:
        name = _s(group["name"])
        consumers = client.xinfo_consumers(keys.changes, name) if int(group.get("consumers") or 0) else []
        idles = [int(c["idle"]) for c in consumers if c.get("idle") is not None]
        idle = min(idles) if idles else None
        lag = group.get("lag")
        out.append(MirrorGroup(
            name=name, consumers=len(consumers), idle_ms=idle, pending=int(group.get("pending") or 0),
            last_delivered=_s(group.get("last-delivered-id") or "0-0"), lag=int(lag) if lag is not None else None,
            idle=idle is None or idle > idle_ms,
        ))
    return sorted(out, key=lambda g: g.name)


def first_needed(client: redis.Redis, keys: Keys, groups: list[MirrorGroup]) -> str | None:
    """The oldest entry id a live group still needs (its oldest unacknowledged one, else the one it read last);
    None when no group is live."""
    needed: list[str] = []
    for group in groups:
        if group.idle:
            continue
        if group.pending:
            summary = client.xpending(keys.changes, group.name)
            lowest = summary.get("min") if isinstance(summary, dict) else None
            needed.append(_s(lowest) if lowest else group.last_delivered)
        else:
            needed.append(group.last_delivered)
    return min(needed, key=_id_key) if needed else None


def trim_stream(client: redis.Redis, keys: Keys, idle_ms: int, margin: int = STREAM_MARGIN) -> int:
    """Trim the change stream behind its live mirror groups, and remove the groups silent for ``FORGET_FACTOR``
    times ``idle_ms``; returns how many entries went."""
    groups = mirror_groups(client, keys, idle_ms)
    for group in groups:
        # A group without a consumer has no idle time to judge by (a follower between making it and its first
        # read, say): it stays, holding nothing back.
        if group.idle_ms is not None and group.idle_ms > idle_ms * FORGET_FACTOR:
            client.xgroup_destroy(keys.changes, group.name)
    needed = first_needed(client, keys, groups)
    script = client.register_script(_TRIM)
    return int(script(keys=[keys.changes], args=[needed or "", margin]))
