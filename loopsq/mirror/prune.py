"""Pruning the local mirror: deleting archived runs (those that left Redis's history window) created before a
cutoff, with their workflow runs, steps and events. Without it a mirror keeps everything.

Only archived rows go: a row Redis still holds would come back with the next rebuild, and the mirror would no
longer contain everything Redis has.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass

from loopsq.errors import LoopsqError
from loopsq.mirror.schema import transaction


@dataclass(frozen=True)
class PruneCounts:
    """Rows deleted (or, in a dry run, that would be), per table."""

    loop_runs: int
    workflow_runs: int
    workflow_step_runs: int
    workflow_events: int

    def to_dict(self) -> dict[str, int]:
        return {"loopRuns": self.loop_runs, "workflowRuns": self.workflow_runs,
                "workflowStepRuns": self.workflow_step_runs, "workflowEvents": self.workflow_events}


class _DryRun(Exception):
    """Raised inside the transaction of a dry run, so that it rolls back."""


def prune(conn: sqlite3.Connection, cutoff: str, owner: Mapping[str, str] | None = None, *,
          dry_run: bool = False) -> PruneCounts:
    """Delete archived runs created before ``cutoff`` (an ISO time), of one loop when ``owner`` is given
    (``{"loop_id": id}`` or ``{"loop_name": name}``, as ``queries.run_filter`` returns), else every archived loop
    run and workflow run. Their step runs and events go with their workflow runs. One transaction; a dry run
    counts and changes nothing."""
    column, value = next(iter(owner.items())) if owner else (None, None)
    if column not in (None, "loop_id", "loop_name"):
        raise LoopsqError(f"cannot prune by {column!r}")
    loop_where = f" AND {column} = ?" if column else ""
    params: tuple[str, ...] = (cutoff, value) if value is not None else (cutoff,)
    counts: PruneCounts | None = None
    try:
        with transaction(conn):
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS prune_ids (tbl TEXT NOT NULL, id TEXT NOT NULL)")
            conn.execute("DELETE FROM prune_ids")
            conn.execute("INSERT INTO prune_ids SELECT 'loop_runs', id FROM loop_runs WHERE archived_at IS NOT NULL "
                         f"AND created_at < ?{loop_where}", params)
            wf_params: tuple[str, ...] = (cutoff,)
            if column is None:
                wf_where = ""
            else:  # the workflow runs of the pruned loop runs (a workflow loop's), or of the loop by id
                wf_where = (" AND (loop_run_id IN (SELECT id FROM prune_ids WHERE tbl = 'loop_runs')"
                            + (" OR loop_id = ?)" if column == "loop_id" else ")"))
                if column == "loop_id":
                    wf_params = (cutoff, str(value))
            conn.execute("INSERT INTO prune_ids SELECT 'workflow_runs', id FROM workflow_runs WHERE archived_at IS NOT "
                         f"NULL AND created_at < ?{wf_where}", wf_params)
            wf_ids = "(SELECT id FROM prune_ids WHERE tbl = 'workflow_runs')"
            numbers = []
            for table, where in (("loop_runs", "id IN (SELECT id FROM prune_ids WHERE tbl = 'loop_runs')"),
                                 ("workflow_runs", f"id IN {wf_ids}"),
                                 ("workflow_step_runs", f"workflow_run_id IN {wf_ids}"),
                                 ("workflow_events", f"workflow_run_id IN {wf_ids}")):
                numbers.append(int(conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {where}").fetchone()[0]))
                if not dry_run:
                    conn.execute(f"DELETE FROM {table} WHERE {where}")
            conn.execute("DELETE FROM prune_ids")
            counts = PruneCounts(*numbers)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    except sqlite3.Error as exc:
        raise LoopsqError(f"cannot prune the mirror: {exc}") from exc
    assert counts is not None
    return counts
