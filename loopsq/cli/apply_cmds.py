"""``loopsq apply -f PATH`` and ``loopsq export [NAME...]``: loops and workflows kept as files
(``ops.apply_plan``)."""

from __future__ import annotations

import json

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.errors import ValidationError
from loopsq.ops.apply_plan import check_owner, execute, export_specs, plan
from loopsq.ops.apply_specs import OWNER_TAG, read_specs


@click.command("apply")
@click.option("-f", "--file", "path", required=True, metavar="PATH",
              help="A JSON (or YAML) file of loop and workflow specs, or a directory of them.")
@click.option("--dry-run", is_flag=True, help="Print the plan only; change nothing.")
@click.option("--owner", metavar="NAME",
              help=f"Record NAME on the loops and workflows this apply creates (tag {OWNER_TAG}); needed by --prune.")
@click.option("--prune", is_flag=True,
              help="Remove the loops (archive the workflows) of --owner that no spec names any more.")
@json_flag
def apply(path: str, dry_run: bool, owner: str | None, prune: bool) -> None:
    """Create and update loops and workflows from spec files, by name; print the plan (create, update with the
    fields that change, unchanged, prune). One bad spec changes nothing; a loop's status is kept unless its spec
    sets it."""
    if prune and owner is None:
        raise ValidationError("--prune requires --owner NAME (only loops an apply created are pruned)")
    if owner is not None:
        check_owner(owner, prune, "--owner")
    app = get_app()
    now = app.now()
    steps = plan(app.client(), app.keys, read_specs(path), now, owner, prune)
    if not dry_run:
        execute(app.client(), app.keys, steps, now)
    app.emit([s.public() for s in steps],
             "\n".join(s.line() for s in steps) or "nothing to apply")


@click.command("export")
@click.argument("names", nargs=-1, metavar="[NAME]...")
def export(names: tuple[str, ...]) -> None:
    """Print loops and workflows as specs (JSON) that `loopsq apply -f` takes back unchanged: the named ones, or
    every unarchived loop and every active workflow."""
    app = get_app()
    click.echo(json.dumps(export_specs(app.client(), app.keys, list(names)), indent=2, ensure_ascii=False))
