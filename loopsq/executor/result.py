"""The executor's value types: ``SpawnInfo`` (who the child is) and ``ExecutorResult`` (how it ended)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SpawnInfo:
    """Who the child is, reported as soon as it starts: enough to judge its liveness later, from any host."""

    pid: int
    start_time: float | None
    host: str


@dataclass(frozen=True)
class ExecutorResult:
    """The outcome of one target execution (the reference's ``ExecutorResult`` plus ``cancelled``)."""

    status: str  # "succeeded" | "failed" | "timed_out" | "cancelled"
    exit_code: int | None
    stdout: str
    stderr: str
    error: str | None
    pid: int | None
    started_at: str
    finished_at: str
    duration_ms: int
    #: The reply's text where the provider's JSON names it (codewith's last agent message), else None.
    result_text: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the camelCase JSON form, without the fields that are None."""
        data: dict[str, Any] = {
            "status": self.status,
            "exitCode": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "error": self.error,
            "pid": self.pid,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "durationMs": self.duration_ms,
            "resultText": self.result_text,
        }
        return {key: value for key, value in data.items() if value is not None}
