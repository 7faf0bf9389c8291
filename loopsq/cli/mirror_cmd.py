"""``loopsq mirror``: follow the change stream into this data dir's SQLite mirror, or rebuild it from Redis.

Following takes the data dir's follower lock first (``loopsq.mirror.follower_lock``): while another process follows
the data dir (a ``loopsq web`` without ``--no-mirror``, another ``loopsq mirror``), it refuses with one line naming
that process, and exits 1.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import click
import redis

from loopsq.cli.app import get_app, json_flag
from loopsq.errors import LoopsqError
from loopsq.mirror import queries, repair
from loopsq.mirror.follow import catch_up, follow, rebuild
from loopsq.mirror.follower_lock import MIRROR_ROLE, FollowerLock, busy_message
from loopsq.mirror.identity import configured_name, mirror_group
from loopsq.mirror.schema import open_db
from loopsq.state.connection import connect, mask_url, unavailable
from loopsq.state.keys import Keys
from loopsq.state.outages import OutageLog, is_transient, wait_for_redis
from loopsq.system import config
from loopsq.system.signals import dump_stacks_on_sigusr2, stop_on_signals

log = logging.getLogger("loopsq.mirror")


@click.command("mirror")
@click.option("--rebuild", "do_rebuild", is_flag=True,
              help="Merge everything Redis holds into the mirror (archived runs are kept), then exit; a malformed "
                   "file is set aside and repaired.")
@click.option("--once", is_flag=True, help="Apply the pending changes once, then exit.")
@json_flag
def mirror(do_rebuild: bool, once: bool) -> None:
    """Keep the SQLite query mirror (<data-dir>/loops.db) following Redis."""
    app = get_app()
    configured_name()  # a malformed LOOPSQ_MIRROR_NAME stops it here (exit 2)
    path = config.mirror_path(app.data_dir)
    if not (do_rebuild or once):
        _run(app.redis_url, app.keys, app.data_dir)  # waits for Redis: no fail-fast while it is away
        return
    client = app.client()
    if do_rebuild:
        conn, repaired = repair.open_for_rebuild(path, app.now())
        try:
            kept = rebuild(client, app.keys, conn)
            catch_up(client, app.keys, conn)
            if repaired is not None:
                repaired = repair.salvage(repaired, conn)
            counts = {
                "loops": queries.count_loops(conn),
                "workflows": len(queries.list_workflows(conn, status=None, limit=1_000_000)),
                "archivedKept": kept,
            }
        finally:
            conn.close()
        payload: dict[str, Any] = {"rebuilt": str(path), **counts}
        lines = [f"rebuilt {path}: loops={counts['loops']} workflows={counts['workflows']} "
                 f"kept {kept} archived run(s) that Redis no longer holds"]
        if repaired is not None:
            payload["repaired"] = _repair_payload(repaired)
            lines = _repair_lines(repaired) + lines
        app.emit(payload, "\n".join(lines))
        return
    conn = open_db(path)
    try:
        if once:
            applied = catch_up(client, app.keys, conn)
            app.emit({"applied": applied, "path": str(path)}, f"applied {applied} change(s) to {path}")
            return
    finally:
        conn.close()


def _repair_payload(repaired: repair.Repair) -> dict[str, Any]:
    return {"setAside": str(repaired.damaged), "reason": repaired.reason,
            "kept": {t.table: t.kept for t in repaired.tables}, "lost": repaired.lost}


def _repair_lines(repaired: repair.Repair) -> list[str]:
    """What a repair did, in words: where the damaged file went, what was kept of it, what could not be."""
    lines = [f"malformed mirror set aside as {repaired.damaged} ({repaired.reason})"]
    if repaired.tables:
        kept = ", ".join(f"{t.table}={t.kept}" for t in repaired.tables)
        lines.append(f"kept from the damaged file (rows Redis no longer holds): {kept}")
    lost = repaired.lost
    if repaired.unreadable is not None:
        lines.append(f"could not keep: any row of the damaged file ({repaired.unreadable})")
    elif lost:
        lines.append("could not keep: " + "; ".join(f"{table}: {what}" for table, what in lost.items())
                     + " unreadable in the damaged file; those Redis still holds are rebuilt")
    else:
        lines.append("could not keep: nothing (every row of the damaged file was read)")
    return lines


def _run(url: str, keys: Keys, data_dir: Path) -> None:
    """Follow until SIGINT/SIGTERM, as the data dir's one follower. Redis being unreachable or restarting never ends
    it: it waits with a capped backoff (one log line when the outage starts, one when it ends) and follows on; a
    configuration error ends it (``RedisUnavailableError``).

    Raises:
        LoopsqError: another process follows the data dir (its pid and what it is are named).
    """
    lock = FollowerLock(data_dir, MIRROR_ROLE)
    try:
        holder = lock.acquire()
    except OSError as exc:
        raise LoopsqError(f"cannot lock {lock.path}: {exc.strerror or exc}") from exc
    if holder is not None:
        raise LoopsqError(busy_message(data_dir, holder))
    try:
        _follow(url, keys, config.mirror_path(data_dir))
    finally:
        lock.release()


def _follow(url: str, keys: Keys, path: Path) -> None:
    logging.basicConfig(level=logging.INFO, format="[loopsq-mirror] %(message)s")
    dump_stacks_on_sigusr2()
    stop = threading.Event()

    stop_on_signals(stop, say=lambda: log.info("stop signal received"))
    client = connect(url, check=False)  # a malformed URL is a configuration error, raised here
    outage = OutageLog(url, log)
    announced = False
    while not stop.is_set():
        if not wait_for_redis(client, outage, stop):
            break
        conn = open_db(str(path))
        try:
            group = mirror_group(client, keys, conn, str(path))
            if not announced:
                log.info("following %s as %s into %s", mask_url(url), group, path)
                announced = True
            follow(client, keys, conn, group, stop, on_applied=lambda n: log.info("applied %d change(s)", n))
        except redis.RedisError as exc:
            if not is_transient(exc):
                raise unavailable(url, exc) from exc
            outage.failed(exc)
        except Exception:  # one bad iteration must not end the mirror
            log.exception("mirror iteration failed; continuing")
            time.sleep(1)
        finally:
            conn.close()
    log.info("stopped")
