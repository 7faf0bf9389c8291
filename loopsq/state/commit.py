"""One atomic transition: guards, writes and exactly one change-stream entry, in a single Lua script.

A ``Tx`` is built in Python (where the domain logic lives) and committed by one ``EVALSHA``: the script first
checks every guard (compare-and-set on a value, key absent, hash field equal), and only if all hold applies every
write and appends the change. Either all of it happens or none of it does, so there is no transition without its
event and no event without its transition. A failed guard is an expected outcome (a lost race, a name already
taken) and is returned, not raised; callers re-read and retry or report it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.client import Pipeline

from loopsq.domain.timeutil import gen_id
from loopsq.state.durability import pipelined
from loopsq.state.keys import Keys
from loopsq.state.loop_watch import index_ops

#: Approximate cap on the change stream (an entry is ~1 KB, a run makes ~3: about 200 MB and, at 1,000 runs a
#: minute, an hour of history). A mirror that falls further behind than this rebuilds itself from Redis.
STREAM_MAXLEN = 200_000

_SCRIPT = """
local nops = tonumber(ARGV[1])
local function arg(i, j) return ARGV[3 + i * 4 + j] end
for i = 0, nops - 1 do
  local op = arg(i, 0)
  local key = KEYS[tonumber(arg(i, 1))]
  local a, b = arg(i, 2), arg(i, 3)
  if op == 'eq' then
    local cur = redis.call('GET', key)
    if a == '' then
      if cur then return {0, i} end
    elseif cur ~= a then return {0, i} end
  elseif op == 'absent' then
    if redis.call('EXISTS', key) == 1 then return {0, i} end
  elseif op == 'llen' then
    if redis.call('LLEN', key) ~= tonumber(a) then return {0, i} end
  elseif op == 'hfeq' then
    local cur = redis.call('HGET', key, a)
    if b == '' then
      if cur then return {0, i} end
    elseif cur ~= b then return {0, i} end
  elseif op == 'ztop' then
    local top = redis.call('ZREVRANGE', key, 0, 0)[1]
    if a == '' then
      if top then return {0, i} end
    elseif top ~= a then return {0, i} end
  end
end
for i = 0, nops - 1 do
  local op = arg(i, 0)
  local key = KEYS[tonumber(arg(i, 1))]
  local a, b = arg(i, 2), arg(i, 3)
  if op == 'set' then redis.call('SET', key, a)
  elseif op == 'setpx' then redis.call('SET', key, a, 'PX', b)
  elseif op == 'setnx' then redis.call('SET', key, a, 'NX')
  elseif op == 'del' then redis.call('DEL', key)
  elseif op == 'hset' then redis.call('HSET', key, a, b)
  elseif op == 'hdel' then redis.call('HDEL', key, a)
  elseif op == 'hincrby' then redis.call('HINCRBY', key, a, b)
  elseif op == 'sadd' then redis.call('SADD', key, a)
  elseif op == 'srem' then redis.call('SREM', key, a)
  elseif op == 'zadd' then redis.call('ZADD', key, a, b)
  elseif op == 'zrem' then redis.call('ZREM', key, a)
  elseif op == 'rpush' then redis.call('RPUSH', key, a)
  elseif op == 'watch' then
    -- a loop's maintenance watch (state.loop_watch): b = write score, armed score, timer key, timer id prefix,
    -- scheduled-timers key; the armed score when the loop's timer is already scheduled at its wanted time.
    local p = {}
    for part in string.gmatch(b, '[^\\n]+') do p[#p + 1] = part end
    local score = p[1]
    if p[3] then
      local id = redis.call('GET', p[3])
      if id and string.sub(id, 1, #p[4]) == p[4] and redis.call('ZSCORE', p[5], id) then score = p[2] end
    end
    redis.call('ZADD', key, score, a)
  end
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*',
  'type', ARGV[3 + nops * 4], 'at', ARGV[4 + nops * 4], 'data', ARGV[5 + nops * 4])
return {1, id}
"""

_GUARDS = frozenset({"eq", "absent", "hfeq", "llen", "ztop"})


@dataclass
class Tx:
    """A transition under construction: guards, writes and the one change it emits.

    ``upsert``/``patch``/``delete``/``trimmed`` describe the change for mirrors: full entity snapshots per table,
    the changed fields of entities the mirrors hold, deleted ids, and ids that left Redis's history window
    (mirrors keep those rows).
    """

    type: str
    at: str
    #: ``(op, key, a, b)``; a value may be bytes (a compressed run row, ``run_codec``).
    ops: list[tuple[str, str, str | bytes, str]] = field(default_factory=list)
    upsert: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    delete: dict[str, list[str]] = field(default_factory=dict)
    trimmed: dict[str, list[str]] = field(default_factory=dict)
    patches: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    also: list[str] = field(default_factory=list)
    #: What the change is about, for readers of the stream other than mirrors (which ignore it): e.g. the pool a
    #: ``pool_set`` wrote, which no mirror table holds.
    detail: dict[str, Any] = field(default_factory=dict)

    # -- guards ---------------------------------------------------------------------------------------------
    def expect(self, key: str, value: str | bytes | None) -> Tx:
        """Guard: the string at ``key`` is exactly ``value`` (``None``: the key does not exist)."""
        self.ops.append(("eq", key, value or "", ""))
        return self

    def expect_absent(self, key: str) -> Tx:
        """Guard: ``key`` does not exist (of any type)."""
        self.ops.append(("absent", key, "", ""))
        return self

    def expect_field(self, key: str, name: str, value: str | None) -> Tx:
        """Guard: hash field ``name`` of ``key`` equals ``value`` (``None``: the field is absent)."""
        self.ops.append(("hfeq", key, name, value or ""))
        return self

    def expect_length(self, key: str, length: int) -> Tx:
        """Guard: the list at ``key`` has exactly ``length`` items (gap-free sequences append at ``length+1``)."""
        self.ops.append(("llen", key, str(length), ""))
        return self

    def expect_top(self, key: str, member: str | None) -> Tx:
        """Guard: the highest-scored member of the sorted set at ``key`` is ``member`` (ties: the greatest member,
        as ``ZREVRANGE`` orders them); ``None``: the set is empty. Nothing newer was added since it was read."""
        self.ops.append(("ztop", key, member or "", ""))
        return self

    # -- writes ----------------------------------------------------------------------------------------------
    def set(self, key: str, value: str | bytes, px: int | None = None) -> Tx:
        """Write: SET ``key`` (with a millisecond TTL when ``px`` is given)."""
        self.ops.append(("setpx", key, value, str(px)) if px else ("set", key, value, ""))
        return self

    def delete_key(self, key: str) -> Tx:
        """Write: DEL ``key``."""
        self.ops.append(("del", key, "", ""))
        return self

    def hset(self, key: str, name: str, value: str) -> Tx:
        """Write: HSET."""
        self.ops.append(("hset", key, name, value))
        return self

    def hdel(self, key: str, name: str) -> Tx:
        """Write: HDEL."""
        self.ops.append(("hdel", key, name, ""))
        return self

    def hincrby(self, key: str, name: str, by: int) -> Tx:
        """Write: HINCRBY (a counter that other transitions bump too, so no read-compare-write)."""
        self.ops.append(("hincrby", key, name, str(by)))
        return self

    def sadd(self, key: str, member: str) -> Tx:
        """Write: SADD."""
        self.ops.append(("sadd", key, member, ""))
        return self

    def srem(self, key: str, member: str) -> Tx:
        """Write: SREM."""
        self.ops.append(("srem", key, member, ""))
        return self

    def zadd(self, key: str, score: float, member: str) -> Tx:
        """Write: ZADD."""
        self.ops.append(("zadd", key, repr(score), member))
        return self

    def zrem(self, key: str, member: str) -> Tx:
        """Write: ZREM."""
        self.ops.append(("zrem", key, member, ""))
        return self

    def rpush(self, key: str, value: str) -> Tx:
        """Write: RPUSH."""
        self.ops.append(("rpush", key, value, ""))
        return self

    # -- the change ------------------------------------------------------------------------------------------
    def put(self, table: str, entity: dict[str, Any]) -> Tx:
        """Record the full snapshot of ``entity`` in the change, for mirrors' table ``table``."""
        self.upsert.setdefault(table, []).append(entity)
        return self

    def drop(self, table: str, entity_id: str) -> Tx:
        """Record the deletion of ``entity_id`` from mirrors' table ``table``."""
        self.delete.setdefault(table, []).append(entity_id)
        return self

    def patch(self, table: str, before: dict[str, Any], after: dict[str, Any]) -> Tx:
        """Record only what changed from ``before`` to ``after`` (a field that went is ``None``), for mirrors that
        hold the row already: a transition that touches a few fields of a large row (a lease renewal of a run
        carrying its earlier attempts' output) does not repeat the rest in the stream."""
        diff = {k: after.get(k) for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
        self.patches.setdefault(table, []).append({**diff, "id": after["id"]})
        return self

    def trim(self, table: str, entity_id: str) -> Tx:
        """Record that ``entity_id`` left Redis on purpose (it fell out of its history window): mirrors keep
        their row and mark it archived, unlike ``drop``."""
        self.trimmed.setdefault(table, []).append(entity_id)
        return self

    def note(self, transition: str) -> Tx:
        """Name a further transition this one includes (e.g. ``loop_advanced`` inside ``run_succeeded``)."""
        if transition and transition != "none":
            self.also.append(transition)
        return self

    def describe(self, **facts: Any) -> Tx:
        """Add ``facts`` to the change's ``detail`` (for readers other than mirrors, which ignore it)."""
        self.detail.update(facts)
        return self

    def change_data(self) -> str:
        """The JSON body of the change entry."""
        body: dict[str, Any] = {}
        if self.also:
            body["also"] = self.also
        if self.upsert:
            body["upsert"] = self.upsert
        if self.delete:
            body["delete"] = self.delete
        if self.patches:
            body["patch"] = self.patches
        if self.trimmed:
            body["trim"] = self.trimmed
        if self.detail:
            body["detail"] = self.detail
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class CommitResult:
    """The outcome of a commit: the change's stream id, or the index of the guard that failed."""

    ok: bool
    change_id: str | None = None
    failed_guard: int | None = None
    #: With ``replicas``: how many replicas acknowledged the transition (``WAIT``); None when not asked.
    replicated: int | None = None
    #: With ``replicas``: the (host, port) of the server that made the transition.
    server: tuple[Any, Any] | None = None
    #: With ``then``: the replies of the commands it queued behind the transition (an exception for one that
    #: failed; they are the caller's to judge).
    after: list[Any] = field(default_factory=list)


class Committer:
    """Commits ``Tx`` objects on one Redis connection (the script is loaded once per process)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self._script = client.register_script(_SCRIPT)

    def commit(self, tx: Tx, *, replicas: int = 0, wait_ms: int = 0,
               then: Callable[[Pipeline], object] | None = None, locate: bool = False) -> CommitResult:
        """Run ``tx`` atomically. Returns ``CommitResult(ok=False, failed_guard=i)`` when guard ``i`` failed.

        With ``replicas``, the script is followed on the same connection (one pipeline, no extra round trip) by
        ``WAIT replicas wait_ms``, whose answer is ``replicated``. ``then`` queues further commands behind it in
        the same round trip (their replies in ``after``). They run whether the transition applied or not, and
        other clients' commands may come in between, so each must carry its own guard (``timers.arm_after``:
        only while the loop is the one the transition wrote). ``locate`` reports ``server`` (and ``replicated``
        0) without a ``WAIT`` too (a write meant to be replicated while no replica is attached).
        """
        key_index: dict[str, int] = {self.keys.changes: 1}
        keys: list[str] = [self.keys.changes]
        # Every transition also stamps the dataset's instance id (first writer wins), which mirrors compare to
        # notice a flushed or replaced Redis.
        # ... and keeps maintenance's loop indexes (``loop_watch``) in step with every loop it writes or drops.
        ops = [*tx.ops, *index_ops(tx.upsert, tx.delete, tx.at, self.keys),
               ("setnx", self.keys.instance, gen_id() + gen_id(), "")]
        args: list[str | bytes] = [str(len(ops)), str(STREAM_MAXLEN)]
        for op, key, a, b in ops:
            if key not in key_index:
                keys.append(key)
                key_index[key] = len(keys)
            args.extend((op, str(key_index[key]), a, b))
        args.extend((tx.type, tx.at, tx.change_data()))
        replicated: int | None = None
        server: tuple[Any, Any] | None = None
        after: list[Any] = []
        if replicas > 0 or locate:
            (ok, value), replicated, server, after = self._commit_and_wait(keys, args, replicas, wait_ms, then)
        elif then is not None:
            (ok, value), after = self._commit_then(keys, args, then)
        else:
            ok, value = self._script(keys=keys, args=args)
        if int(ok) == 1:
            return CommitResult(ok=True, change_id=_text(value), replicated=replicated, server=server, after=after)
        return CommitResult(ok=False, failed_guard=int(value), replicated=replicated, server=server, after=after)

    def _commit_then(self, keys: list[str], args: list[str | bytes],
                     then: Callable[[Pipeline], object]) -> tuple[Any, list[Any]]:
        for attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            then(pipe)
            replies = pipe.execute(raise_on_error=False)
            if isinstance(replies[0], redis.exceptions.NoScriptError) and not attempt:
                self.client.script_load(_SCRIPT)  # a restarted or new master: load it, then once more
                continue
            if isinstance(replies[0], Exception):
                raise replies[0]
            return replies[0], replies[1:]
        raise AssertionError("unreachable")

    def _commit_and_wait(self, keys: list[str], args: list[str | bytes], replicas: int, wait_ms: int,
                         then: Callable[[Pipeline], object] | None) -> tuple[Any, int, tuple[Any, Any], list[Any]]:
        def build(pipe: Pipeline) -> None:
            pipe.evalsha(self._script.sha, len(keys), *keys, *args)
            if replicas > 0:
                pipe.wait(replicas, wait_ms)
            if then is not None:
                then(pipe)

        for attempt in range(2):
            server, replies = pipelined(self.client, build, raise_on_error=False)
            reply, acked, after = (replies[0], replies[1], replies[2:]) if replicas > 0 else (replies[0], 0, replies[1:])
            if isinstance(reply, redis.exceptions.NoScriptError) and not attempt:
                self.client.script_load(_SCRIPT)  # a restarted or new master: load it, then once more
                continue
            for answer in (reply, acked):
                if isinstance(answer, Exception):
                    raise answer
            return reply, int(acked), server, after
        raise AssertionError("unreachable")


def is_guard(op: str) -> bool:
    """True for guard operations (checked before any write)."""
    return op in _GUARDS


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
