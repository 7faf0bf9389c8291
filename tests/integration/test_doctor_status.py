"""``loopsq doctor`` and ``loopsq status`` against the session's private redis-server."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.engine.runtime import Runtime
from loopsq.system.exec_path import normalize_execution_path
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def env(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("LOOPSQ_REDIS_URL", redis_server.url)
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def fake(bin_dir: Path, name: str, code: int = 0) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\necho {name} 1.0\nexit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout


def test_doctor_reports_each_check_and_warns_without_failing(env: Path) -> None:
    fake(env, "claude")
    invoke("create", "command", "good", "--every", "1m", "--cmd", "true")
    invoke("create", "command", "bad", "--every", "1m", "--cmd", "no-such-binary-xyz", "--no-shell")
    code, out = invoke("--json", "doctor")
    assert code == 0
    report = json.loads(out)
    checks = {c["id"]: c for c in report["checks"]}
    assert report["ok"] is True
    assert checks["redis"]["status"] == "ok" and checks["redis"]["message"].startswith("redis is reachable (version ")
    assert checks["data-dir"]["message"] == "data directory is writable"
    assert checks["scheduler"] == {"id": "scheduler", "status": "warn",
                                   "message": "no scheduler is running; start `loopsq scheduler`"}
    assert checks["provider:claude"]["status"] == "ok"
    assert checks["provider:codex"] == {"id": "provider:codex", "status": "warn",
                                        "message": "local: codex is not on PATH"}
    assert checks["accounts"]["message"] == "local: accounts CLI is not available here"
    preflights = {c["message"]: c for c in report["checks"] if c["id"].endswith(":local")}
    assert "local: active loop target is ready: good" in preflights
    assert preflights["local: active loop target preflight failed: bad"]["detail"] == (
        f"Executable not found in PATH: no-such-binary-xyz. Effective PATH={normalize_execution_path(os.environ)}"
    )
    # No worker is live to judge the loops against: a warning each, not a failure.
    workers = {c["message"] for c in report["checks"] if c["id"].endswith(":workers")}
    assert workers == {"no live worker to run it: good", "no live worker to run it: bad"}


def test_doctor_sees_live_workers_and_a_working_accounts_cli(env: Path, redis_server: RedisServer) -> None:
    fake(env, "accounts")
    with Runtime(redis_server.url, role="worker"), Runtime(redis_server.url, role="scheduler"):
        code, out = invoke("doctor")
    assert code == 0
    lines = {line.split()[1]: line for line in out.splitlines()}
    assert lines["worker"].startswith("ok   worker                 1 worker(s) alive (")
    assert lines["scheduler"].startswith("ok   scheduler              1 scheduler(s) alive (")
    assert lines["accounts"] == "ok   accounts               local: accounts CLI is available"


def test_doctor_fails_with_exit_1_when_redis_is_unreachable(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("LOOPSQ_REDIS_URL", f"redis://:pw@127.0.0.1:{port}/0")
    code, out = invoke("doctor")
    assert code == 1
    first = out.splitlines()[0]
    assert first.startswith(f"fail redis                  cannot reach Redis at redis://:***@127.0.0.1:{port}/0: ")
    assert "pw@" not in out


def test_doctor_fails_when_the_data_dir_is_not_writable(env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(blocker / "data"))
    code, out = invoke("doctor")
    assert code == 1
    assert any(line.startswith("fail data-dir               data directory is not writable") for line in out.splitlines())


def test_status_shows_live_processes_queue_and_counts(env: Path, redis_server: RedisServer) -> None:
    invoke("create", "command", "a", "--every", "1m", "--cmd", "true")
    invoke("create", "command", "b", "--every", "1m", "--cmd", "true")
    invoke("pause", "b")
    with Runtime(redis_server.url, role="worker") as rt:
        code, out = invoke("--json", "status")
        assert code == 0
        report = json.loads(out)
        assert [w["id"] for w in report["workers"]] == [rt.owner.worker_id]
        assert report["workers"][0]["pid"] == os.getpid()
    assert report["schedulers"] == []
    assert report["loops"] == {"active": 1, "paused": 1}
    assert report["queueDepth"] == 0
    assert report["mirrorLag"] == 0
    code, human = invoke("status")
    assert "workers: 0" in human and "loops: active=1 paused=1" in human
