"""Which live workers can run a loop's target, judged from what each publishes in its liveness record.

``doctor`` and ``create --preflight`` ask this, not the caller's own ``PATH``: a provider CLI on the shell's
``PATH`` but not on the workers' makes every run fail with ``Executable not found in PATH``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import redis

from loopsq.executor.capabilities import CAN, CANNOT, UNKNOWN, Verdict, judge_all
from loopsq.executor.preflight import step_target
from loopsq.ops.health import live_processes
from loopsq.state.keys import Keys
from loopsq.system.procs import hostname


class WorkflowSource(Protocol):
    """Where a workflow loop's spec comes from (the workflow store)."""

    def require(self, id_or_name: str) -> dict[str, Any]: ...


@dataclass
class Fit:
    """The live workers' verdicts on one target: who can, who cannot (and why), who cannot tell."""

    live: int = 0
    can: list[str] = field(default_factory=list)
    cannot: dict[str, str] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """Why the workers that cannot, cannot: ``<worker>: <reason>; ...`` (the first three)."""
        reasons = [*self.cannot.items(), *self.unknown.items()]
        text = "; ".join(f"{worker}: {reason}" for worker, reason in reasons[:3])
        return text + (f"; and {len(reasons) - 3} more" if len(reasons) > 3 else "")


def executable_targets(target: Mapping[str, Any], workflows: WorkflowSource) -> list[Mapping[str, Any]]:
    """The command and agent targets a loop target starts: itself, or a workflow's steps (all on one worker)."""
    if target.get("type") == "workflow":
        spec = workflows.require(str(target["workflowId"]))
        return [step_target(step) for step in spec["steps"]]
    return [target]


def fit(client: redis.Redis, keys: Keys, targets: list[Mapping[str, Any]],
        workers: list[dict[str, Any]] | None = None) -> Fit:
    """Judge ``targets`` against every live worker (``workers``: their liveness records, read when None)."""
    records = live_processes(client, keys, "worker") if workers is None else workers
    here = hostname()
    out = Fit(live=len(records))
    for record in records:
        worker = str(record.get("id"))
        verdict: Verdict = judge_all(targets, record.get("can"), same_host=record.get("host") == here)
        if verdict.status == CAN:
            out.can.append(worker)
        elif verdict.status == CANNOT:
            out.cannot[worker] = verdict.reason or ""
        else:
            assert verdict.status == UNKNOWN
            out.unknown[worker] = verdict.reason or ""
    return out


def describe_worker(record: Mapping[str, Any]) -> str:
    """What a worker publishes, in a line: ``claude 1.0.3, codex; accounts CLI 0.4`` (or what is missing)."""
    can = record.get("can")
    if not isinstance(can, Mapping):
        return "publishes nothing about what it can run (an older loopsq)"
    tools = can.get("tools") or {}
    names = ", ".join(f"{name} {info['version']}" if info.get("version") else name for name, info in tools.items())
    accounts = can.get("accounts")
    if accounts:
        accounts_text = f"accounts CLI {accounts['version']}" if accounts.get("version") else "accounts CLI"
    else:
        accounts_text = "no accounts CLI"
    return f"provider CLIs: {names or 'none'}; {accounts_text}"
