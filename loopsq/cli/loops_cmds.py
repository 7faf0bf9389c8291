"""Loop commands that read or change a loop definition: list, show, pause, resume, stop, remove, archive,
unarchive (restore), rename."""

from __future__ import annotations

from typing import Any

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.cli.feature_flags import tag_filter_option, tags_flag
from loopsq.cli.options import quote
from loopsq.domain.models import LOOP_STATUSES, Loop
from loopsq.domain.redaction import public_loop
from loopsq.domain.text import shown
from loopsq.errors import NotFoundError, ValidationError
from loopsq.executor.digest import command_fields
from loopsq.mirror import queries
from loopsq.system import limits


@click.command("list")
@click.option("--status", metavar="STATUS", help=f"Only loops with this status ({', '.join(LOOP_STATUSES)}).")
@click.option("--archived", is_flag=True, help="Only archived loops.")
@click.option("--all", "all_", is_flag=True, help="Archived loops too.")
@tag_filter_option
@json_flag
def list_loops(status: str | None, archived: bool, all_: bool, tags: tuple[str, ...]) -> None:
    """List loops: id, status, next run and name (archived ones only with --archived or --all; with --tag, those
    carrying every tag given)."""
    wanted = tags_flag(tags)
    if status is not None and status not in LOOP_STATUSES:
        raise ValidationError(f"--status must be one of {', '.join(LOOP_STATUSES)}, got {quote(status)}")
    if archived and all_:
        raise ValidationError("choose one of --archived or --all, got both")
    app = get_app()
    which = "only" if archived else "include" if all_ else "exclude"
    loops = queries.list_loops(app.mirror(), status=status, limit=200, archived=which, tags=wanted)
    app.emit(
        [public_loop(loop) for loop in loops],
        lambda: "\n".join(
            f"{loop['id']}  {loop['status']:<7}  next={loop.get('nextRunAt') or '-'}  {loop['name']}"
            + ("  [archived]" if loop.get("archivedAt") else "") for loop in loops
        ),
    )


#: The newest run's fields ``show`` adds under ``lastRun``: enough to see why it failed.
LAST_RUN_FIELDS = ("id", "status", "attempt", "scheduledFor", "finishedAt", "exitCode", "error", "outcome",
                   "control", "controlWarning", "workspace", "inputTokens", "outputTokens", "costUsd")


@click.command("show")
@click.argument("id_or_name")
@json_flag
def show(id_or_name: str) -> None:
    """Show one loop as JSON, with the command line it runs and its digest, its history window in Redis and its
    newest run's status and error. A target's env is shown as '[redacted]'; an agent prompt keeps its first 80
    characters, the rest shown as '... [redacted N chars]' (a prompt of 80 characters or fewer is shown in full)."""
    app = get_app()
    conn = app.mirror()
    loop = queries.find_loop(conn, id_or_name)
    if loop is None:
        raise NotFoundError(f"loop not found: {shown(id_or_name)}")
    payload = {**public_loop(loop), **command_fields(loop.get("target")), "historyWindow": history_window(loop)}
    newest = queries.list_runs(conn, loop_id=str(loop["id"]), limit=1)
    if newest:
        payload["lastRun"] = {k: newest[0][k] for k in LAST_RUN_FIELDS if newest[0].get(k) is not None}
    app.emit(payload)


def history_window(loop: dict[str, Any]) -> dict[str, Any]:
    """How many settled runs Redis keeps for ``loop``, and where that number comes from (the loop's own
    ``keepRuns``, else the deployment default ``LOOPSQ_KEEP_RUNS``)."""
    own = loop.get("keepRuns")
    if own is not None:
        return {"keepRuns": own, "source": "loop"}
    return {"keepRuns": limits.keep_runs(), "source": limits.KEEP_RUNS_ENV}


def _status_line(loop: Loop) -> None:
    get_app().emit(public_loop(loop.to_dict()), f"{loop.id} {loop.status}")


@click.command("pause")
@click.argument("id_or_name")
@json_flag
def pause(id_or_name: str) -> None:
    """Pause a loop (its next run is kept; missed slots follow the catch-up policy on resume)."""
    app = get_app()
    _status_line(app.loops().pause(id_or_name, app.now()))


@click.command("resume")
@click.argument("id_or_name")
@json_flag
def resume(id_or_name: str) -> None:
    """Resume a loop; a stopped loop is scheduled again from now."""
    app = get_app()
    _status_line(app.loops().resume(id_or_name, app.now()))


@click.command("stop")
@click.argument("id_or_name")
@json_flag
def stop(id_or_name: str) -> None:
    """Stop a loop and clear its next run."""
    app = get_app()
    _status_line(app.loops().stop(id_or_name, app.now()))


@click.command("remove")
@click.argument("id_or_name")
@json_flag
def remove(id_or_name: str) -> None:
    """Delete a loop definition (its run history stays)."""
    app = get_app()
    app.loops().remove(id_or_name, app.now())
    app.emit({"removed": True}, "removed")


@click.command("archive")
@click.argument("id_or_name")
@json_flag
def archive(id_or_name: str) -> None:
    """Archive a loop: hidden from lists and counts and never run (an active loop is paused) until unarchived."""
    app = get_app()
    loop = app.loops().archive(id_or_name, app.now())
    app.emit(public_loop(loop.to_dict()), f"{loop.id} archived (was {loop.archived_from_status})")


@click.command("unarchive")
@click.argument("id_or_name")
@json_flag
def unarchive(id_or_name: str) -> None:
    """Restore an archived loop with the status it had (alias: restore)."""
    app = get_app()
    _status_line(app.loops().unarchive(id_or_name, app.now()))


@click.command("rename")
@click.argument("id_or_name")
@click.argument("new_name")
@json_flag
def rename(id_or_name: str, new_name: str) -> None:
    """Give a loop a new name; its id and its run history stay."""
    app = get_app()
    old = app.loops().require(id_or_name)
    loop = app.loops().rename(old.id, new_name, app.now())
    app.emit(public_loop(loop.to_dict()), f"{loop.id} renamed {old.name} -> {loop.name}")
