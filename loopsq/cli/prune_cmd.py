"""``loopsq prune``: delete old archived rows (runs that left Redis's history window) from the local mirror."""

from __future__ import annotations

from datetime import timedelta

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.cli.options import duration_flag
from loopsq.domain.timeutil import to_iso
from loopsq.errors import NotFoundError
from loopsq.mirror import queries
from loopsq.mirror.prune import prune as prune_rows


@click.command("prune")
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              help="Delete archived runs created more than DURATION ago (e.g. 30d).")
@click.option("--loop", "loop_ref", metavar="ID_OR_NAME", help="Only the runs of this loop (a removed one too).")
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@json_flag
def prune(older_than: str, loop_ref: str | None, dry_run: bool) -> None:
    """Delete archived runs (no longer in Redis) older than DURATION from the local mirror; print the counts.

    Runs Redis still holds are kept (a rebuild would bring them back). Without prune a mirror keeps everything.
    """
    ms = duration_flag("--older-than", older_than)
    app = get_app()
    conn = app.mirror()
    owner = None
    if loop_ref is not None:
        owner = queries.run_filter(conn, loop_ref)
        if owner is None:
            raise NotFoundError(f"loop not found: {loop_ref}")
    cutoff = to_iso(app.now() - timedelta(milliseconds=ms or 0))
    counts = prune_rows(conn, cutoff, owner, dry_run=dry_run)
    verb = "would prune" if dry_run else "pruned"
    app.emit({"dryRun": dry_run, "createdBefore": cutoff, **counts.to_dict()},
             f"{verb} loop_runs={counts.loop_runs} workflow_runs={counts.workflow_runs} "
             f"workflow_step_runs={counts.workflow_step_runs} workflow_events={counts.workflow_events} "
             f"(archived, created before {cutoff})")
