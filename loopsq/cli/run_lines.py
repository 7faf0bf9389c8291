"""The lines ``loopsq runs`` adds under a run for the beyond-the-reference features: its control-file outcome
(and the warning of a malformed file)."""

from __future__ import annotations

from typing import Any

from loopsq.domain.control import describe

#: The errors of runs skipped by a feature rather than by overlap: a closed gate, a busy workspace, a budget.
FEATURE_SKIPS = ("gate closed", "workspace busy")


def feature_lines(run: dict[str, Any]) -> list[str]:
    """``  outcome: no_op, next in 10m: <note>`` and ``  warning: control file ignored: …`` where they apply."""
    lines = []
    error = str(run.get("error") or "")
    if run.get("status") == "skipped" and error.startswith(FEATURE_SKIPS):
        lines.append(f"  skipped: {error}")
    if run.get("control"):
        lines.append(f"  outcome: {describe(run['control'])}")
    if run.get("controlWarning"):
        lines.append(f"  warning: {run['controlWarning']}")
    return lines
