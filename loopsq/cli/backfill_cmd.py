"""``loopsq backfill NAME --from T --to T``: run a loop's slots in a past range on the workers, each as a normal run
with its slot time; idempotent per slot (a slot that ran is not run again unless ``--force``)."""

from __future__ import annotations

import time
from typing import Any

import click

from loopsq.cli.app import App, get_app, json_flag
from loopsq.cli.options import positive_int_flag, quote
from loopsq.domain import limits
from loopsq.domain.backfill import OVERLAPS, backfill_slots
from loopsq.domain.lifecycle import ensure_not_archived
from loopsq.domain.run_rules import TERMINAL
from loopsq.domain.schedules import parse_time
from loopsq.domain.timeutil import gen_id, to_iso
from loopsq.engine.routing import enqueue_for_loop
from loopsq.errors import LoopsqError, ValidationError
from loopsq.state.runs import RunStore

POLL_S = 0.05


@click.command("backfill")
@click.argument("id_or_name")
@click.option("--from", "start", required=True, metavar="TIME", help="First slot time (ISO-8601; no offset = loop zone).")
@click.option("--to", "end", required=True, metavar="TIME", help="Last slot time, not in the future.")
@click.option("--overlap", default="skip", show_default=True, metavar="POLICY",
              help="skip: one slot at a time, none while another run of the loop is active; allow: up to "
                   "--max-parallel at once.")
@click.option("--max-parallel", default="1", show_default=True, metavar="N", help="Slots at once (--overlap allow).")
@click.option("--force", is_flag=True, help="Run slots that already ran again (as their next attempt).")
@click.option("--wait", "wait_s", default=30.0, show_default=True, metavar="SECONDS",
              help="How long to wait for a worker to pick a slot up.")
@json_flag
def backfill(id_or_name: str, start: str, end: str, overlap: str, max_parallel: str, force: bool,
             wait_s: float) -> None:
    """Run a loop's slots between --from and --to, oldest first; exit 1 if a run did not succeed."""
    if overlap not in OVERLAPS:
        raise ValidationError(f"--overlap must be skip or allow, got {quote(overlap)}")
    parallel = positive_int_flag("--max-parallel", max_parallel, limits.MAX_PARALLEL)
    if parallel > 1 and overlap != "allow":
        raise ValidationError(f"--max-parallel requires --overlap allow, got {quote(max_parallel)}")
    app = get_app()
    loop = app.loops().require(id_or_name)
    ensure_not_archived(loop, id_or_name, "backfilling")
    first = parse_time(start, loop.timezone, "--from")
    last = parse_time(end, loop.timezone, "--to")
    slots = [to_iso(slot) for slot in backfill_slots(loop, first, last, app.now())]
    results = _run_slots(app, loop.id, slots, parallel=parallel, force=force, overlap=overlap, wait_s=wait_s)
    rows = [{"slot": slot, "outcome": outcome, **({"runId": run_id, "status": status} if run_id else {})}
            for slot, (outcome, run_id, status) in zip(slots, results, strict=True)]
    counts: dict[str, int] = {}
    for row in rows:
        key = f"{row['outcome']}:{row['status']}" if row["outcome"] == "ran" else str(row["outcome"])
        counts[key] = counts.get(key, 0) + 1

    def human() -> str:
        lines = [f"{r['slot']}  {_word(r)}" + (f"  {r['runId']}" if r.get("runId") else "") for r in rows]
        summary = ", ".join(f"{n} {k.replace(':', ' ')}" for k, n in sorted(counts.items())) or "nothing"
        lines.append(f"backfill {loop.name}: {len(rows)} slots: {summary}")
        return "\n".join(lines)

    app.emit({"loopId": loop.id, "loopName": loop.name, "slots": rows}, human)
    if any(r["outcome"] == "ran" and r.get("status") != "succeeded" for r in rows):
        raise click.exceptions.Exit(1)


def _word(row: dict[str, Any]) -> str:
    if row["outcome"] == "ran":
        return f"ran {row.get('status')}"
    return {"done": "already ran (not run again; --force runs it)", "running": "running already",
            "busy": "skipped: another run of the loop is active", "gone": "loop removed",
            "claimed": "claimed by another backfill"}.get(str(row["outcome"]), str(row["outcome"]))


def _run_slots(app: App, loop_id: str, slots: list[str], *, parallel: int, force: bool, overlap: str,
               wait_s: float) -> list[tuple[str, str | None, str | None]]:
    """Enqueue one job per slot, at most ``parallel`` in flight, oldest first; each slot's (outcome, run id,
    final status)."""
    client = app.client()
    store = RunStore(client, app.keys)
    out: list[tuple[str, str | None, str | None] | None] = [None] * len(slots)
    pending = list(range(len(slots)))
    flight: dict[int, tuple[str, float]] = {}
    while pending or flight:
        while pending and len(flight) < parallel:
            index = pending.pop(0)
            request = gen_id()
            enqueue_for_loop(client, app.keys, loop_id, "worker.jobs.run_backfill", loop_id, slots[index], request,
                             force, overlap, result_ttl=0)
            flight[index] = (request, time.monotonic() + wait_s)
        for index, (request, deadline) in list(flight.items()):
            answer = client.get(app.keys.run_request(request))
            text = answer.decode() if isinstance(answer, bytes) else answer
            if text is None:
                run = None
            else:
                outcome, run_id = str(text).split(" ", 1)
                run = store.get(run_id) if run_id != "-" else None
                if outcome != "ran" or (run is not None and run.status in TERMINAL):
                    out[index] = (outcome, run.id if run else None, run.status if run else None)
                    del flight[index]
                    continue
            if text is None and time.monotonic() > deadline:
                raise LoopsqError(f"no worker picked up backfill slot {slots[index]} within {wait_s:g}s; is "
                                  "`loopsq worker` running?")
        time.sleep(POLL_S)
    return [r for r in out if r is not None]
