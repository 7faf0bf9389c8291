"""A loop's change gate at fire time: probe it before claiming a scheduled slot, and record a closed gate as a
skipped run (``state.feature_skips``). Retries and manual runs are not gated: the gate decides whether a new slot
is worth starting, and a person asking for a run has decided."""

from __future__ import annotations

import logging
from datetime import datetime

from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import to_iso
from loopsq.engine.runtime import Runtime
from loopsq.executor import RunMetadata
from loopsq.executor.gate import probe
from loopsq.state.feature_skips import skip_slot

log = logging.getLogger("loopsq.runs")

GATE_CLOSED = "gate_closed"


def gate_slot(rt: Runtime, loop: Loop, slot: datetime, now: datetime, *,
              ends_backlog: bool = False) -> tuple[bool, LoopRun | None]:
    """Probe ``loop``'s gate for ``slot``: ``(False, None)`` when open (claim it), else ``(True, skipped row)``
    once the slot is recorded skipped (the row is None when another worker recorded it first)."""
    if loop.gate is None:
        return False, None
    slot_iso = to_iso(slot)
    metadata = RunMetadata(loop_id=loop.id, loop_name=loop.name, scheduled_for=slot_iso)
    result = probe(loop.gate, loop.target, metadata)
    if result.open:
        return False, None
    reason = str(result.reason)
    log.info("slot %s of loop=%s skipped: %s", slot_iso, loop.name, reason)
    return True, skip_slot(rt.runs, loop.id, slot, now, error=reason, note=GATE_CLOSED, ends_backlog=ends_backlog)
