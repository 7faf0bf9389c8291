"""Workflow specs: validation and normalisation of a spec body, its execution order, and reading a spec file.

Validation follows OpenLoops 0.3 §5.2: the reference's checks run in its order with its exact messages. loopsq's
extra checks are interleaved where they cannot change which reference message a spec gets, except that an extra
check may fire first when a spec has both an extra problem and a later reference problem:

- ``maxParallel`` (optional, default 1), then ``requires`` and ``pool`` (``domain.placement``), are checked right
  after check 5, so top-level problems come before step problems;
- ``dependsOn``, ``continueOnFailure``, ``timeoutMs``, ``account``, ``gate``, ``workspace``, ``requires`` and
  ``pool`` of step ``i`` are checked right after step ``i``'s target, before step ``i + 1`` and before the
  dependency checks (7) and the cycle check (8).

As with the reference's ``??``, ``dependsOn``, ``continueOnFailure`` and ``account`` given as ``null`` count as
absent. ``timeoutMs: null`` means "no timeout" and is kept.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from loopsq.domain import limits
from loopsq.domain.agent_options import with_creation_defaults
from loopsq.domain.checks import check_length, check_visible, whole
from loopsq.domain.loop_features import step_workspace_fields, validate_gate
from loopsq.domain.placement import placement_fields
from loopsq.domain.tags import validate_tags
from loopsq.domain.targets import (
    is_positive_int,
    js_trim,
    short_repr,
    validate_account,
    validate_executable_target,
    validate_timeout_ms,
)
from loopsq.domain.text import shown
from loopsq.domain.user_files import NotRegularFileError, open_regular_file
from loopsq.errors import ValidationError

_STEP_ID_RE = re.compile(limits.STEP_ID_PATTERN, re.ASCII)


def _is_number(value: Any) -> bool:
    # bool is an int in Python but not a number in JSON; non-finite floats cannot be written back as JSON.
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _normalise_step(raw: Any, index: int, seen: set[str]) -> dict[str, Any]:
    """Runs check 6 for one step, then loopsq's extra step checks, and returns the normalised step."""
    label = f"workflow.steps[{index}]"
    if not isinstance(raw, Mapping):
        raise ValidationError(f"{label} must be an object")
    step = dict(raw)
    step_id = step.get("id")
    if not isinstance(step_id, str) or not js_trim(step_id):
        raise ValidationError(f"{label}.id must be a non-empty string")
    if len(step_id) > limits.MAX_STEP_ID_LENGTH or not _STEP_ID_RE.fullmatch(step_id):
        raise ValidationError(
            f"{label}.id must match {limits.STEP_ID_PATTERN} (at most {limits.MAX_STEP_ID_LENGTH} characters), "
            f"got {short_repr(step_id)}"
        )
    if step_id in seen:
        raise ValidationError(f"duplicate workflow step id: {step_id}")
    seen.add(step_id)
    step["target"] = with_creation_defaults(validate_executable_target(step.get("target"), f"{label}.target"))

    depends_on = step.get("dependsOn")
    if depends_on is None:
        depends_on = []
    # The reference iterates a string character by character; loopsq names the mistake instead.
    if not isinstance(depends_on, list | tuple) or not all(isinstance(dep, str) for dep in depends_on):
        raise ValidationError(f"{label}.dependsOn must be an array of step ids, got {short_repr(depends_on)}")
    if len(depends_on) > limits.MAX_STEPS:
        raise ValidationError(
            f"{label}.dependsOn must have at most {limits.MAX_STEPS} step ids, got {short_repr(depends_on)}"
        )
    step["dependsOn"] = list(depends_on)

    continue_on_failure = step.get("continueOnFailure")
    if continue_on_failure is None:
        continue_on_failure = False
    if not isinstance(continue_on_failure, bool):
        raise ValidationError(
            f"{label}.continueOnFailure must be a boolean, got {short_repr(continue_on_failure)}"
        )
    step["continueOnFailure"] = continue_on_failure

    if "timeoutMs" in step:
        step["timeoutMs"] = whole(step["timeoutMs"])
        validate_timeout_ms(step["timeoutMs"], label)
    if step.get("account") is not None:
        step["account"] = validate_account(step["account"], label)
    else:
        step.pop("account", None)
    if step.get("gate") is not None:
        step["gate"] = validate_gate(step["gate"], f"{label}.gate")  # a per-step change gate (executor.gate)
    else:
        step.pop("gate", None)
    step.update(step_workspace_fields(step, label))  # a per-step workspace lease (engine.step_workspaces)
    placement = placement_fields(step, f"{label}.")  # where the step may run; "none" values are dropped
    for name in ("requires", "pool"):
        step.pop(name, None)
    step.update(placement)
    return step


def validate_workflow_name(name: Any) -> str:
    """A workflow name, trimmed as the reference trims it: not empty (the reference's message), at most
    ``MAX_NAME_LENGTH`` characters, and without control, format, bidi or zero-width characters once trimmed."""
    if not isinstance(name, str) or not js_trim(name):
        raise ValidationError("workflow.name must be a non-empty string")
    check_length(name, "workflow.name", limits.MAX_NAME_LENGTH)
    return check_visible(js_trim(name), "workflow.name")


def workflow_body_from_json(value: Any, name_override: str | None = None) -> dict[str, Any]:
    """Validates a decoded workflow spec and returns its normalised body.

    Args:
        value: The decoded JSON of a spec file (§5.1).
        name_override: A name that replaces ``value["name"]`` (the reference's ``nameOverride ?? value.name``).

    Returns:
        ``{name, description?, version, maxParallel, requires?, pool?, steps}``: the name trimmed, ``version`` 1
        unless a number was given, ``maxParallel`` 1 unless given, ``requires`` sorted and ``pool`` (left out when
        they name none), and each step copied with ``dependsOn`` (default ``[]``), ``continueOnFailure`` (default
        ``False``), a validated target and its own ``requires``/``pool`` (likewise); unknown step fields are kept
        as-is.

    Raises:
        ValidationError: With the message of the first failed check, in the order described in the module doc.
    """
    if not isinstance(value, Mapping):
        raise ValidationError("workflow file must be an object")
    name = validate_workflow_name(name_override if name_override is not None else value.get("name"))
    raw_steps = value.get("steps")
    if not isinstance(raw_steps, list | tuple):
        raise ValidationError("workflow.steps must be an array")
    body: dict[str, Any] = {"name": name}
    if isinstance(value.get("description"), str):
        body["description"] = check_length(value["description"], "workflow.description",
                                           limits.MAX_DESCRIPTION_LENGTH)
    version = value.get("version")
    body["version"] = version if _is_number(version) else 1
    if abs(body["version"]) > limits.MAX_VERSION:
        raise ValidationError(
            f"workflow.version must be at most {limits.MAX_VERSION} in absolute value, got {short_repr(version)}"
        )
    if not raw_steps:
        raise ValidationError("workflow.steps must contain at least one step")
    if len(raw_steps) > limits.MAX_STEPS:
        raise ValidationError(f"workflow.steps must have at most {limits.MAX_STEPS} steps, got {len(raw_steps)}")

    max_parallel = whole(value.get("maxParallel"))
    if max_parallel is None:
        max_parallel = 1
    if not is_positive_int(max_parallel):
        raise ValidationError(
            f"workflow.maxParallel must be a positive integer, got {short_repr(max_parallel)}"
        )
    if max_parallel > limits.MAX_PARALLEL:
        raise ValidationError(f"workflow.maxParallel must be at most {limits.MAX_PARALLEL}, got {max_parallel}")
    body["maxParallel"] = max_parallel
    body.update(placement_fields(value, "workflow."))
    tags = validate_tags(value.get("tags"), "workflow.tags")
    if tags is not None:
        body["tags"] = tags

    seen: set[str] = set()
    steps = [_normalise_step(raw, index, seen) for index, raw in enumerate(raw_steps)]
    for step in steps:
        for dep in step["dependsOn"]:
            if dep not in seen:
                raise ValidationError(f"step {step['id']} depends on missing step {shown(dep)}")
            if dep == step["id"]:
                raise ValidationError(f"step {step['id']} cannot depend on itself")
    execution_order(steps)
    body["steps"] = steps
    return body


def execution_order(steps: Sequence[Mapping[str, Any]]) -> list[str]:
    """Orders step ids so that each comes after all its dependencies, and otherwise in declaration order.

    This is the reference's ``workflowExecutionOrder``: a depth-first search over the steps in declaration order
    that visits a step's dependencies (in their listed order) before the step. It is iterative, so a chain of
    thousands of steps does not exhaust the stack.

    Args:
        steps: Steps with ``id`` and optional ``dependsOn``, e.g. the ``steps`` of a normalised body.

    Returns:
        Every step id once, in execution order.

    Raises:
        ValidationError: ``workflow dependency cycle includes step <id>``, naming the step the search re-enters
            (the head of the back edge): for ``a`` depending on ``b`` and ``b`` on ``a`` it names ``a``. Also
            ``step <id> depends on missing step <dep>`` if a dependency is not a step.
    """
    deps: dict[str, list[str]] = {step["id"]: list(step.get("dependsOn") or []) for step in steps}
    done: set[str] = set()
    visiting: set[str] = set()
    order: list[str] = []
    for step in steps:
        root = step["id"]
        if root in done:
            continue
        visiting.add(root)
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(deps[root]))]
        while stack:
            node, pending = stack[-1]
            for dep in pending:
                if dep in done:
                    continue
                if dep in visiting:
                    raise ValidationError(f"workflow dependency cycle includes step {shown(dep)}")
                if dep not in deps:
                    raise ValidationError(f"step {shown(node)} depends on missing step {shown(dep)}")
                visiting.add(dep)
                stack.append((dep, iter(deps[dep])))
                break
            else:
                stack.pop()
                visiting.discard(node)
                done.add(node)
                order.append(node)
    return order


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _read_bounded(path: str) -> bytes:
    """The file's bytes, refusing it unread when its size is known to exceed ``MAX_SPEC_FILE_BYTES`` and after
    ``MAX_SPEC_FILE_BYTES + 1`` bytes otherwise (a file still growing); only a regular file is read."""
    limit = limits.MAX_SPEC_FILE_BYTES
    too_big = f"workflow file is larger than {limit} bytes: {path}"
    with open_regular_file(path) as handle:  # a FIFO or a device is refused, never waited on or read
        info = os.fstat(handle.fileno())
        if info.st_size > limit:
            raise ValidationError(too_big)
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ValidationError(too_big)
    return data


def load_workflow_file(path: str) -> Any:
    """Reads a workflow spec file (at most ``MAX_SPEC_FILE_BYTES``) and decodes its JSON (a UTF-8 byte order mark
    is allowed).

    Args:
        path: The file's path.

    Returns:
        The decoded JSON value, not yet validated (see :func:`workflow_body_from_json`).

    Raises:
        ValidationError: ``workflow file not found: <path>``, ``workflow file is a directory: <path>``,
            ``workflow file is not a regular file: <path> (a FIFO)`` (a FIFO, a device or a socket),
            ``workflow file is larger than <N> bytes: <path>``, ``workflow file is not readable: <path>: <reason>``
            or ``workflow file is not valid JSON: <path>: <msg> (line N column M)``.
    """
    try:
        text = _read_bounded(path).decode("utf-8-sig")
    except FileNotFoundError as exc:
        raise ValidationError(f"workflow file not found: {path}") from exc
    except IsADirectoryError as exc:
        raise ValidationError(f"workflow file is a directory: {path}") from exc
    except NotRegularFileError as exc:
        raise ValidationError(f"workflow file is not a regular file: {path} ({exc.kind})") from exc
    except OSError as exc:
        raise ValidationError(f"workflow file is not readable: {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8 text (byte {exc.start})"
        raise ValidationError(f"workflow file is not readable: {path}: {reason}") from exc
    except ValueError as exc:  # e.g. an embedded NUL in the path
        raise ValidationError(f"workflow file is not readable: {path}: {exc}") from exc
    try:
        # JSON has no NaN or Infinity, though Python's decoder accepts them by default.
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        where = f"(line {exc.lineno} column {exc.colno})"
        raise ValidationError(f"workflow file is not valid JSON: {path}: {exc.msg} {where}") from exc
    except ValueError as exc:
        raise ValidationError(f"workflow file is not valid JSON: {path}: {exc}") from exc
    except RecursionError as exc:
        raise ValidationError(f"workflow file is not valid JSON: {path}: nesting too deep") from exc
