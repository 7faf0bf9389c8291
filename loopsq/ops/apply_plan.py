"""``loopsq apply`` and ``export``: loops and workflows kept as files, planned against what is stored, then applied.

A loop spec is a loop's create body (the API's camelCase fields, ``name`` its identity); a workflow spec is a
workflow's (``ops.apply_workflows``). The plan says for each one ``create``, ``update`` (with the fields that
change) or ``unchanged``, and ``prune`` for the loops and workflows this apply owns that no file names any more.
Everything is validated while planning, so one bad spec refuses the whole apply and nothing is written. Operator
state wins: a loop's status is never changed unless its spec sets ``status`` explicitly. The owner of what an apply
creates is recorded as the tag ``OWNER_TAG``; ``prune`` removes only loops (and archives only workflows) carrying
the owner given, never an operator's. A loop spec's workflow target may name its workflow by name (one of this
apply's, or a stored one); the loop stores its id, and ``export`` writes the name back.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import redis

from loopsq.domain.loop_spec import new_loop, validate_name
from loopsq.domain.loop_update import UPDATABLE, create_body, updated_loop
from loopsq.domain.tags import check_tag_value, validate_tags
from loopsq.domain.text import quoted
from loopsq.engine.routing import arm_created, arm_updated
from loopsq.errors import LoopsqError, NotFoundError, ValidationError
from loopsq.ops.apply_specs import OWNER_TAG, Specs, Step
from loopsq.ops.apply_workflows import execute_workflow_step, export_workflows, plan_workflows, workflow_names
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.workflows import WorkflowStore

#: The statuses a spec may set explicitly.
SPEC_STATUSES = ("active", "paused", "stopped")
_SPEC_KEYS = frozenset({"name", "status", *UPDATABLE})


def plan(client: redis.Redis, keys: Keys, specs: Specs, now: datetime, owner: str | None,
         prune: bool) -> list[Step]:
    """The plan of ``specs`` against the stored workflows and loops; every spec validated (nothing is written).
    Workflows come first (a loop may run one of them), and the prunes last: loops', then workflows'.

    Raises:
        ValidationError: ``<file>: workflow "<name>": <message>`` or ``<file>: loop "<name>": <message>`` for the
            first bad spec.
    """
    flows, planned = plan_workflows(client, keys, specs.workflows, owner, prune)
    store, workflows = LoopStore(client, keys), WorkflowStore(client, keys)
    steps: list[Step] = [step for step in flows if step.action != "prune"]
    seen: set[str] = set()
    for where, spec in specs.loops:
        try:
            steps.append(_plan_one(store, resolve_workflow_ref(spec, workflows, planned), now, owner, seen))
        except LoopsqError as exc:
            raise ValidationError(f"{where}: {exc.message}") from exc
    if prune:
        for loop in store.all():
            if (loop.tags or {}).get(OWNER_TAG) == owner and loop.name not in seen:
                steps.append(Step("prune", loop.name, loop=loop))
    return steps + [step for step in flows if step.action == "prune"]


def resolve_workflow_ref(spec: dict[str, Any], workflows: WorkflowStore,
                         planned: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A workflow target's ``workflowId`` given as an id or an active name (of a stored workflow, or, in an apply,
    of one of its ``planned`` workflows), turned into the id the loop stores; any other spec as it is.

    Raises:
        ValidationError: the name or id matches no workflow.
    """
    target = spec.get("target")
    if not isinstance(target, Mapping) or target.get("type") != "workflow":
        return spec
    ref = target.get("workflowId")
    if not isinstance(ref, str) or not ref.strip():
        return spec  # new_loop names the field
    workflow_id = (planned or {}).get(ref)
    if workflow_id is None:
        found = workflows.find(ref)
        if found is None:
            among = " or one of this apply's" if planned is not None else ""
            raise ValidationError(f"target.workflowId must name a stored workflow{among}, got {quoted(ref)}")
        workflow_id = str(found["id"])
    return {**spec, "target": {**target, "workflowId": workflow_id}}


def _plan_one(store: LoopStore, spec: Mapping[str, Any], now: datetime, owner: str | None,
              seen: set[str]) -> Step:
    unknown = sorted(set(spec) - _SPEC_KEYS)
    if unknown:
        raise ValidationError(f"unknown loop field: {quoted(unknown[0])}")
    name = validate_name(spec.get("name"))
    if name in seen:
        raise ValidationError(f"loop name given twice: {quoted(name)}")
    seen.add(name)
    status = spec.get("status")
    if status is not None and status not in SPEC_STATUSES:
        raise ValidationError(f"status must be one of {', '.join(SPEC_STATUSES)}, got {quoted(status)}")
    body = {key: value for key, value in spec.items() if key != "status"}
    current = store.find(name)
    if current is None:
        if owner is not None:
            body["tags"] = validate_tags({**(body.get("tags") or {}), OWNER_TAG: owner})
        loop = new_loop(body, now)
        return Step("create", name, loop=loop, status=status if status != "active" else None)
    patch: dict[str, Any] = {key: body.get(key) for key in UPDATABLE}  # absent: back to its default
    kept_owner = (current.tags or {}).get(OWNER_TAG)
    if kept_owner is not None:  # the owner tag stays on the loop it marks
        patch["tags"] = {**(patch.get("tags") or {}), OWNER_TAG: kept_owner}
    new = updated_loop(current, patch, now, name)
    before, after = create_body(current), create_body(new)
    changes = [key for key in UPDATABLE if before.get(key) != after.get(key)]
    wants = status if status is not None and status != current.status else None
    if not changes and wants is None:
        return Step("unchanged", name, loop=current)
    return Step("update", name, changes=changes + (["status"] if wants else []), loop=current,
                patch=patch if changes else None, status=wants)


def check_owner(owner: Any, prune: bool, field: str = "owner") -> str | None:
    """The owner of an apply: a tag value (``domain.tags``); ``prune`` needs one.

    Raises:
        ValidationError: ``<field> must be 1 to 128 characters of [A-Za-z0-9_./-], got …`` or ``prune requires
            <field> …``.
    """
    if owner is not None:
        check_tag_value(owner, field)
    if prune and owner is None:
        raise ValidationError(f"prune requires {field} (only loops an apply created are pruned)")
    return str(owner) if owner is not None else None


def execute(client: redis.Redis, keys: Keys, steps: list[Step], now: datetime) -> None:
    """Carry out a plan (``plan`` validated it): creates, updates, status changes asked for, prunes."""
    store = LoopStore(client, keys)
    for step in steps:
        if step.kind == "workflow":
            execute_workflow_step(client, keys, step, now)
        elif step.action == "create" and step.loop is not None:
            created = arm_created(client, keys, store.create(step.loop))
            _set_status(store, created.id, step.status, now)
        elif step.action == "update" and step.loop is not None:
            if step.patch is not None:
                arm_updated(client, keys, store.edit(step.loop.id, step.patch, now))
            if _set_status(store, step.loop.id, step.status, now):
                arm_created(client, keys, store.require(step.loop.id))
        elif step.action == "prune" and step.loop is not None:
            store.remove(step.loop.id, now)


def _set_status(store: LoopStore, loop_id: str, status: str | None, now: datetime) -> bool:
    if status is None:
        return False
    {"active": store.resume, "paused": store.pause, "stopped": store.stop}[status](loop_id, now)
    return True


def export_specs(client: redis.Redis, keys: Keys, names: list[str]) -> dict[str, Any]:
    """``{"loops": [...], "workflows": [...]}``: the create bodies of the named loops and active workflows (all
    unarchived loops and all active workflows when none is named), by name; ``apply`` takes them back unchanged.
    A loop that runs an active workflow names it by name.

    Raises:
        NotFoundError: ``no loop or workflow is named "<name>"``.
    """
    store = LoopStore(client, keys)
    if names:
        found = [store.find(name) for name in names]
        flows = export_workflows(client, keys, names)
        flow_names = {str(flow["name"]) for flow in flows}
        for name, loop in zip(names, found, strict=True):
            if loop is None and name not in flow_names:
                raise NotFoundError(f"no loop or workflow is named {quoted(name)}")
        loops = [loop for loop in found if loop is not None]
    else:
        loops = [loop for loop in store.all() if not loop.archived]
        flows = export_workflows(client, keys, None)
    by_id = workflow_names(client, keys)
    return {"loops": [_workflow_by_name(create_body(loop), by_id) for loop in sorted(loops, key=lambda lp: lp.name)],
            "workflows": flows}


def _workflow_by_name(body: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    target = body.get("target")
    if isinstance(target, dict) and target.get("type") == "workflow" and target.get("workflowId") in names:
        return {**body, "target": {**target, "workflowId": names[str(target["workflowId"])]}}
    return body
