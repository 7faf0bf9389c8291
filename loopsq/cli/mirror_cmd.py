"""``loopsq mirror``: follow the change stream into this host's SQLite mirror, or rebuild it from Redis."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType

import click
import redis

from loopsq.cli.app import get_app, json_flag
from loopsq.mirror import queries
from loopsq.mirror.follow import catch_up, follow, mirror_id, rebuild
from loopsq.mirror.schema import open_db
from loopsq.state.connection import connect, mask_url, unavailable
from loopsq.state.keys import Keys
from loopsq.state.outages import OutageLog, is_transient, wait_for_redis
from loopsq.system import config

log = logging.getLogger("loopsq.mirror")


@click.command("mirror")
@click.option("--rebuild", "do_rebuild", is_flag=True, help="Recreate every row from Redis alone, then exit.")
@click.option("--once", is_flag=True, help="Apply the pending changes once, then exit.")
@json_flag
def mirror(do_rebuild: bool, once: bool) -> None:
    """Keep the SQLite query mirror (<data-dir>/loops.db) following Redis."""
    app = get_app()
    path = config.mirror_path(app.data_dir)
    if not (do_rebuild or once):
        _run(app.redis_url, app.keys, path)  # waits for Redis: no fail-fast while it is away
        return
    client = app.client()
    conn = open_db(path)
    try:
        if do_rebuild:
            rebuild(client, app.keys, conn)
            catch_up(client, app.keys, conn)
            counts = {
                "loops": queries.count_loops(conn),
                "workflows": len(queries.list_workflows(conn, status=None, limit=1_000_000)),
            }
            app.emit({"rebuilt": str(path), **counts}, f"rebuilt {path}: loops={counts['loops']} workflows={counts['workflows']}")
            return
        if once:
            applied = catch_up(client, app.keys, conn)
            app.emit({"applied": applied, "path": str(path)}, f"applied {applied} change(s) to {path}")
    finally:
        conn.close()


def _run(url: str, keys: Keys, path: Path) -> None:
    """Follow until SIGINT/SIGTERM. Redis being unreachable or restarting never ends it: it waits with a capped
    backoff (one log line when the outage starts, one when it ends) and follows on; a configuration error ends
    it (``RedisUnavailableError``)."""
    logging.basicConfig(level=logging.INFO, format="[loopsq-mirror] %(message)s")
    stop = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("stop signal received")
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    group = mirror_id(str(path))
    client = connect(url, check=False)  # a malformed URL is a configuration error, raised here
    outage = OutageLog(url, log)
    announced = False
    while not stop.is_set():
        if not wait_for_redis(client, outage, stop):
            break
        if not announced:
            log.info("following %s as %s into %s", mask_url(url), group, path)
            announced = True
        conn = open_db(str(path))
        try:
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
