"""``loopsq next ID_OR_NAME [--count N]``: a loop's schedule in words and its next fire times, in the loop's zone
and in UTC (``loopsq.domain.upcoming``, which the dashboard's loop page uses too, so the two list the same)."""

from __future__ import annotations

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.cli.options import limit_flag
from loopsq.domain.text import shown
from loopsq.domain.upcoming import (
    DEFAULT_COUNT,
    MAX_COUNT,
    fire_times,
    jitter_in_words,
    jitter_of,
    schedule_in_words,
)
from loopsq.errors import NotFoundError
from loopsq.mirror import queries


@click.command("next")
@click.argument("id_or_name")
@click.option("--count", "-n", default=DEFAULT_COUNT, show_default=True, metavar="N",
              help=f"How many fire times (1 to {MAX_COUNT}).")
@json_flag
def next_times(id_or_name: str, count: int) -> None:
    """A loop's schedule in words and its next fire times, in its zone and in UTC."""
    limit_flag("--count", count, MAX_COUNT)
    app = get_app()
    loop = queries.find_loop(app.mirror(), id_or_name)
    if loop is None:
        raise NotFoundError(f"loop not found: {shown(id_or_name)}")
    times = fire_times(loop, count)
    zone = str(loop.get("timezone") or "UTC")
    words = schedule_in_words(loop.get("schedule") or {}, zone) + jitter_in_words(loop)
    jitter = jitter_of(loop)
    payload = {"id": loop["id"], "name": loop["name"], "status": loop["status"], "timezone": zone,
               "schedule": words, "fireTimes": [t.to_dict() for t in times],
               **({"jitterMs": jitter["jitterMs"], "offsetMs": jitter["offsetMs"]} if jitter else {})}

    def human() -> str:
        lines = [f"{loop['id']}  {loop['status']}  {words}"]
        if not times:
            lines.append(f"  no upcoming fire times (status {loop['status']})")
        lines += [f"  {t.local}  {t.utc}" + ("  retry" if t.retry else "") for t in times]
        return "\n".join(lines)

    app.emit(payload, human)
