"""Where a run may go: the ``requires`` (worker labels) and ``pool`` (a fleet-wide cap) of a loop, a workflow or a
workflow step, checked as a create body gives them.

``requires`` is a list of labels (``labels.check_labels``: sorted, without duplicates, at most ``MAX_LABELS``);
``pool`` one label-shaped pool name (``labels.check_label``). Absent, ``null`` and ``[]`` all mean "none" and are
left out, so a loop stored before these fields existed and one created without them look the same. Each problem
raises ``ValidationError`` naming the field and quoting the value. Whether a named pool exists is the state
layer's question (``state.pool_registry``): this module does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loopsq.domain import labels
from loopsq.domain.text import quoted
from loopsq.errors import ValidationError


def check_requires(value: Any, field: str) -> list[str] | None:
    """A ``requires`` list, sorted and without duplicates; None for absent, ``null`` or ``[]``."""
    if value is None:
        return None
    # ``check_labels`` takes any iterable; a JSON object (its keys) or a set is not a list of labels.
    if not isinstance(value, list | tuple):
        raise ValidationError(f"{field} must be a list of labels, got {quoted(value)}")
    return labels.check_labels(value, field) or None


def check_pool(value: Any, field: str) -> str | None:
    """A pool name (label-shaped); None for absent or ``null``."""
    return None if value is None else labels.check_label(value, field)


def placement_fields(body: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``requires`` and ``pool`` of ``body``, checked and named ``<prefix>requires`` / ``<prefix>pool``; the ones
    that mean "none" are left out. The keys are the same as ``Loop`` attributes and as JSON keys."""
    out: dict[str, Any] = {}
    requires = check_requires(body.get("requires"), f"{prefix}requires")
    if requires is not None:
        out["requires"] = requires
    pool = check_pool(body.get("pool"), f"{prefix}pool")
    if pool is not None:
        out["pool"] = pool
    return out


def workflow_pools(spec: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(field, pool)`` for every pool a normalised workflow body names: its own (``workflow.pool``), then each
    step's (``workflow.steps[i].pool``), in that order, as the spec's own errors name them."""
    named: list[tuple[str, str]] = []
    if spec.get("pool") is not None:
        named.append(("workflow.pool", str(spec["pool"])))
    for index, step in enumerate(spec.get("steps") or ()):
        if isinstance(step, Mapping) and step.get("pool") is not None:
            named.append((f"workflow.steps[{index}].pool", str(step["pool"])))
    return named
