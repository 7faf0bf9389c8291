"""``loopsq notify ...``: notification endpoints (add, list, remove, log): signed webhooks on failures,
recoveries, missed slots, pauses and overdue loops, delivered by the leading scheduler (``engine.notify``)."""

from __future__ import annotations

from typing import Any, ClassVar

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.cli.options import positive_int_flag
from loopsq.cli.workflows_cmds import AliasGroup
from loopsq.domain import notify as domain
from loopsq.state.notify import LOG_SIZE, NotifyStore


class NotifyGroup(AliasGroup):
    """``notify ls`` is ``notify list``; ``notify rm`` is ``notify remove``."""

    aliases: ClassVar[dict[str, str]] = {"ls": "list", "rm": "remove"}


@click.group("notify", cls=NotifyGroup)
def notify() -> None:
    """Notifications: signed webhooks when loops fail, recover, miss slots, pause or stop succeeding."""


def _store() -> NotifyStore:
    app = get_app()
    return NotifyStore(app.client(), app.keys)


@notify.command("add")
@click.argument("name")
@click.option("--webhook", "url", required=True, metavar="URL", help="The http(s) URL each event is POSTed to.")
@click.option("--on", "events", default=",".join(domain.DEFAULT_EVENTS), show_default=True, metavar="EVENTS",
              help=f"Comma-separated events: {', '.join(domain.EVENTS)}.")
@click.option("--tag", "tags", multiple=True, metavar="KEY:VALUE",
              help="Only loops with this tag (repeat: all must match); none: every loop.")
@click.option("--alert-after", "alert_after", metavar="DURATION",
              help="overdue: alert when a loop has not succeeded for this long (default: twice its cadence).")
@json_flag
def add(name: str, url: str, events: str, tags: tuple[str, ...], alert_after: str | None) -> None:
    """Add notification NAME (or change it, keeping its secret). The signing secret is shown once, when made."""
    endpoint = domain.Endpoint(
        name=domain.check_endpoint_name(name), url=domain.check_webhook(url, "--webhook"),
        events=domain.check_events(events, "--on"), tags=domain.check_tags(list(tags), "--tag"),
        alert_after_ms=None if alert_after is None else domain.check_alert_after(alert_after, "--alert-after"),
        secret=domain.new_secret())
    saved, created = _store().set(endpoint)
    out = saved.to_dict(secret=created)

    def human() -> str:
        line = domain.summary_line(saved)
        if created:
            line += f"\nsecret: {saved.secret}  (shown once: receivers verify webhook-signature with it)"
        return line

    get_app().emit(out, human)


@notify.command("list")
@json_flag
def list_endpoints() -> None:
    """List notifications: name, webhook, events, tag filters, and how many events wait for delivery."""
    store = _store()
    endpoints = store.list()
    items = [{**e.to_dict(), "pending": store.pending_count(e.name)} for e in endpoints]
    get_app().emit(items, lambda: "\n".join(f"{domain.summary_line(e)}  pending={item['pending']}"
                                            for e, item in zip(endpoints, items, strict=True)))


@notify.command("remove")
@click.argument("name")
@json_flag
def remove(name: str) -> None:
    """Remove notification NAME, with its undelivered events and its log."""
    name = domain.check_endpoint_name(name)
    _store().require_remove(name)
    get_app().emit({"removed": True, "name": name}, f"{name} removed")


def _log_line(name: str, entry: dict[str, Any]) -> str:
    outcome = "ok" if entry.get("ok") else ("gave up" if entry.get("gaveUp") else "failed")
    status = entry.get("status") if entry.get("status") is not None else "-"
    line = (f"{entry.get('at')}  {name}  {entry.get('type')}  {entry.get('id')}  attempt={entry.get('attempt')}  "
            f"status={status}  {outcome}")
    if entry.get("error"):
        line += f"  {entry['error']}"
    return line


@notify.command("log")
@click.argument("name", required=False)
@click.option("--limit", "limit_text", default="20", show_default=True, metavar="N",
              help=f"Attempts shown per notification (at most {LOG_SIZE}).")
@json_flag
def log(name: str | None, limit_text: str) -> None:
    """Show the latest delivery attempts, newest first: of NAME, or of every notification."""
    limit = positive_int_flag("--limit", limit_text, LOG_SIZE)
    items = _store().logs(name, limit)
    get_app().emit(items, lambda: "\n".join(_log_line(str(i["notification"]), i) for i in items))
