"""Loops in Redis: create, read, lifecycle updates and removal, each one atomic transition with its change.

Updates are optimistic: read the stored JSON, compute the new loop in Python, and commit with a guard that the
stored JSON is still what was read; a lost race re-reads and tries again.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import redis

from loopsq.domain import lifecycle
from loopsq.domain.loop_spec import validate_name
from loopsq.domain.loop_update import updated_loop
from loopsq.domain.models import Loop
from loopsq.domain.schedules import parse_time
from loopsq.domain.text import shown
from loopsq.domain.timeutil import gen_id, to_iso, to_ms
from loopsq.errors import ConflictError, NotFoundError
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys
from loopsq.state.pool_registry import expect_pools, require_pools

MAX_RETRIES = 20
TABLE = "loops"
#: How many guards ``create`` puts before the pool guards (name free, name not an id, id free, id not a name).
_ID_GUARDS = 4


def _unarchived(loop: Loop, ref: str, doing: str) -> Loop:
    lifecycle.ensure_not_archived(loop, ref, doing)
    return loop


class LoopStore:
    """Loop definitions in Redis. Every method takes the time it should record; nothing reads a clock here."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None, committer: Committer | None = None) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.committer = committer or Committer(client, self.keys)

    # -- reads ----------------------------------------------------------------------------------------------
    def get(self, loop_id: str) -> Loop | None:
        """The loop with id ``loop_id``, or None."""
        raw = self.client.get(self.keys.loop(loop_id))
        return Loop.from_json(str(raw)) if raw else None

    def find(self, id_or_name: str) -> Loop | None:
        """Look a loop up by id first, then by name: as given (a name stored before names were NFC), then in its
        composed form (NFC), the form names are stored in."""
        loop = self.get(id_or_name)
        if loop is not None:
            return loop
        loop_id = self.client.hget(self.keys.loop_names, id_or_name)
        composed = unicodedata.normalize("NFC", id_or_name)
        if not loop_id and composed != id_or_name:
            loop_id = self.client.hget(self.keys.loop_names, composed)
        return self.get(str(loop_id)) if loop_id else None

    def require(self, id_or_name: str) -> Loop:
        """Like ``find``, but raises ``NotFoundError('loop not found: <x>')`` (the reference's message)."""
        loop = self.find(id_or_name)
        if loop is None:
            raise NotFoundError(f"loop not found: {shown(id_or_name)}")
        return loop

    def ids(self) -> list[str]:
        """Ids of every loop, sorted."""
        return sorted(str(i) for i in self.client.smembers(self.keys.loops))

    def all(self) -> list[Loop]:
        """Every loop (order of ``ids()``); entries that vanished meanwhile are left out."""
        ids = self.ids()
        if not ids:
            return []
        raws = self.client.mget([self.keys.loop(i) for i in ids])
        return [Loop.from_json(str(raw)) for raw in raws if raw]

    def get_many(self, loop_ids: list[str]) -> list[Loop]:
        """The loops that exist among ``loop_ids`` (in that order)."""
        if not loop_ids:
            return []
        raws = self.client.mget([self.keys.loop(i) for i in loop_ids])
        return [Loop.from_json(str(raw)) for raw in raws if raw]

    # -- writes ---------------------------------------------------------------------------------------------
    def create(self, loop: Loop) -> Loop:
        """Store a new loop. Raises ConflictError when its name is taken (loop names are unique in loopsq) or is
        another loop's id; a new id that happens to be an existing name is drawn again, so an id lookup never
        meets a name and a name lookup never meets an id. Raises ValidationError, writing nothing, when its
        ``pool`` does not exist (``pool_registry``); the write is guarded on the pool's record as read."""
        for _ in range(MAX_RETRIES):
            pools = require_pools(self.client, self.keys, [loop.pool], "pool")
            tx = (
                Tx("loop_created", loop.created_at)
                .expect_field(self.keys.loop_names, loop.name, None)
                .expect_absent(self.keys.loop(loop.name))
                .expect_absent(self.keys.loop(loop.id))
                .expect_field(self.keys.loop_names, loop.id, None)
            )
            expect_pools(tx, self.keys, pools)  # guards from _ID_GUARDS on: the pool is still as read
            (
                tx.set(self.keys.loop(loop.id), loop.to_json())
                .sadd(self.keys.loops, loop.id)
                .hset(self.keys.loop_names, loop.name, loop.id)
                .put(TABLE, loop.to_dict())
            )
            result = self.committer.commit(tx)
            if result.ok:
                return loop
            if result.failed_guard == 0:
                raise ConflictError(f"loop name already exists: {shown(loop.name)}")
            if result.failed_guard == 1:
                raise ConflictError(f"loop name is another loop's id: {shown(loop.name)}")
            if result.failed_guard is not None and result.failed_guard >= _ID_GUARDS:
                continue  # check the pool again: refused if it went, guarded on its new record if it changed
            loop = loop.with_changes(id=gen_id())
        raise ConflictError(f"no free loop id after {MAX_RETRIES} attempts; try again")

    def update(self, id_or_name: str, change_type: str, at: datetime, fn: Callable[[Loop], Loop]) -> Loop:
        """Apply ``fn`` to the current loop and store the result as one transition named ``change_type``.

        Raises:
            NotFoundError: when the loop does not exist (or vanished meanwhile).
            ConflictError: when the loop kept changing under us for ``MAX_RETRIES`` attempts.
        """
        loop_id = self.require(id_or_name).id
        for _ in range(MAX_RETRIES):
            raw = self.client.get(self.keys.loop(loop_id))
            if not raw:
                raise NotFoundError(f"loop not found: {shown(id_or_name)}")
            current = Loop.from_json(str(raw))
            new = fn(current)
            if new == current:
                return current  # a no-op writes nothing and appends no change
            tx = (
                Tx(change_type, to_iso(at))
                .expect(self.keys.loop(loop_id), str(raw))
                .set(self.keys.loop(loop_id), new.to_json())
                .put(TABLE, new.to_dict())
            )
            if self.committer.commit(tx).ok:
                return new
        raise ConflictError(f"loop {loop_id} changed concurrently {MAX_RETRIES} times; try again")

    def edit(self, id_or_name: str, patch: Mapping[str, Any], now: datetime) -> Loop:
        """Edit a loop's definition in place (``loop_update.updated_loop``) as one ``loop_updated`` transition:
        its id, name, status and history stay. A patch that changes nothing writes nothing. A new ``pool`` must
        exist, and the write is guarded on its record as read (as ``create`` is).

        Raises:
            ValidationError: for the first invalid field (nothing is written).
            NotFoundError: ``loop not found: <x>``.
            ConflictError: when the loop is archived, or kept changing under us.
        """
        loop_id = self.require(id_or_name).id
        for _ in range(MAX_RETRIES):
            raw = self.client.get(self.keys.loop(loop_id))
            if not raw:
                raise NotFoundError(f"loop not found: {shown(id_or_name)}")
            current = Loop.from_json(str(raw))
            new = updated_loop(current, patch, now, id_or_name)
            if new == current:
                return current
            tx = Tx("loop_updated", to_iso(now)).expect(self.keys.loop(loop_id), str(raw))
            if new.pool is not None and new.pool != current.pool:
                expect_pools(tx, self.keys, require_pools(self.client, self.keys, [new.pool], "pool"))
            tx.set(self.keys.loop(loop_id), new.to_json()).put(TABLE, new.to_dict())
            if self.committer.commit(tx).ok:
                return new
        raise ConflictError(f"loop {loop_id} changed concurrently {MAX_RETRIES} times; try again")

    def pause(self, id_or_name: str, now: datetime) -> Loop:
        """Set status ``paused`` (a paused loop: no-op; a stopped or expired one: refused)."""
        return self.update(id_or_name, "loop_paused", now, lambda loop: lifecycle.pause(_unarchived(loop, id_or_name, "pausing"), now))

    def resume(self, id_or_name: str, now: datetime) -> Loop:
        """Set status ``active``, scheduling the next slot again when the loop had none (after stop); a once loop
        whose one slot already has a run is refused (see ``lifecycle.resume``)."""
        return self.update(id_or_name, "loop_resumed", now,
                           lambda loop: lifecycle.resume(_unarchived(loop, id_or_name, "resuming"), now,
                                                         once_slot_ran=self._once_slot_ran(loop)))

    def _once_slot_ran(self, loop: Loop) -> bool:
        if loop.schedule.type != "once" or loop.next_run_at is not None or loop.schedule.at is None:
            return False
        slot = to_iso(parse_time(loop.schedule.at, loop.timezone, "schedule.at"))
        return bool(self.client.hexists(self.keys.slots(loop.id), slot))

    def stop(self, id_or_name: str, now: datetime) -> Loop:
        """Set status ``stopped`` and clear ``nextRunAt`` (a stopped or expired loop: no-op)."""
        return self.update(id_or_name, "loop_stopped", now, lambda loop: lifecycle.stop(_unarchived(loop, id_or_name, "stopping"), now))

    def archive(self, id_or_name: str, now: datetime) -> Loop:
        """Archive a loop (0.3.15): hidden from lists and counts, never run; an active loop is paused.

        Raises:
            ConflictError: ``loop is already archived: <x>`` (nothing is written).
        """
        return self.update(id_or_name, "loop_archived", now, lambda loop: lifecycle.archive(loop, now, id_or_name))

    def unarchive(self, id_or_name: str, now: datetime) -> Loop:
        """Restore an archived loop with the status it had when archived.

        Raises:
            ConflictError: ``loop is not archived: <x>`` (nothing is written).
        """
        return self.update(id_or_name, "loop_unarchived", now,
                           lambda loop: lifecycle.unarchive(loop, now, id_or_name))

    def rename(self, id_or_name: str, new_name: str, now: datetime) -> Loop:
        """Rename a loop (0.3.50): its name-index entry moves to the new name in the same transition that rewrites
        the loop, so no reader ever finds both names or neither; its id, and so its history, stay. Renaming to its
        own name changes nothing.

        Raises:
            ValidationError: for an empty or invalid name (``loop name must not be empty``).
            ConflictError: when another loop has the name, or an id equal to it.
            NotFoundError: when the loop does not exist.
        """
        name = validate_name(new_name)
        loop = self.require(id_or_name)
        for _ in range(MAX_RETRIES):
            raw = self.client.get(self.keys.loop(loop.id))
            if not raw:
                raise NotFoundError(f"loop not found: {id_or_name}")
            current = Loop.from_json(str(raw))
            if current.name == name:
                return current
            owner = self.client.hget(self.keys.loop_names, name)
            if owner or (name != current.id and self.client.exists(self.keys.loop(name))):
                raise ConflictError(f"loop name already exists: {name}")
            renamed = lifecycle.rename(current, name, now)
            tx = (
                Tx("loop_renamed", to_iso(now))
                .expect(self.keys.loop(loop.id), str(raw))
                .expect_field(self.keys.loop_names, name, None)
                .set(self.keys.loop(loop.id), renamed.to_json())
                .hset(self.keys.loop_names, name, loop.id)
                .put(TABLE, renamed.to_dict())
            )
            if name != current.id:
                tx.expect_absent(self.keys.loop(name))  # a name never equals another loop's id
            if self.client.hget(self.keys.loop_names, current.name) == loop.id:
                tx.expect_field(self.keys.loop_names, current.name, loop.id).hdel(self.keys.loop_names, current.name)
            if self.committer.commit(tx).ok:
                return renamed
        raise ConflictError(f"loop {loop.id} changed concurrently {MAX_RETRIES} times; try again")

    def remove(self, id_or_name: str, now: datetime) -> Loop:
        """Delete a loop definition. Returns the removed loop. Its runs stay in the mirrors (as the reference keeps
        them); in Redis, retention trims them (a removed loop has no history window)."""
        loop = self.require(id_or_name)
        for _ in range(MAX_RETRIES):
            raw = self.client.get(self.keys.loop(loop.id))
            if not raw:
                raise NotFoundError(f"loop not found: {shown(id_or_name)}")
            current = Loop.from_json(str(raw))
            tx = (
                Tx("loop_removed", to_iso(now))
                .expect(self.keys.loop(loop.id), str(raw))
                .delete_key(self.keys.loop(loop.id))
                .srem(self.keys.loops, loop.id)
                # Its runs leave Redis (they stay in the mirrors): a removed loop keeps no window.
                .zadd(self.keys.retention_due, to_ms(now), f"loop:{loop.id}")
                .drop(TABLE, loop.id)
            )
            if self.client.hget(self.keys.loop_names, current.name) == loop.id:
                tx.expect_field(self.keys.loop_names, current.name, loop.id).hdel(self.keys.loop_names, current.name)
            if self.committer.commit(tx).ok:
                return current
        raise ConflictError(f"loop {loop.id} changed concurrently {MAX_RETRIES} times; try again")
