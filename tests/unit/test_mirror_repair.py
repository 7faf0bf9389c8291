"""A malformed mirror: every read names the repair command; ``mirror --rebuild`` sets the file aside as
``loops.db.corrupt-<time>``, rebuilds it from Redis, keeps the history rows it can still read, and says what it
could not keep."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from loopsq.mirror.repair import damage_of, salvage, set_aside
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys
from tests.unit.cli_helpers import NOW, Cli, make_cli

KEYS = Keys()
RUNS = 3000
PAGE = 4096


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    cli = make_cli(tmp_path, monkeypatch)
    cli.ok("create", "command", "hello", "--cmd", "true", "--every", "1h")
    committer = Committer(cli.redis, KEYS)
    for batch in range(0, RUNS, 100):
        tx = Tx("runs_recorded_by_test", "2026-01-01T00:00:00.000Z")
        for i in range(batch, batch + 100):
            run = {"id": f"r{i:05d}", "loopId": "l1", "loopName": "hello",
                   "scheduledFor": f"2026-01-01T00:00:{i:05d}Z", "attempt": 1, "status": "succeeded",
                   "createdAt": "2026-01-01T00:00:00.000Z", "updatedAt": "2026-01-01T00:00:00.000Z", "stdout": "x" * 200}
            tx.set(KEYS.run(run["id"]), json.dumps(run)).zadd(KEYS.runs, i, run["id"]).put("loop_runs", run)
        assert committer.commit(tx).ok
    assert cli.json("runs", "--limit", "1")[0]["id"] == "r02999"
    return cli


def damage(db: Path, pages: tuple[int, ...] = (60, 61, 62, 100)) -> None:
    """Overwrite a few pages in the middle of the file (as a failing disk would), after a checkpoint."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    assert db.stat().st_size > (max(pages) + 1) * PAGE
    with open(db, "r+b") as handle:
        for page in pages:
            handle.seek(page * PAGE)
            handle.write(bytes([0xA5]) * PAGE)


def test_reads_on_a_malformed_mirror_name_the_repair_command(cli: Cli) -> None:
    db = cli.data_dir / "loops.db"
    # The newest runs too: ``runs`` reads them through an index (idx_runs_created_id) without touching the rest.
    checkpoint = sqlite3.connect(db)
    checkpoint.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    checkpoint.close()
    pages = db.stat().st_size // PAGE
    damage(db, (60, 61, 62, 100, *range(pages - 40, pages - 2, 4)))
    result = cli.run("runs", "--limit", "500")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == (f"error: the mirror database {db} is malformed (database disk image is malformed); "
                             "repair it with: loopsq mirror --rebuild\n")


def test_rebuild_sets_the_file_aside_rebuilds_and_keeps_what_redis_no_longer_holds(cli: Cli) -> None:
    db = cli.data_dir / "loops.db"
    damage(db)
    for i in range(0, RUNS, 2):  # Redis trimmed half the history (its retention window): only the mirror has it
        cli.redis.delete(KEYS.run(f"r{i:05d}"))
        cli.redis.zrem(KEYS.runs, f"r{i:05d}")
    result = cli.run("mirror", "--rebuild")
    assert result.exit_code == 0, result.stderr
    aside = cli.data_dir / "loops.db.corrupt-20260101T000000Z"
    lines = result.stdout.splitlines()
    assert lines[0] == f"malformed mirror set aside as {aside} (database disk image is malformed)"
    assert lines[1].startswith("kept from the damaged file (rows Redis no longer holds): loop_runs=")
    assert lines[1].endswith(", workflow_runs=0, workflow_step_runs=0, workflow_events=0")
    assert lines[2].startswith("could not keep: loop_runs: about ") and lines[2].endswith(
        " rows (database disk image is malformed) unreadable in the damaged file; those Redis still holds are "
        "rebuilt")
    assert lines[3].startswith(f"rebuilt {db}: loops=1 workflows=0 kept ")
    assert aside.exists() and damage_of(db) is None
    kept = int(lines[1].split("loop_runs=")[1].split(",")[0])
    ids = {r["id"] for r in cli.json("runs", "--limit", "500")}
    assert "r02999" in ids  # odd ids: rebuilt from Redis
    total = sqlite3.connect(db).execute("SELECT count(*) FROM loop_runs").fetchone()[0]
    # Every run is back: from Redis, from what the change stream still held (a rebuild merges it first), or
    # salvaged from the damaged file.
    assert total == RUNS and 0 <= kept < RUNS // 2


def test_rebuild_of_a_sound_mirror_sets_nothing_aside(cli: Cli) -> None:
    result = cli.run("--json", "mirror", "--rebuild")
    assert json.loads(result.stdout) == {"rebuilt": str(cli.data_dir / "loops.db"), "loops": 1, "workflows": 0,
                                         "archivedKept": 0}
    assert sorted(p.name for p in cli.data_dir.iterdir() if "corrupt" in p.name) == []


def test_a_file_that_is_not_a_database_at_all_is_set_aside_and_nothing_is_kept(cli: Cli) -> None:
    db = cli.data_dir / "loops.db"
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(os.urandom(8192))
    assert cli.run("runs").stderr.startswith(f"error: the mirror database {db} is malformed (file is not a database)")
    result = cli.run("--json", "mirror", "--rebuild")
    repaired = json.loads(result.stdout)["repaired"]
    assert repaired["setAside"] == f"{db}.corrupt-20260101T000000Z" and repaired["reason"] == "file is not a database"
    assert repaired["lost"] == dict.fromkeys(
        ["loop_runs", "workflow_runs", "workflow_step_runs", "workflow_events"], "file is not a database")
    assert len(cli.json("runs", "--limit", "500")) == 500


def test_a_second_repair_in_the_same_second_does_not_overwrite_the_first(tmp_path: Path) -> None:
    db = tmp_path / "loops.db"
    first = [db.write_bytes(b"one"), set_aside(db, NOW)][1]
    second = [db.write_bytes(b"two"), set_aside(db, NOW)][1]
    assert (first.name, second.name) == ("loops.db.corrupt-20260101T000000Z", "loops.db.corrupt-20260101T000000Z-1")
    assert (first.read_bytes(), second.read_bytes()) == (b"one", b"two")


def test_salvage_never_replaces_a_row_the_rebuild_wrote(tmp_path: Path) -> None:
    from loopsq.mirror.repair import Repair
    from loopsq.mirror.schema import open_db

    old = open_db(tmp_path / "old.db")
    new = open_db(tmp_path / "new.db")
    row = ("r1", "l1", "hello", "2026-01-01T00:00:00.000Z", 1, "{}", "2026-01-01", "2026-01-01")
    sql = ("INSERT INTO loop_runs (id, loop_id, loop_name, scheduled_for, attempt, status, created_at, updated_at) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
    old.execute(sql, (*row[:5], "failed", *row[6:]))
    old.execute(sql, ("r2", *row[1:3], "2026-01-02T00:00:00.000Z", 1, "failed", *row[6:]))
    new.execute(sql, (*row[:5], "succeeded", *row[6:]))
    old.close()
    done = salvage(Repair(tmp_path / "old.db", "test"), new)
    assert next((t.table, t.read, t.kept) for t in done.tables) == ("loop_runs", 2, 1)
    assert dict(new.execute("SELECT id, status FROM loop_runs").fetchall()) == {"r1": "succeeded", "r2": "failed"}


def test_a_repaired_mirror_keeps_the_name_of_the_damaged_one_so_it_follows_on_in_its_own_group(tmp_path: Path) -> None:
    from loopsq.mirror.apply import MIRROR_NAME_KEY, get_meta
    from loopsq.mirror.repair import Repair
    from loopsq.mirror.schema import open_db

    old = open_db(tmp_path / "old.db")
    old.execute("INSERT INTO mirror_meta (key, value) VALUES (?, 'c0ffee000001')", (MIRROR_NAME_KEY,))
    old.close()
    new = open_db(tmp_path / "new.db")
    salvage(Repair(tmp_path / "old.db", "test"), new)
    assert get_meta(new, MIRROR_NAME_KEY) == "c0ffee000001"
