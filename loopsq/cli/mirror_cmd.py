"""``loopsq mirror``: follow the change stream into this host's SQLite mirror, or rebuild it from Redis."""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

import click
import redis

from loopsq.cli.app import get_app, json_flag
from loopsq.mirror import queries
from loopsq.mirror.follow import catch_up, follow, mirror_id, rebuild
from loopsq.mirror.schema import open_db
from loopsq.state.connection import connect, mask_url
from loopsq.system import config

log = logging.getLogger("loopsq.mirror")


@click.command("mirror")
@click.option("--rebuild", "do_rebuild", is_flag=True,
              help="Merge everything Redis holds into the mirror (archived runs are kept), then exit.")
@click.option("--once", is_flag=True, help="Apply the pending changes once, then exit.")
@json_flag
def mirror(do_rebuild: bool, once: bool) -> None:
    """Keep the SQLite query mirror (<data-dir>/loops.db) following Redis."""
    app = get_app()
    path = config.mirror_path(app.data_dir)
    client = app.client()
    conn = open_db(path)
    try:
        if do_rebuild:
            kept = rebuild(client, app.keys, conn)
            catch_up(client, app.keys, conn)
            counts = {
                "loops": queries.count_loops(conn),
                "workflows": len(queries.list_workflows(conn, status=None, limit=1_000_000)),
                "archivedKept": kept,
            }
            app.emit({"rebuilt": str(path), **counts},
                     f"rebuilt {path}: loops={counts['loops']} workflows={counts['workflows']} "
                     f"kept {kept} archived run(s) that Redis no longer holds")
            return
        if once:
            applied = catch_up(client, app.keys, conn)
            app.emit({"applied": applied, "path": str(path)}, f"applied {applied} change(s) to {path}")
            return
        _run(app.redis_url, app.keys, path)
    finally:
        conn.close()


def _run(url: str, keys: object, path: object) -> None:
    """Follow until SIGINT/SIGTERM; Redis outages back off (capped at 5 s) and reconnect."""
    logging.basicConfig(level=logging.INFO, format="[loopsq-mirror] %(message)s")
    stop = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("stop signal received")
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    group = mirror_id(str(path))
    log.info("following %s as %s into %s", mask_url(url), group, path)
    delay = 0.1
    while not stop.is_set():
        conn = open_db(str(path))
        try:
            client = connect(url)
            delay = 0.1
            follow(client, keys, conn, group, stop, on_applied=lambda n: log.info("applied %d change(s)", n))  # type: ignore[arg-type]
        except (redis.RedisError, OSError) as exc:
            log.warning("redis unavailable (%s); retrying in %.1fs", exc, delay)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
        except Exception:  # one bad iteration must not end the mirror
            log.exception("mirror iteration failed; continuing")
            time.sleep(1)
        finally:
            conn.close()
    log.info("stopped")
