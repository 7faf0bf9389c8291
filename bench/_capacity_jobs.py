"""The bare RQ job of ``capacity.py``'s baseline (imported by RQ workers as ``_capacity_jobs.hold``): no loopsq
code, only what a plain RQ job that runs a command does."""

from __future__ import annotations

import os
import subprocess
import time


def hold(job_ledger: str, ledger: str, index: int, due_iso: str, seconds: float) -> int:
    """Write the job's start time first thing (``<epoch> <index>`` to ``job_ledger``), then run the same target
    as loopsq's side: ``bash`` writes its own start to ``ledger`` (``_harness.LEDGER_SCRIPT``'s line) and becomes
    ``sleep``. Returns its exit status."""
    started = time.time()
    with open(job_ledger, "a", encoding="ascii") as fh:
        fh.write(f"{started:.6f} {index}\n")
    env = dict(os.environ, LOOPS_SCHEDULED_FOR=due_iso, LOOPS_LOOP_ID=f"bl-{index}", LOOPS_RUN_ID="-")
    script = f'echo "$EPOCHREALTIME $LOOPS_SCHEDULED_FOR $LOOPS_LOOP_ID $LOOPS_RUN_ID" >> {ledger}; exec sleep {seconds:g}'
    return subprocess.run(["bash", "-c", script], env=env, stdin=subprocess.DEVNULL, check=False).returncode
