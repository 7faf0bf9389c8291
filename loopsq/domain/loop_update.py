"""Editing a loop in place: a partial create body merged onto the loop's definition and validated as a create.

An update is validated exactly like a create (``loop_spec.new_loop`` on the merged body), so the two can never
disagree about what a loop may be. Only the definition changes: the id, name, status, history counters, pending
retry and budget usage stay. A change of schedule (or of the zone or jitter that place its slots) moves the next
slot to the first one after ``now`` under the new schedule, never into the past: no catch-up run of slots the
old schedule left behind, and no slot already taken is offered again.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from loopsq.domain import lifecycle
from loopsq.domain.loop_spec import new_loop, show
from loopsq.domain.models import Loop
from loopsq.domain.timeutil import to_iso
from loopsq.errors import ValidationError

#: The create body's fields an update may carry (camelCase), with the ``Loop`` attribute each one sets. A field
#: given as null returns to its default, as when a create omits it. ``name`` changes through ``rename``.
UPDATABLE: dict[str, str] = {
    "description": "description",
    "timezone": "timezone",
    "schedule": "schedule",
    "target": "target",
    "catchUp": "catch_up",
    "catchUpLimit": "catch_up_limit",
    "overlap": "overlap",
    "maxAttempts": "max_attempts",
    "retryDelayMs": "retry_delay_ms",
    "retryBackoff": "retry_backoff",
    "retryMaxDelayMs": "retry_max_delay_ms",
    "leaseMs": "lease_ms",
    "expiresAt": "expires_at",
    "expiresAfterRuns": "expires_after_runs",
    "pauseAfterFailures": "pause_after_failures",
    "keepRuns": "keep_runs",
    "jitterMs": "jitter_ms",
    "steerable": "steerable",
    "minIntervalMs": "min_interval_ms",
    "maxIntervalMs": "max_interval_ms",
    "gate": "gate",
    "workspace": "workspace",
    "workspaceWaitMs": "workspace_wait_ms",
    "requires": "requires",
    "pool": "pool",
    "budgetRuns": "budget_runs",
    "budgetCost": "budget_cost",
    "tags": "tags",
}
#: Fields an update may not set to null (a loop always has them).
REQUIRED = ("schedule", "target")


def create_body(loop: Loop) -> dict[str, Any]:
    """The create body that makes ``loop``'s definition (its jitter offset left to ``jitterMs``)."""
    stored = loop.to_dict()
    body = {key: stored[key] for key in UPDATABLE if stored.get(key) is not None}
    body["name"] = loop.name
    body["schedule"] = {k: v for k, v in body["schedule"].items() if k != "offsetMs"}
    return body


def check_patch(patch: Any) -> dict[str, Any]:
    """A patch's shape: an object of at least one updatable field, ``schedule`` and ``target`` not null.

    Raises:
        ValidationError: naming the first offending field and quoting its value.
    """
    if not isinstance(patch, Mapping):
        raise ValidationError(f"loop update must be an object, got {show(patch)}")
    if not patch:
        raise ValidationError("loop update must change at least one field, got {}")
    for key, value in patch.items():
        if key == "name":
            raise ValidationError(f"name is changed by rename, not update, got {show(value)}")
        if key not in UPDATABLE:
            raise ValidationError(f"unknown loop field: {show(key)}")
        if key in REQUIRED and value is None:
            raise ValidationError(f"{key} must not be null, got null")
    return dict(patch)


def updated_loop(current: Loop, patch: Mapping[str, Any], now: datetime, ref: str) -> Loop:
    """``current`` with ``patch`` applied (validated as ``new_loop`` validates a create), or ``current`` itself
    when the patch changes nothing.

    Raises:
        ValidationError: for the first invalid field (nothing is changed).
        ConflictError: when the loop is archived (``unarchive it before updating``).
    """
    changes = check_patch(patch)
    lifecycle.ensure_not_archived(current, ref, "updating")
    body = create_body(current)
    for key, value in changes.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    candidate = new_loop(body, now, loop_id=current.id)
    fields = {attr: getattr(candidate, attr) for attr in UPDATABLE.values()}
    if not candidate.expires_after_runs:
        fields["success_streak"] = None
    elif current.success_streak is None:
        fields["success_streak"] = 0
    moved = candidate.schedule != current.schedule or candidate.timezone != current.timezone
    if moved and current.next_run_at is not None:
        # The first slot after now under the new schedule: no catch-up of what the old one left behind.
        fields["next_run_at"] = candidate.next_run_at
    new = current.with_changes(**fields)
    if new == current:
        return current
    return new.with_changes(updated_at=to_iso(now))
