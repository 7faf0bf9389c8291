"""The loop entity: its fields, the reference's defaults (§2.3) and its camelCase JSON shape.

A ``Loop`` is an immutable value; transitions produce new values with ``dataclasses.replace``. Timestamps are kept
as the ISO strings loopsq stores (``YYYY-MM-DDTHH:MM:SS.sssZ``) so that a stored loop round-trips byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from loopsq.domain.schedules import Schedule

LOOP_STATUSES = ("active", "paused", "stopped", "expired")
OVERLAP_POLICIES = ("skip", "allow", "replace")
RETRY_BACKOFFS = ("fixed", "exponential")

DEFAULT_CATCH_UP = "latest"
DEFAULT_CATCH_UP_LIMIT = 50
DEFAULT_OVERLAP = "skip"
DEFAULT_MAX_ATTEMPTS = 1
DEFAULT_RETRY_DELAY_MS = 60_000
DEFAULT_LEASE_MS = 1_800_000
#: The circuit breaker of a new loop (OpenLoops 0.4.0): paused after this many settled slots in a row did not
#: succeed. Written into every new loop (``loop_spec.new_loop``), so a loop stored before it keeps none.
DEFAULT_PAUSE_AFTER_FAILURES = 5

# snake_case attribute -> camelCase JSON key, in the order JSON output shows them.
_FIELDS: tuple[tuple[str, str], ...] = (
    ("id", "id"),
    ("name", "name"),
    ("description", "description"),
    ("status", "status"),
    ("schedule", "schedule"),
    ("target", "target"),
    ("next_run_at", "nextRunAt"),
    ("retry_scheduled_for", "retryScheduledFor"),
    ("retry_at", "retryAt"),
    ("catch_up", "catchUp"),
    ("catch_up_limit", "catchUpLimit"),
    ("overlap", "overlap"),
    ("max_attempts", "maxAttempts"),
    ("retry_delay_ms", "retryDelayMs"),
    ("retry_backoff", "retryBackoff"),
    ("retry_max_delay_ms", "retryMaxDelayMs"),
    ("lease_ms", "leaseMs"),
    ("expires_at", "expiresAt"),
    ("expires_after_runs", "expiresAfterRuns"),
    ("timezone", "timezone"),
    ("pause_after_failures", "pauseAfterFailures"),
    ("keep_runs", "keepRuns"),
    ("failure_streak", "failureStreak"),
    ("success_streak", "successStreak"),
    ("status_reason", "statusReason"),
    ("archived_at", "archivedAt"),
    ("archived_from_status", "archivedFromStatus"),
    ("retry_queue", "retryQueue"),
    ("steerable", "steerable"),
    ("min_interval_ms", "minIntervalMs"),
    ("max_interval_ms", "maxIntervalMs"),
    ("gate", "gate"),
    ("jitter_ms", "jitterMs"),
    ("workspace", "workspace"),
    ("workspace_wait_ms", "workspaceWaitMs"),
    ("requires", "requires"),
    ("pool", "pool"),
    ("budget_runs", "budgetRuns"),
    ("budget_cost", "budgetCost"),
    ("tags", "tags"),
    ("usage", "usage"),
    ("created_at", "createdAt"),
    ("updated_at", "updatedAt"),
)


@dataclass(frozen=True)
class Loop:
    """A recurring job: a schedule, a target (command, agent or workflow) and its policies."""

    id: str
    name: str
    schedule: Schedule
    target: dict[str, Any]
    timezone: str
    created_at: str
    updated_at: str
    status: str = "active"
    description: str | None = None
    next_run_at: str | None = None
    retry_scheduled_for: str | None = None
    retry_at: str | None = None
    catch_up: str = DEFAULT_CATCH_UP
    catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT
    overlap: str = DEFAULT_OVERLAP
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry_delay_ms: int = DEFAULT_RETRY_DELAY_MS
    retry_backoff: str = "fixed"
    retry_max_delay_ms: int | None = None
    lease_ms: int = DEFAULT_LEASE_MS
    expires_at: str | None = None
    #: Expire the loop after this many consecutive successful runs of its schedule (OpenLoops 0.5.3), counted in
    #: ``success_streak``; None: never (``run_rules.after_finish``).
    expires_after_runs: int | None = None
    #: The circuit breaker: pause after this many unsuccessful settled slots in a row; 0 turns it off, and a loop
    #: stored before the default breaker (None) has none.
    pause_after_failures: int | None = None
    #: How many settled runs Redis keeps for this loop (its history window); None: the deployment default.
    keep_runs: int | None = None
    failure_streak: int = 0
    #: Successful settled slots in a row, kept only on a loop with ``expires_after_runs`` (None otherwise).
    success_streak: int | None = None
    status_reason: str | None = None
    #: When the loop was archived (0.3.15) and the status it had then (``unarchive`` restores it).
    archived_at: str | None = None
    archived_from_status: str | None = None
    #: Retries waiting behind the pending one (``retryScheduledFor``), oldest first: ``{"slot", "at"}`` each.
    retry_queue: list[dict[str, str]] | None = None
    #: The run's control file may move the next slot (``nextIn``), within these bounds (``domain.steering``).
    steerable: bool | None = None
    min_interval_ms: int | None = None
    max_interval_ms: int | None = None
    #: A probe run before each scheduled slot: ``{"command", "timeoutMs"?}`` (``executor.gate``).
    gate: dict[str, Any] | None = None
    #: The spread of this loop's slots (``domain.jitter``); its offset is in ``schedule.offset_ms``.
    jitter_ms: int | None = None
    #: Loops sharing a workspace key never run at once, across hosts (``state.workspaces``); a run that finds it
    #: busy follows the overlap policy (``allow``: waits up to ``workspace_wait_ms`` in a fair queue).
    workspace: str | None = None
    workspace_wait_ms: int | None = None
    #: The worker labels every run needs (sorted, without duplicates; ``domain.labels``) and the fleet-wide pool
    #: its runs count against (``keys.pools``); None: none. Loops stored before these fields read as None.
    requires: list[str] | None = None
    pool: str | None = None
    #: Budgets ``{"limit", "per": "day"|"week"}`` and the usage of the current windows (``domain.budget``).
    budget_runs: dict[str, Any] | None = None
    budget_cost: dict[str, Any] | None = None
    #: ``key: value`` pairs to group and filter loops by (``domain.tags``); None: none.
    tags: dict[str, str] | None = None
    usage: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The camelCase JSON shape, with absent (None) fields dropped, as the reference's row mappers do."""
        out: dict[str, Any] = {}
        for attr, key in _FIELDS:
            value = getattr(self, attr)
            if value is None:
                continue
            out[key] = value.to_dict() if isinstance(value, Schedule) else value
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    def to_json(self) -> str:
        """Compact JSON of ``to_dict()``; this is the stored form in Redis."""
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Loop:
        """Build a loop from its stored camelCase shape (trusted input: written by loopsq)."""
        known = {key for _, key in _FIELDS}
        kwargs: dict[str, Any] = {}
        for attr, key in _FIELDS:
            if key in data and data[key] is not None:
                kwargs[attr] = data[key]
        kwargs["schedule"] = Schedule.from_dict(data["schedule"])
        kwargs["extra"] = {k: v for k, v in data.items() if k not in known}
        return cls(**kwargs)

    @classmethod
    def from_json(cls, text: str) -> Loop:
        """Parse the stored JSON form."""
        return cls.from_dict(json.loads(text))

    def with_changes(self, **changes: Any) -> Loop:
        """A copy with ``changes`` applied (``dataclasses.replace``)."""
        return replace(self, **changes)

    @property
    def archived(self) -> bool:
        """True while the loop is archived (hidden from lists and counts, not run)."""
        return self.archived_at is not None

    @property
    def target_type(self) -> str:
        """``command``, ``agent`` or ``workflow``."""
        return str(self.target.get("type", ""))
