"""The specs ``loopsq apply`` takes (loops and workflows, from files or from an API/SDK body) and the plan's steps.

A file holds ``{"loops": [...], "workflows": [...]}`` (either key may be left out), a list of loop specs, one loop
spec, or one workflow spec (an object with ``steps``, as ``loopsq workflows create`` takes it). A directory is
every ``*.json``/``*.yaml``/``*.yml`` file in it, in name order. Each spec comes with where it was found, for the
one ``error:`` line a bad spec gets: ``<file>: loop "<name>"`` or ``workflows[<i>] "<name>"``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loopsq.domain.models import Loop
from loopsq.domain.text import quoted
from loopsq.errors import LoopsqError, ValidationError
from loopsq.system.prompt_files import resolve_spec_prompt_files

#: The tag recording which apply created a loop or a workflow (``--owner``).
OWNER_TAG = "apply.owner"
#: How many specs (of each kind) one API or SDK apply takes.
MAX_SPECS = 1000

#: ``(where, spec)``: a spec and where it was found.
Located = tuple[str, dict[str, Any]]


@dataclass
class Specs:
    """The loop and workflow specs of one apply."""

    loops: list[Located] = field(default_factory=list)
    workflows: list[Located] = field(default_factory=list)


@dataclass
class Step:
    """One line of the plan."""

    action: str  # create | update | unchanged | prune
    name: str
    changes: list[str] = field(default_factory=list)
    loop: Loop | None = None
    patch: dict[str, Any] | None = None
    status: str | None = None
    kind: str = "loop"  # loop | workflow
    #: A workflow step's stored spec (update, unchanged, prune), its new body (create, update) and its id.
    workflow: dict[str, Any] | None = None
    body: dict[str, Any] | None = None
    workflow_id: str | None = None

    def line(self) -> str:
        """``update nightly (schedule, maxAttempts)``; ``create x``; ``unchanged y``; ``prune workflow z``."""
        detail = f" ({', '.join(self.changes)})" if self.changes else ""
        kind = "workflow " if self.kind == "workflow" else ""
        return f"{self.action} {kind}{self.name}{detail}"

    def public(self) -> dict[str, Any]:
        """The step as the CLI's ``--json``, the API and the SDK give it."""
        return {"action": self.action, "kind": self.kind, "name": self.name, "changes": self.changes}


def read_specs(path: str) -> Specs:
    """The specs of a file (JSON, or YAML when PyYAML is installed) or of every ``*.json``/``*.yaml``/``*.yml``
    file of a directory, in name order. A workflow's ``promptFile`` paths are read relative to its file.

    Raises:
        ValidationError: ``<file>: ...`` for a file that cannot be read or parsed, or is not specs.
    """
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith((".json", ".yaml", ".yml")))
    else:
        files = [path]
    out = Specs()
    for file in files:
        try:
            with open(file, encoding="utf-8") as handle:
                text = handle.read(4_000_001)
        except OSError as exc:
            raise ValidationError(f"{file}: cannot read: {exc.strerror}") from exc
        if len(text) > 4_000_000:
            raise ValidationError(f"{file}: larger than 4000000 characters")
        data = _parse(file, text)
        if isinstance(data, dict) and "steps" in data and not {"loops", "workflows"} & set(data):
            data = {"workflows": [data]}  # one workflow spec, as `loopsq workflows create` takes it
        if isinstance(data, dict) and {"loops", "workflows"} & set(data):
            loops, workflows = _items(data.get("loops", [])), _items(data.get("workflows", []))
        else:
            loops, workflows = _items(data), []
        for index, item in enumerate(loops):
            if not isinstance(item, dict):
                raise ValidationError(f"{file}: loop {index + 1} must be an object, got {quoted(item)}")
            out.loops.append((f"{file}: loop {quoted(item.get('name'))}", item))
        for index, item in enumerate(workflows):
            if not isinstance(item, dict):
                raise ValidationError(f"{file}: workflow {index + 1} must be an object, got {quoted(item)}")
            where = f"{file}: workflow {quoted(item.get('name'))}"
            try:
                spec = resolve_spec_prompt_files(item, os.path.dirname(os.path.abspath(file)))
            except LoopsqError as exc:
                raise ValidationError(f"{where}: {exc.message}") from exc
            out.workflows.append((where, dict(spec)))
    return out


def _items(data: Any) -> list[Any]:
    return data if isinstance(data, list) else [data]


def body_specs(loops: Any, workflows: Any = ()) -> Specs:
    """The specs of an API or SDK request (lists of create bodies); where is ``loops[<i>] "<name>"`` or
    ``workflows[<i>] "<name>"``.

    Raises:
        ValidationError: ``loops must be an array of at most 1000 loop specs``, ``loops[<i>] must be an object``
            (likewise for ``workflows``).
    """
    return Specs(_body_items(loops, "loops", "loop"), _body_items(workflows, "workflows", "workflow"))


def _body_items(items: Any, field_name: str, kind: str) -> list[Located]:
    if not isinstance(items, list | tuple) or len(items) > MAX_SPECS:
        raise ValidationError(
            f"{field_name} must be an array of at most {MAX_SPECS} {kind} specs, got {quoted(items)}")
    out: list[Located] = []
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise ValidationError(f"{field_name}[{index}] must be an object, got {quoted(item)}")
        out.append((f"{field_name}[{index}] {quoted(item.get('name'))}", dict(item)))
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
