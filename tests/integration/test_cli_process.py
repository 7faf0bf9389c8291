"""The ``loopsq`` command as a real process against the session's private redis-server."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loopsq.domain.timeutil import from_iso
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def env(redis_server: RedisServer, tmp_path: Path) -> dict[str, str]:
    client = redis_server.client()
    client.flushall()
    client.close()
    return {**os.environ, "LOOPSQ_REDIS_URL": redis_server.url, "LOOPSQ_DATA_DIR": str(tmp_path / "data")}


def loopsq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopsq", *args], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def test_create_then_list_shows_the_loop_with_its_next_run_ten_seconds_out(env: dict[str, str]) -> None:
    before = datetime.now(UTC)
    created = loopsq(env, "create", "command", "hello", "--every", "10s", "--cmd", "echo hi")
    after = datetime.now(UTC)
    assert created.returncode == 0, created.stderr
    listed = loopsq(env, "list")
    assert listed.returncode == 0, listed.stderr
    loop_id, status, next_field, name = listed.stdout.split()
    assert (status, name) == ("active", "hello")
    assert created.stdout == f"created loop {loop_id} (hello) {next_field}\n"
    next_run = from_iso(next_field.removeprefix("next="))
    assert before.timestamp() + 9.99 <= next_run.timestamp() <= after.timestamp() + 10.01


def test_a_second_data_dir_on_the_same_redis_sees_the_same_loops(env: dict[str, str], tmp_path: Path) -> None:
    assert loopsq(env, "create", "command", "a", "--every", "1m", "--cmd", "true").returncode == 0
    other = {**env, "LOOPSQ_DATA_DIR": str(tmp_path / "other-host")}
    shown = loopsq(other, "--json", "show", "a")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["name"] == "a"


def test_the_mirror_process_follows_writes_without_any_cli_read(env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "loopsq", "mirror"], env=env, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        for i in range(5):
            assert loopsq(env, "create", "command", f"l{i}", "--every", "1m", "--cmd", "true").returncode == 0
        db = Path(env["LOOPSQ_DATA_DIR"]) / "loops.db"
        deadline = time.monotonic() + 15
        count = 0
        while time.monotonic() < deadline:
            if db.exists():
                with sqlite3.connect(db) as conn:
                    count = conn.execute("SELECT COUNT(*) FROM loops").fetchone()[0]
                if count == 5:
                    break
            time.sleep(0.1)
        assert count == 5
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert "[loopsq-mirror] stopped" in err


def test_mirror_rebuild_recreates_the_rows_from_redis(env: dict[str, str]) -> None:
    for name in ("a", "b"):
        loopsq(env, "create", "command", name, "--every", "1m", "--cmd", "true")
    loopsq(env, "pause", "b")
    before = loopsq(env, "--json", "list").stdout
    (Path(env["LOOPSQ_DATA_DIR"]) / "loops.db").unlink()
    rebuilt = loopsq(env, "mirror", "--rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert rebuilt.stdout.endswith("loops=2 workflows=0 kept 0 archived run(s) that Redis no longer holds\n")
    assert loopsq(env, "--json", "list").stdout == before
