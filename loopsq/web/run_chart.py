"""The loop page's chart of recent runs: one bar per run, oldest left, its height the run's duration (on a
scale up to the longest shown) and its colour its status. Pure geometry for the template's inline SVG.

A run without a duration (running, skipped before it started) gets a short stub so it is still visible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loopsq.domain import missed
from loopsq.domain.durations import format_duration
from loopsq.web.templating import run_status_shown

BAR_WIDTH = 14
BAR_GAP = 4
PLOT_HEIGHT = 120
STUB = 4
MARGIN_LEFT = 56
MARGIN = 8
AXIS_HEIGHT = 18


@dataclass(frozen=True)
class Bar:
    """One run's bar."""

    run_id: str
    status: str
    x: int
    y: int
    height: int
    title: str


@dataclass(frozen=True)
class Chart:
    """The bars, the drawing's size and the duration at the top of the scale."""

    bars: list[Bar]
    width: int
    height: int
    plot_top: int
    plot_bottom: int
    max_label: str


def layout(runs: Sequence[Mapping[str, Any]]) -> Chart:
    """The chart of ``runs`` (oldest first)."""
    durations = [r.get("durationMs") for r in runs]
    longest = max((d for d in durations if isinstance(d, int) and d > 0), default=0)
    top, bottom = MARGIN, MARGIN + PLOT_HEIGHT
    bars = []
    for i, run in enumerate(runs):
        duration = run.get("durationMs")
        if isinstance(duration, int) and longest:
            height = max(STUB, round(PLOT_HEIGHT * duration / longest))
            shown = format_duration(duration)
        else:
            height, shown = STUB, "-"
        if run.get("status") == "missed":  # a streak: its count and range instead of one slot's attempt
            title = (f"{missed.label(run.get('missedCount'))} · slots {run.get('scheduledFor')} → "
                     f"{run.get('missedLast') or run.get('scheduledFor')}")
        else:
            title = f"{run_status_shown(run)} · {shown} · slot {run.get('scheduledFor')} · attempt {run.get('attempt')}"
        if run.get("error"):
            title += f" · {run['error']}"
        bars.append(Bar(str(run.get("id")), run_status_shown(run), MARGIN_LEFT + i * (BAR_WIDTH + BAR_GAP),
                        bottom - height, height, title))
    width = MARGIN_LEFT + max(len(runs), 1) * (BAR_WIDTH + BAR_GAP) + MARGIN
    return Chart(bars, width, bottom + AXIS_HEIGHT, top, bottom, format_duration(longest) if longest else "0ms")
