"""A workflow run's state as read from or written to Redis: the run's and steps' JSON and the event count, the
status sets, and how a running step ended. Shared by the store and its control transitions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loopsq.state.commit import Tx
    from loopsq.state.keys import Keys

TERMINAL_RUN = frozenset({"succeeded", "failed", "timed_out", "cancelled"})
DONE_STEP = frozenset({"succeeded", "skipped", "cancelled"})
CLAIMABLE_STEP = frozenset({"pending", "failed", "timed_out"})
MAX_RETRIES = 50
#: A step run's fields that belong to one execution of it (and, for a step another worker ran, that worker and
#: the dispatch it claimed: ``state.remote_steps``), dropped when it starts again or is reset.
EXECUTION_FIELDS = frozenset({"startedAt", "finishedAt", "exitCode", "pid", "durationMs", "stdout", "stderr",
                              "error", "host", "pidStartTime", "workerId", "remote"})


def as_str(value: object) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def dumps_compact(value: Mapping[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def index_settled(tx: Tx, keys: Keys, run: Mapping[str, Any], at_ms: int) -> None:
    """A workflow run of its own (no parent loop run) that ends enters its workflow's history window (``tx``: the
    ending transition). A loop run's workflow runs belong to that run's window instead."""
    if run.get("loopRunId"):
        return
    workflow_id = str(run["workflowId"])
    tx.zadd(keys.workflow_runs(workflow_id), at_ms, str(run["id"]))
    tx.zadd(keys.retention_due, at_ms, f"workflow:{workflow_id}")


@dataclass
class WorkflowRunState:
    """A workflow run as last read or written: raw JSON of the run and of each step, and the event count."""

    run_id: str
    run_raw: str
    steps_raw: dict[str, str]
    events: int
    run: dict[str, Any] = field(init=False)
    steps: dict[str, dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.run = json.loads(self.run_raw)
        self.steps = {k: json.loads(v) for k, v in self.steps_raw.items()}

    @property
    def terminal(self) -> bool:
        """True once the run ended (succeeded, failed, timed_out or cancelled)."""
        return self.run.get("status") in TERMINAL_RUN

    def ordered_steps(self) -> list[dict[str, Any]]:
        """Step runs by their ``sequence`` (spec order)."""
        return sorted(self.steps.values(), key=lambda s: int(s["sequence"]))


@dataclass(frozen=True)
class StepEnd:
    """How a running step ended, to be recorded (alone, or with the start of the next step)."""

    step_id: str
    at: datetime
    status: str  # succeeded | failed | timed_out
    exit_code: int | None
    duration_ms: int
    stdout: str
    stderr: str
    error: str | None
