"""``loopsq migrate``: move the state in Redis to this release's layout (``state.migrations``)."""

from __future__ import annotations

import click

from loopsq.cli.app import get_app, json_flag


@click.command("migrate")
@click.option("--dry-run", is_flag=True, help="Print what would change; change nothing.")
@click.option("--wait", "wait_s", default=0.0, show_default=True, metavar="SECONDS",
              help="How long to wait for another migrate's lock before refusing.")
@json_flag
def migrate(dry_run: bool, wait_s: float) -> None:
    """Move loopsq's state in Redis to this release's layout, in bounded, resumable batches (back Redis up first:
    BGSAVE or the AOF). A scheduler does the same at its start unless --no-migrate.

    Refused (exit 2, nothing changed) on a Redis with no loopsq state, a state newer than this release, or while
    processes of the 0.1.0 layout are live.
    """
    from loopsq.state import layout
    from loopsq.state.migrations import migrate as run_migration

    app = get_app()
    client = app.client(checked=False)
    report = run_migration(client, app.keys, dry_run=dry_run, wait_s=max(0.0, wait_s))
    app.emit({"from": report.start, "to": report.end, "dryRun": dry_run, "layout": layout.LAYOUT,
              "lines": report.lines}, "\n".join(report.lines))
