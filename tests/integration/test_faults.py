"""Redis and mirror faults: a Redis restart (AOF) under load, a mirror killed in the middle of a burst."""

from __future__ import annotations

import collections
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.run_rules import TERMINAL
from loopsq.mirror.follow import rebuild
from loopsq.mirror.schema import MIRRORED_COLUMNS, open_db
from loopsq.state.keys import Keys
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    """A private server with AOF, of this test only (it gets restarted)."""
    server = RedisServer(appendonly=True).start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def cluster(aof_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(aof_server.url, tmp_path)


def _ledger_lines(cluster: Cluster, name: str) -> list[tuple[str, ...]]:
    return cluster.ledger(name)


@pytest.mark.timeout(150)
def test_workers_and_schedulers_reconnect_after_a_redis_restart_and_no_run_is_lost(
    cluster: Cluster, aof_server: RedisServer
) -> None:
    ledger = cluster.ledger_dir
    cmd_fast = f'echo "$LOOPS_SCHEDULED_FOR $LOOPS_ATTEMPT" >> {ledger}/ledger-fast'
    cmd_slow = f'echo "$LOOPS_SCHEDULED_FOR $LOOPS_ATTEMPT" >> {ledger}/ledger-slow; sleep 2'
    cluster.create("fast", cmd_fast, "--every", "1s", "--attempts", "3", "--retry-delay", "500ms")
    cluster.create("slow", cmd_slow, "--every", "3s", "--attempts", "3", "--retry-delay", "500ms")
    cluster.start_all(schedulers=1, workers=2)
    cluster.wait_until(lambda: len(cluster.ledger("fast")) >= 3 and cluster.ledger("slow"), 20, "runs before restart")
    # Restart Redis while a slow run is in flight (SIGTERM: Redis writes its AOF on the way out).
    cluster.wait_until(lambda: any(r.status == "running" for r in cluster.runs("slow")), 10, "a slow run in flight")
    cluster.client.close()
    aof_server.stop()
    time.sleep(2)
    aof_server.start()
    before = len(cluster.ledger("fast"))
    cluster.wait_until(lambda: len(cluster.ledger("fast")) >= before + 5, 45, "fast runs after the restart")
    cluster.wait_until(lambda: len(cluster.ledger("slow")) >= 3, 45, "slow runs after the restart")
    cluster.stop_all()
    # Nothing lost: every run recorded is terminal (in flight ones finished or were retried), no slot attempt
    # ran twice.
    for name in ("fast", "slow"):
        runs = cluster.runs(name)
        assert runs, name
        open_runs = [r for r in runs if r.status not in TERMINAL]
        assert not open_runs, f"{name}: runs left running: {open_runs}\n{cluster.logs()}"
        counts = collections.Counter(cluster.ledger(name))
        assert [k for k, n in counts.items() if n > 1] == [], f"{name}: a slot attempt ran twice"
    logs = cluster.logs()
    assert "redis unavailable" in logs or "could not connect to Redis" in logs or "retrying" in logs


@pytest.mark.timeout(120)
def test_a_mirror_killed_in_a_burst_catches_up_with_nothing_missing_or_doubled(
    cluster: Cluster, tmp_path: Path
) -> None:
    from loopsq.sdk import LoopsClient

    mirror_log = tmp_path / "mirror.log"
    with mirror_log.open("wb") as out:
        mirror = subprocess.Popen([sys.executable, "-m", "loopsq", "mirror"], env=cluster.env, stdout=out,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    client = LoopsClient(cluster.url)
    try:
        db = Path(cluster.env["LOOPSQ_DATA_DIR"]) / "loops.db"
        cluster.wait_until(lambda: db.exists(), 15, "the mirror file")
        for i in range(300):
            client.create({"name": f"burst-{i}", "schedule": {"type": "interval", "everyMs": 3_600_000},
                           "target": {"type": "command", "command": "true"}})
            if i % 3 == 0:
                client.pause(f"burst-{i}")
            if i == 120:
                mirror.send_signal(signal.SIGKILL)
                mirror.wait(10)
        with mirror_log.open("ab") as out:
            mirror = subprocess.Popen([sys.executable, "-m", "loopsq", "mirror"], env=cluster.env, stdout=out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def caught_up() -> bool:
            with sqlite3.connect(db) as conn:
                try:
                    return bool(conn.execute("SELECT COUNT(*) FROM loops").fetchone()[0] == 300
                                and conn.execute("SELECT COUNT(*) FROM loops WHERE status='paused'").fetchone()[0] == 100)
                except sqlite3.OperationalError:  # the file exists before the mirror's first migration made tables
                    return False

        cluster.wait_until(caught_up, 30, "the restarted mirror to catch up")
        followed = _rows(open_db(db))
        fresh = open_db(tmp_path / "rebuilt.db")
        rebuild(cluster.client, KEYS, fresh)
        assert _rows(fresh) == followed
        with sqlite3.connect(db) as conn:
            names = [r[0] for r in conn.execute("SELECT name FROM loops")]
        assert len(names) == len(set(names)) == 300
    finally:
        client.close()
        mirror.send_signal(signal.SIGTERM)
        mirror.wait(15)


def _rows(conn: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    return {t: [tuple(r) for r in conn.execute(f"SELECT * FROM {t} ORDER BY id")] for t in MIRRORED_COLUMNS}


def test_mirror_rebuild_gives_the_same_rows_as_following(cluster: Cluster, tmp_path: Path) -> None:
    cluster.create("a", "true", "--every", "1h")
    cluster.create("b", "exit 1", "--every", "1h", "--attempts", "2")
    cluster.cli("run-now", "a", "--local")
    cluster.cli("run-now", "b", "--local", check=False)
    cluster.cli("pause", "b")
    db = Path(cluster.env["LOOPSQ_DATA_DIR"]) / "loops.db"
    cluster.cli("list")
    followed = _rows(open_db(db))
    assert cluster.cli("mirror", "--rebuild").returncode == 0
    assert _rows(open_db(db)) == followed
    assert len(followed["loop_runs"]) == 2
