"""Executing one backfill slot (``loopsq backfill``): claim it as a backfill run (``state.backfills``), execute it
with its lease held, finalize it fenced, as any run. A backfill run never moves the loop, and its control file
does not steer it; the loop's retry rule applies as for other manual runs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from loopsq.domain import timeutil
from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import from_iso, gen_id
from loopsq.engine.runner import execute_claim
from loopsq.engine.runtime import Runtime
from loopsq.state.backfills import claim_backfill
from loopsq.state.runs import Refusal

log = logging.getLogger("loopsq.runs")

#: What happened to a slot: ``ran`` (a run executed), ``done`` (it had a row already), ``running`` (its run is
#: going), ``busy`` (overlap skip: another run of the loop is active), ``gone`` (no such loop).
OUTCOMES = ("ran", "done", "running", "busy", "gone", "claimed")


@dataclass(frozen=True)
class SlotResult:
    """One backfill slot's outcome and its run (None when none was involved)."""

    outcome: str
    run: LoopRun | None = None

    def encode(self) -> str:
        """``<outcome> <run id or ->``: how a worker hands the result to the waiting CLI."""
        return f"{self.outcome} {self.run.id if self.run else '-'}"


def run_backfill_slot(rt: Runtime, loop_id: str, slot_iso: str, *, force: bool = False, overlap: str = "skip",
                      on_claim: Callable[[LoopRun], None] | None = None) -> SlotResult:
    """Run one past slot of a loop as a backfill run (see the module); ``on_claim`` learns the claimed run
    before it executes."""
    if overlap == "skip" and rt.runs.active_ids(loop_id):
        return SlotResult("busy")
    claim = claim_backfill(rt.runs, loop_id, from_iso(slot_iso), rt.owner, timeutil.now(), force=force,
                           nonce=gen_id())
    if isinstance(claim, Refusal):
        return SlotResult(claim.reason, claim.run)
    log.info("backfill of loop=%s slot=%s claimed as run %s", claim.loop.name, slot_iso, claim.run.id)
    if on_claim is not None:
        on_claim(claim.run)
    return SlotResult("ran", execute_claim(rt, claim))
