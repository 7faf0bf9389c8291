"""``loopsq apply`` and ``export`` for workflow specs: each planned by its active name against what is stored, then
created, edited in place (id kept) or, when pruned, archived.

A workflow spec is the body ``loopsq workflows create`` and ``POST /api/workflows`` take. It is validated while
planning (``domain.workflow_spec``, and its pools must exist), so one bad spec refuses the whole apply. An archived
workflow's name is free (``loopsq workflows archive``), so a spec naming only an archived workflow creates a new
one. The owner of the workflows an apply creates is recorded as the tag ``OWNER_TAG``, as on loops; ``prune``
archives only workflows carrying the owner given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import redis

from loopsq.domain.placement import workflow_pools
from loopsq.domain.tags import validate_tags
from loopsq.domain.text import quoted
from loopsq.domain.timeutil import gen_id
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.errors import LoopsqError, ValidationError
from loopsq.ops.apply_specs import OWNER_TAG, Located, Step
from loopsq.state.keys import Keys
from loopsq.state.pool_registry import require_named_pools
from loopsq.state.workflows import WorkflowStore

#: A workflow spec's fields besides its name, in the order a plan names the ones that change.
WORKFLOW_FIELDS = ("description", "version", "maxParallel", "requires", "pool", "tags", "steps")
_SPEC_KEYS = frozenset({"name", *WORKFLOW_FIELDS})
_STORED_ONLY = frozenset({"id", "status", "createdAt", "updatedAt"})


def stored_body(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A stored workflow as the spec that ``apply`` takes back unchanged (its id, status and times left out)."""
    return {key: value for key, value in spec.items() if key not in _STORED_ONLY}


def plan_workflows(client: redis.Redis, keys: Keys, specs: Iterable[Located], owner: str | None,
                   prune: bool) -> tuple[list[Step], dict[str, str]]:
    """The plan of workflow ``specs`` (prunes last), and the id each spec's name will have (a new workflow's id is
    drawn now), for loop specs that name their workflow.

    Raises:
        ValidationError: ``<where>: <message>`` for the first bad spec.
    """
    store = WorkflowStore(client, keys)
    steps: list[Step] = []
    ids: dict[str, str] = {}
    for where, spec in specs:
        try:
            step = _plan_one(client, keys, store, spec, owner, ids)
        except LoopsqError as exc:
            raise ValidationError(f"{where}: {exc.message}") from exc
        steps.append(step)
        ids[step.name] = str(step.workflow_id)
    if prune:
        for spec in store.all():
            if (spec.get("status") == "active" and (spec.get("tags") or {}).get(OWNER_TAG) == owner
                    and spec["name"] not in ids):
                steps.append(Step("prune", str(spec["name"]), kind="workflow", workflow=spec,
                                  workflow_id=str(spec["id"])))
    return steps, ids


def _plan_one(client: redis.Redis, keys: Keys, store: WorkflowStore, spec: Mapping[str, Any], owner: str | None,
              seen: Mapping[str, str]) -> Step:
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        raise ValidationError(f"unknown workflow field: {quoted(unknown[0])}")
    body = workflow_body_from_json(spec)
    name = str(body["name"])
    if name in seen:
        raise ValidationError(f"workflow name given twice: {quoted(name)}")
    current = store.active(name)
    kept_owner = owner if current is None else (current.get("tags") or {}).get(OWNER_TAG)
    if kept_owner is not None:  # recorded on the workflows an apply creates; kept on the ones it marks
        body["tags"] = validate_tags({**(body.get("tags") or {}), OWNER_TAG: kept_owner}, "workflow.tags")
    require_named_pools(client, keys, workflow_pools(body))
    if current is None:
        return Step("create", name, kind="workflow", body=body, workflow_id=gen_id())
    before = stored_body(current)
    changes = [key for key in WORKFLOW_FIELDS if before.get(key) != body.get(key)]
    action = "update" if changes else "unchanged"
    return Step(action, name, changes=changes, kind="workflow", workflow=current, body=body,
                workflow_id=str(current["id"]))


def execute_workflow_step(client: redis.Redis, keys: Keys, step: Step, now: datetime) -> None:
    """Carry out one workflow step of a plan (``plan_workflows`` validated it)."""
    store = WorkflowStore(client, keys)
    if step.action == "create" and step.body is not None:
        store.create(step.body, now, workflow_id=step.workflow_id)
    elif step.action == "update" and step.body is not None and step.workflow_id is not None:
        store.edit(step.workflow_id, step.body, now)
    elif step.action == "prune" and step.workflow_id is not None:
        store.archive(step.workflow_id, now)


def export_workflows(client: redis.Redis, keys: Keys, names: Iterable[str] | None) -> list[dict[str, Any]]:
    """The active workflows named (all of them when ``names`` is None) as specs, by name."""
    store = WorkflowStore(client, keys)
    if names is None:
        specs = [spec for spec in store.all() if spec.get("status") == "active"]
    else:
        specs = [spec for spec in (store.active(name) for name in names) if spec is not None]
    return [stored_body(spec) for spec in sorted(specs, key=lambda spec: str(spec["name"]))]


def workflow_names(client: redis.Redis, keys: Keys) -> dict[str, str]:
    """The active workflows' names by id."""
    store = WorkflowStore(client, keys)
    return {str(spec["id"]): str(spec["name"]) for spec in store.all() if spec.get("status") == "active"}
