"""Workflow specs in Redis: create (active names unique), read, edit in place, archive; each one atomic
transition."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import redis

from loopsq.domain.placement import workflow_pools
from loopsq.domain.text import shown
from loopsq.domain.timeutil import gen_id, to_iso
from loopsq.errors import ConflictError, NotFoundError
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys
from loopsq.state.pool_registry import expect_pools, require_named_pools

MAX_RETRIES = 20
TABLE = "workflow_specs"
#: How many guards ``create`` puts before the pool guards (name free, name not an id, id free, id not a name).
_ID_GUARDS = 4


def _dumps(value: Mapping[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class WorkflowStore:
    """Workflow spec definitions in Redis."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None, committer: Committer | None = None) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.committer = committer or Committer(client, self.keys)

    def get(self, workflow_id: str) -> dict[str, Any] | None:
        """The spec with id ``workflow_id`` (any status), or None."""
        raw = self.client.get(self.keys.workflow(workflow_id))
        return dict(json.loads(str(raw))) if raw else None

    def find(self, id_or_name: str) -> dict[str, Any] | None:
        """By id (archived ones too), else by active name."""
        spec = self.get(id_or_name)
        if spec is not None:
            return spec
        wf_id = self.client.hget(self.keys.workflow_names, id_or_name)
        return self.get(str(wf_id)) if wf_id else None

    def require(self, id_or_name: str) -> dict[str, Any]:
        """Like ``find``; raises ``NotFoundError('workflow not found: <x>')``."""
        spec = self.find(id_or_name)
        if spec is None:
            raise NotFoundError(f"workflow not found: {shown(id_or_name)}")
        return spec

    def active(self, name: str) -> dict[str, Any] | None:
        """The active spec named ``name`` (never by id), or None."""
        wf_id = self.client.hget(self.keys.workflow_names, name)
        if not wf_id:
            return None
        return self.get(wf_id.decode() if isinstance(wf_id, bytes) else str(wf_id))

    def all(self) -> list[dict[str, Any]]:
        """Every spec, active and archived."""
        ids = sorted(str(i) for i in self.client.smembers(self.keys.workflows))
        if not ids:
            return []
        raws = self.client.mget([self.keys.workflow(i) for i in ids])
        return [dict(json.loads(str(raw))) for raw in raws if raw]

    def create(self, body: Mapping[str, Any], now: datetime, workflow_id: str | None = None) -> dict[str, Any]:
        """Store a validated, normalised workflow body as a new active spec (with id ``workflow_id`` when given:
        an apply names it in its plan before writing).

        Raises:
            ConflictError: when an active workflow already has that name, or ``workflow_id`` is taken.
            ValidationError: when the spec or one of its steps names a pool that does not exist
                (``pool_registry``); nothing is written, and the write is guarded on the pools' records as read.
        """
        stamp = to_iso(now)
        spec: dict[str, Any] = {"id": workflow_id or gen_id(), **body, "status": "active", "createdAt": stamp, "updatedAt": stamp}
        spec.setdefault("version", 1)
        name = str(spec["name"])
        for _ in range(MAX_RETRIES):
            pools = require_named_pools(self.client, self.keys, workflow_pools(spec))
            tx = (
                Tx("workflow_created", stamp)
                .expect_field(self.keys.workflow_names, name, None)
                .expect_absent(self.keys.workflow(name))
                .expect_absent(self.keys.workflow(spec["id"]))
                .expect_field(self.keys.workflow_names, spec["id"], None)
            )
            expect_pools(tx, self.keys, pools)  # guards from _ID_GUARDS on: the pools are still as read
            (
                tx.set(self.keys.workflow(spec["id"]), _dumps(spec))
                .sadd(self.keys.workflows, spec["id"])
                .hset(self.keys.workflow_names, name, spec["id"])
                .put(TABLE, spec)
            )
            result = self.committer.commit(tx)
            if result.ok:
                return spec
            if result.failed_guard is not None and result.failed_guard >= _ID_GUARDS:
                continue  # check the pools again: refused if one went, guarded on its new record if it changed
            if result.failed_guard == 0:
                existing = self.client.hget(self.keys.workflow_names, name)
                existing = existing.decode() if isinstance(existing, bytes) else existing
                raise ConflictError(
                    f"an active workflow is already named {shown(name)} ({existing}); archive it first")
            if result.failed_guard == 1:
                raise ConflictError(f"workflow name is another workflow's id: {shown(name)}")
            if workflow_id is not None:
                raise ConflictError(f"workflow id is taken: {shown(workflow_id)}; try again")
            spec["id"] = gen_id()  # the new id is taken (or is a name): draw another
        raise ConflictError(f"no free workflow id after {MAX_RETRIES} attempts; try again")

    def edit(self, workflow_id: str, body: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        """Replace an active spec's body in place (``loopsq apply``): its id, name, status and ``createdAt`` stay,
        so loops that run it by id run the new body from their next run on; a run already started keeps the spec
        it read. One ``workflow_updated`` transition, guarded on the spec as read and on its pools' records.

        Raises:
            NotFoundError: when there is no such spec.
            ConflictError: when it is archived, or changed concurrently ``MAX_RETRIES`` times.
            ValidationError: when the body names a pool that does not exist (nothing is written).
        """
        stamp = to_iso(now)
        for _ in range(MAX_RETRIES):
            raw = self.client.get(self.keys.workflow(workflow_id))
            if not raw:
                raise NotFoundError(f"workflow not found: {shown(workflow_id)}")
            current = dict(json.loads(str(raw)))
            if current.get("status") != "active":
                raise ConflictError(f"workflow is archived: {shown(workflow_id)}")
            spec: dict[str, Any] = {**body, "id": workflow_id, "name": current["name"], "status": "active",
                                    "createdAt": current.get("createdAt", stamp), "updatedAt": stamp}
            spec.setdefault("version", 1)
            pools = require_named_pools(self.client, self.keys, workflow_pools(spec))
            tx = Tx("workflow_updated", stamp).expect(self.keys.workflow(workflow_id), str(raw))
            expect_pools(tx, self.keys, pools)
            tx.set(self.keys.workflow(workflow_id), _dumps(spec)).put(TABLE, spec)
            if self.committer.commit(tx).ok:
                return spec
        raise ConflictError(f"workflow {workflow_id} changed concurrently {MAX_RETRIES} times; try again")

    def archive(self, id_or_name: str, now: datetime) -> dict[str, Any]:
        """Set status ``archived`` and free its name. Archiving an archived spec changes nothing."""
        wf_id = str(self.require(id_or_name)["id"])
        for _ in range(MAX_RETRIES):
            raw = self.client.get(self.keys.workflow(wf_id))
            if not raw:
                raise NotFoundError(f"workflow not found: {shown(id_or_name)}")
            spec = dict(json.loads(str(raw)))
            if spec.get("status") == "archived":
                return spec
            spec.update(status="archived", updatedAt=to_iso(now))
            tx = (
                Tx("workflow_archived", to_iso(now))
                .expect(self.keys.workflow(wf_id), str(raw))
                .set(self.keys.workflow(wf_id), _dumps(spec))
                .expect_field(self.keys.workflow_names, str(spec["name"]), wf_id)
                .hdel(self.keys.workflow_names, str(spec["name"]))
                .put(TABLE, spec)
            )
            if self.committer.commit(tx).ok:
                return spec
        raise ConflictError(f"workflow {wf_id} changed concurrently {MAX_RETRIES} times; try again")
