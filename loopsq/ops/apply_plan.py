"""``loopsq apply`` and ``export``: loops kept as files, planned against what is stored, then applied.

A spec is a loop's create body (the API's camelCase fields, ``name`` its identity). The plan says for each one
``create``, ``update`` (with the fields that change) or ``unchanged``, and ``prune`` for the loops this apply owns
that no file names any more. Everything is validated while planning, so one bad spec refuses the whole apply and
nothing is written. Operator state wins: a loop's status is never changed unless its spec sets ``status``
explicitly. The owner of the loops an apply creates is recorded as the tag ``OWNER_TAG``; ``prune`` removes only
loops carrying the owner given, never an operator's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis

from loopsq.domain.loop_spec import new_loop, validate_name
from loopsq.domain.loop_update import UPDATABLE, create_body, updated_loop
from loopsq.domain.models import Loop
from loopsq.domain.tags import check_tag_value, validate_tags
from loopsq.domain.text import quoted
from loopsq.engine.routing import arm_created, arm_updated
from loopsq.errors import LoopsqError, ValidationError
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore

#: The tag recording which apply created a loop (``--owner``).
OWNER_TAG = "apply.owner"
#: The statuses a spec may set explicitly.
SPEC_STATUSES = ("active", "paused", "stopped")
#: How many specs one API or SDK apply takes.
MAX_SPECS = 1000
_SPEC_KEYS = frozenset({"name", "status", *UPDATABLE})


@dataclass
class Step:
    """One line of the plan."""

    action: str  # create | update | unchanged | prune
    name: str
    changes: list[str] = field(default_factory=list)
    loop: Loop | None = None
    patch: dict[str, Any] | None = None
    status: str | None = None

    def line(self) -> str:
        """``update nightly (schedule, maxAttempts)``; ``create x``; ``unchanged y``; ``prune z``."""
        detail = f" ({', '.join(self.changes)})" if self.changes else ""
        return f"{self.action} {self.name}{detail}"


def read_specs(path: str) -> list[tuple[str, dict[str, Any]]]:
    """The loop specs of a file (a list of specs, ``{"loops": [...]}`` or one spec; JSON, or YAML when PyYAML is
    installed) or of every ``*.json``/``*.yaml``/``*.yml`` file of a directory, in name order: ``(where, spec)``.

    Raises:
        ValidationError: ``<file>: ...`` for a file that cannot be read or parsed, or is not specs.
    """
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith((".json", ".yaml", ".yml")))
    else:
        files = [path]
    out: list[tuple[str, dict[str, Any]]] = []
    for file in files:
        try:
            with open(file, encoding="utf-8") as handle:
                text = handle.read(4_000_001)
        except OSError as exc:
            raise ValidationError(f"{file}: cannot read: {exc.strerror}") from exc
        if len(text) > 4_000_000:
            raise ValidationError(f"{file}: larger than 4000000 characters")
        data = _parse(file, text)
        items = data.get("loops") if isinstance(data, dict) and "loops" in data else data
        items = items if isinstance(items, list) else [items]
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise ValidationError(f"{file}: loop {index + 1} must be an object, got {quoted(item)}")
            out.append((f"{file}: loop {quoted(item.get('name'))}", item))
    return out


def body_specs(items: Any) -> list[tuple[str, dict[str, Any]]]:
    """The specs of an API or SDK request (a list of create bodies): ``(where, spec)``, where is
    ``loops[<i>] "<name>"``.

    Raises:
        ValidationError: ``loops must be an array of at most 1000 loop specs`` or ``loops[<i>] must be an object``.
    """
    if not isinstance(items, list | tuple) or len(items) > MAX_SPECS:
        raise ValidationError(f"loops must be an array of at most {MAX_SPECS} loop specs, got {quoted(items)}")
    out: list[tuple[str, dict[str, Any]]] = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValidationError(f"loops[{index}] must be an object, got {quoted(item)}")
        out.append((f"loops[{index}] {quoted(item.get('name'))}", dict(item)))
    return out


def _parse(file: str, text: str) -> Any:
    if file.endswith((".yaml", ".yml")):
        try:
            import yaml  # type: ignore[import-untyped]  # (optional: PyYAML, when installed)
        except ImportError as exc:
            raise ValidationError(f"{file}: reading YAML needs PyYAML (pip install pyyaml); or use JSON") from exc
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValidationError(f"{file}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValidationError(f"{file}: not valid JSON: {exc}") from exc


def plan(client: redis.Redis, keys: Keys, specs: list[tuple[str, dict[str, Any]]], now: datetime,
         owner: str | None, prune: bool) -> list[Step]:
    """The plan of ``specs`` against the stored loops; every spec validated (nothing is written).

    Raises:
        ValidationError: ``<file>: loop "<name>": <message>`` for the first bad spec.
    """
    store = LoopStore(client, keys)
    steps: list[Step] = []
    seen: set[str] = set()
    for where, spec in specs:
        try:
            steps.append(_plan_one(store, spec, now, owner, seen))
        except LoopsqError as exc:
            raise ValidationError(f"{where}: {exc.message}") from exc
    if prune:
        for loop in store.all():
            if (loop.tags or {}).get(OWNER_TAG) == owner and loop.name not in seen:
                steps.append(Step("prune", loop.name, loop=loop))
    return steps


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
        if step.action == "create" and step.loop is not None:
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
    """``{"loops": [...]}``: the create bodies of the named loops (all unarchived loops when none is named), by
    name; ``apply`` takes them back unchanged."""
    store = LoopStore(client, keys)
    loops = [store.require(name) for name in names] if names else [lp for lp in store.all() if not lp.archived]
    return {"loops": [create_body(loop) for loop in sorted(loops, key=lambda lp: lp.name)]}
