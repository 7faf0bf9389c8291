"""The lines ``loopsq runs`` adds under a run for the beyond-the-reference features: its control-file outcome
(and the warning of a malformed file); and the line of a missed streak in place of a run's."""

from __future__ import annotations

from typing import Any

from loopsq.domain import missed
from loopsq.domain.control import describe
from loopsq.domain.run_rules import MISSED

#: The errors of runs skipped by a feature rather than by overlap: a closed gate, a busy workspace, a budget.
FEATURE_SKIPS = ("gate closed", "workspace busy")


def feature_lines(run: dict[str, Any]) -> list[str]:
    """``  outcome: no_op, next in 10m: <note>`` and ``  warning: control file ignored: …`` where they apply."""
    lines = []
    error = str(run.get("error") or "")
    if run.get("status") == "skipped" and error.startswith(FEATURE_SKIPS):
        lines.append(f"  skipped: {error}")
    if run.get("status") == MISSED and error:
        lines.append(f"  missed: {error}")
    if run.get("control"):
        lines.append(f"  outcome: {describe(run['control'])}")
    if run.get("inputTokens") is not None or run.get("costUsd") is not None:
        lines.append(f"  usage: {usage_text(run.get('inputTokens'), run.get('outputTokens'), run.get('costUsd'))}")
    if run.get("controlWarning"):
        lines.append(f"  warning: {run['controlWarning']}")
    return lines


def missed_head(run: dict[str, Any]) -> str:
    """A missed row's line, in the table's columns: ``<id>  <missed.label>   slot=<first> → <last>  <loop>``
    (the last slot's date left out when it is the first's)."""
    first, last = str(run["scheduledFor"]), str(run.get("missedLast") or run["scheduledFor"])
    span = f"slot={first}" if last == first else f"slot={first} → {_after(first, last)}"
    return f"{run['id']}  {missed.label(run.get('missedCount')):<10}  {span}  {run['loopName']}"


def _after(first: str, last: str) -> str:
    """``last`` without its date when ``first`` has the same one (``07:59:18.000Z``)."""
    day, sep, time = last.partition("T")
    return time if sep and first.startswith(day + "T") else last


def usage_text(inputs: int | None, outputs: int | None, cost: float | None) -> str:
    """``in=1200 out=340 cost=$0.0123`` (``cost=-`` when the provider reports none)."""
    money = "-" if cost is None else f"${cost:.4f}"
    return f"in={inputs or 0} out={outputs or 0} cost={money}"


def usage_total(runs: list[dict[str, Any]]) -> str | None:
    """``total: 3 runs with usage, in=... out=... cost=$...`` over ``runs``; None when none reported usage."""
    used = [r for r in runs if r.get("inputTokens") is not None or r.get("costUsd") is not None]
    if not used:
        return None
    costs = [float(r["costUsd"]) for r in used if r.get("costUsd") is not None]
    total = usage_text(sum(int(r.get("inputTokens") or 0) for r in used),
                       sum(int(r.get("outputTokens") or 0) for r in used), sum(costs) if costs else None)
    return f"total: {len(used)} runs with usage, {total}"
