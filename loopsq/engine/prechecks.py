"""What a fire checks before claiming a scheduled slot, beyond overlap: the loop's workspace (``workspaces``)
and its change gate (``gating``). Each that stops the slot records it skipped; neither consumes an attempt."""

from __future__ import annotations

from datetime import datetime

from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.engine.gating import gate_slot
from loopsq.engine.runtime import Runtime
from loopsq.engine.workspaces import busy_slot


def precheck_slot(rt: Runtime, loop: Loop, slot: datetime, now: datetime, *, is_retry: bool,
                  ends_backlog: bool = False) -> tuple[bool, LoopRun | None]:
    """``(True, skipped row or None)`` when the slot is not to be claimed now; ``(False, None)`` to claim it.
    Retries are never gated (the gate decides whether a new slot is worth starting)."""
    stopped, row = busy_slot(rt, loop, slot, now, is_retry=is_retry, ends_backlog=ends_backlog)
    if stopped or is_retry or loop.gate is None:
        return stopped, row
    return gate_slot(rt, loop, slot, now, ends_backlog=ends_backlog)
