"""Loop commands that read or change a loop definition: list, show, pause, resume, stop, remove."""

from __future__ import annotations

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.cli.options import quote
from loopsq.domain.models import LOOP_STATUSES, Loop
from loopsq.domain.redaction import public_loop
from loopsq.domain.text import shown
from loopsq.errors import NotFoundError, ValidationError
from loopsq.mirror import queries


@click.command("list")
@click.option("--status", metavar="STATUS", help=f"Only loops with this status ({', '.join(LOOP_STATUSES)}).")
@json_flag
def list_loops(status: str | None) -> None:
    """List loops: id, status, next run and name."""
    if status is not None and status not in LOOP_STATUSES:
        raise ValidationError(f"--status must be one of {', '.join(LOOP_STATUSES)}, got {quote(status)}")
    app = get_app()
    loops = queries.list_loops(app.mirror(), status=status, limit=200)
    app.emit(
        [public_loop(loop) for loop in loops],
        lambda: "\n".join(
            f"{loop['id']}  {loop['status']:<7}  next={loop.get('nextRunAt') or '-'}  {loop['name']}" for loop in loops
        ),
    )


@click.command("show")
@click.argument("id_or_name")
@json_flag
def show(id_or_name: str) -> None:
    """Show one loop as JSON (prompts and env redacted)."""
    app = get_app()
    loop = queries.find_loop(app.mirror(), id_or_name)
    if loop is None:
        raise NotFoundError(f"loop not found: {shown(id_or_name)}")
    app.emit(public_loop(loop))


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
