"""Budgets (``--budget-runs N/day``, ``--budget-cost AMOUNT/day|week``): a loop's usage per calendar window and
the pause when a window's budget is reached.

Each finalized run (skipped ones excepted) adds itself to the loop's ``usage`` of the current UTC day and ISO
week (runs, tokens, cost), in the run's own finalize transition, for loops that have a budget or runs that
report usage. When a window's total reaches its budget, so that the next run would exceed it, the loop is
paused with the reason and the figures (``budget reached: 5 runs this day (limit 5/day)``,
``budget reached: $4.20 spent this week (limit $4.00/week)``). A window that has passed starts again from zero.
No I/O; the time is passed in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from loopsq.domain import limits
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import Advance, LoopRun
from loopsq.domain.text import quoted
from loopsq.domain.timeutil import to_iso
from loopsq.errors import ValidationError

PERIODS = ("day", "week")
PAUSED = "paused_by_budget"
#: The largest cost budget, in USD.
MAX_COST_USD = 1_000_000.0
_FLAG = re.compile(r"\$?(\d+(?:\.\d+)?)/(day|week)", re.ASCII)


def window_start(per: str, at: datetime) -> str:
    """The UTC date a window of ``per`` began at ``at``: the day itself, or the Monday of its ISO week."""
    day = at.date()
    return (day - timedelta(days=day.weekday()) if per == "week" else day).isoformat()


def parse_budget_flag(flag: str, text: str, *, cost: bool) -> dict[str, Any]:
    """``N/day`` (runs) or ``AMOUNT/day|week`` (cost, an optional ``$``) as ``{"limit", "per"}``."""
    match = _FLAG.fullmatch(text.strip())
    if match is None or (not cost and "." in match.group(1)) or (not cost and text.strip().startswith("$")):
        form = "AMOUNT/day or AMOUNT/week" if cost else "N/day or N/week"
        raise ValidationError(f"{flag} must be {form}, got {_q(text)}")
    try:
        amount = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only plain decimals
        raise ValidationError(f"{flag} must be a number, got {_q(text)}") from exc
    limit_value: int | float = float(amount) if cost else int(amount)
    maximum = MAX_COST_USD if cost else limits.MAX_COUNT
    if limit_value <= 0:
        raise ValidationError(f"{flag} must be greater than zero, got {_q(text)}")
    if limit_value > maximum:
        raise ValidationError(f"{flag} must be at most {maximum:.0f}/{match.group(2)}, got {_q(text)}")
    return {"limit": limit_value, "per": match.group(2)}


def _q(text: str) -> str:
    return "'" + text.replace("'", "\\'") + "'"


def validate_budget(value: Any, field: str, *, cost: bool) -> dict[str, Any] | None:
    """A create request's ``budgetRuns`` (``{"limit": <count>, "per": "day"|"week"}``) or ``budgetCost``
    (``{"limit": <USD>, ...}``)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"limit", "per"}:
        raise ValidationError(f"{field} must be an object with limit and per, got {quoted(value)}")
    per = value.get("per")
    if per not in PERIODS:
        raise ValidationError(f"{field}.per must be day or week, got {quoted(per)}")
    raw = value.get("limit")
    if isinstance(raw, float) and not cost and raw.is_integer():
        raw = int(raw)
    kind = "a positive number (USD)" if cost else "a positive integer"
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise ValidationError(f"{field}.limit must be {kind}, got {quoted(raw)}")
    if (not cost and not isinstance(raw, int)) or raw <= 0:
        raise ValidationError(f"{field}.limit must be {kind}, got {quoted(raw)}")
    maximum = MAX_COST_USD if cost else limits.MAX_COUNT
    if raw > maximum:
        raise ValidationError(f"{field}.limit must be at most {maximum:.0f}, got {quoted(raw)}")
    return {"limit": float(raw) if cost else int(raw), "per": per}


def _money(value: float) -> str:
    return f"${value:.2f}"


def account(advance: Advance, run: LoopRun, finished_at: datetime) -> Advance:
    """The loop after ``advance`` once ``run``'s usage is added to its windows, paused if a budget is reached."""
    loop = advance.loop
    reported = run.input_tokens is not None or run.cost_usd is not None
    if run.status == "skipped" or not (reported or loop.budget_runs or loop.budget_cost):
        return advance
    usage = dict(loop.usage or {})
    for per in PERIODS:
        start = window_start(per, finished_at)
        entry = usage.get(per) if isinstance(usage.get(per), dict) and usage[per].get("start") == start else None
        entry = dict(entry or {"start": start, "runs": 0, "inputTokens": 0, "outputTokens": 0, "costUsd": 0.0})
        entry["runs"] = int(entry.get("runs", 0)) + 1
        entry["inputTokens"] = int(entry.get("inputTokens", 0)) + (run.input_tokens or 0)
        entry["outputTokens"] = int(entry.get("outputTokens", 0)) + (run.output_tokens or 0)
        entry["costUsd"] = round(float(entry.get("costUsd", 0.0)) + (run.cost_usd or 0.0), 6)
        usage[per] = entry
    loop = loop.with_changes(usage=usage, updated_at=to_iso(finished_at))
    reason = reached(loop)
    if reason is not None and loop.status == "active":
        return Advance(loop.with_changes(status="paused", status_reason=reason), PAUSED)
    return Advance(loop, advance.transition)


def reached(loop: Loop) -> str | None:
    """The pause reason when one of the loop's budgets is reached in its current window, else None."""
    usage = loop.usage or {}
    if loop.budget_runs:
        per, limit = str(loop.budget_runs["per"]), int(loop.budget_runs["limit"])
        runs = int((usage.get(per) or {}).get("runs", 0))
        if runs >= limit:
            return f"budget reached: {runs} runs this {per} (limit {limit}/{per})"
    if loop.budget_cost:
        per, cap = str(loop.budget_cost["per"]), float(loop.budget_cost["limit"])
        spent = float((usage.get(per) or {}).get("costUsd", 0.0))
        if spent >= cap:
            return f"budget reached: {_money(spent)} spent this {per} (limit {_money(cap)}/{per})"
    return None
