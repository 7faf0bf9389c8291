"""``loopsq doctor``: checks that fit loopsq (reference §4.5, adapted): Redis, the data dir, the mirror, live
schedulers and workers, provider CLIs, the accounts CLI, and a preflight of every active loop."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from loopsq.errors import LoopsqError
from loopsq.executor import PROVIDER_EXECUTABLES
from loopsq.state.connection import connect, server_version
from loopsq.state.keys import Keys
from loopsq.system import config
from loopsq.system.exec_path import normalize_execution_path


@dataclass(frozen=True)
class Check:
    """One check: ``ok``, ``warn`` or ``fail``, a message, and an optional detail."""

    id: str
    status: str
    message: str
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"id": self.id, "status": self.status, "message": self.message}
        if self.detail:
            out["detail"] = self.detail
        return out

    def line(self) -> str:
        text = f"{self.status:<4} {self.id:<22} {self.message}"
        return text + (f" ({self.detail})" if self.detail else "")


def check_data_dir(data_dir: Path) -> Check:
    """The data directory can be created and written."""
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=data_dir, prefix=".doctor-"):
            pass
        return Check("data-dir", "ok", "data directory is writable", str(data_dir))
    except OSError as exc:
        return Check("data-dir", "fail", "data directory is not writable", f"{data_dir}: {exc.strerror or exc}")


def check_tools(env: dict[str, str] | None = None) -> list[Check]:
    """The accounts CLI and each provider CLI on the PATH targets run with (``normalize_execution_path``; warnings:
    only loops that use them need them)."""
    path = normalize_execution_path(env if env is not None else os.environ)
    checks = []
    accounts = shutil.which("accounts", path=path)
    ok = False
    if accounts:
        try:
            ok = subprocess.run([accounts, "--version"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
    checks.append(Check("accounts", "ok", "accounts CLI is available") if ok else
                  Check("accounts", "warn", "accounts CLI is not available; account-routed steps will fail"))
    for cmd in dict.fromkeys(PROVIDER_EXECUTABLES.values()):
        found = shutil.which(cmd, path=path)
        checks.append(Check(f"provider:{cmd}", "ok", f"{cmd} is available", found) if found else
                      Check(f"provider:{cmd}", "warn", f"{cmd} is not on PATH"))
    return checks


def run_doctor(url: str, data_dir: Path, keys: Keys | None = None) -> tuple[bool, list[Check]]:
    """Every check; ``ok`` is False when any check failed."""
    keys = keys or Keys()
    checks: list[Check] = []
    try:
        client = connect(url)
        checks.append(Check("redis", "ok", f"redis is reachable (version {server_version(client)})"))
    except LoopsqError as exc:
        checks.append(Check("redis", "fail", exc.message))
        client = None
    checks.append(check_data_dir(data_dir))
    if client is not None:
        try:
            checks.extend(_redis_checks(client, keys, data_dir))
        except redis.RedisError as exc:
            checks.append(Check("redis", "fail", f"redis failed during checks: {exc}"))
    checks.extend(check_tools())
    return all(c.status != "fail" for c in checks), checks


def _redis_checks(client: redis.Redis, keys: Keys, data_dir: Path) -> list[Check]:
    from loopsq.executor.preflight import preflight_loop_target
    from loopsq.mirror.follow import mirror_lag
    from loopsq.mirror.schema import open_db
    from loopsq.ops.health import live_processes
    from loopsq.state.loops import LoopStore
    from loopsq.state.workflows import WorkflowStore

    checks: list[Check] = []
    path = config.mirror_path(data_dir)
    if path.exists():
        try:
            conn = open_db(path)
            lag = mirror_lag(client, keys, conn)
            conn.close()
            checks.append(Check("mirror", "ok", "mirror is current", str(path)) if lag == 0 else
                          Check("mirror", "warn", f"mirror is {lag} change(s) behind; run `loopsq mirror`", str(path)))
        except (LoopsqError, OSError) as exc:
            checks.append(Check("mirror", "fail", "mirror database cannot be opened", f"{path}: {exc}"))
    else:
        checks.append(Check("mirror", "ok", "mirror not created yet (any read creates it)", str(path)))
    for role in ("scheduler", "worker"):
        live = live_processes(client, keys, role)
        if live:
            hosts = ", ".join(sorted({f"{p['host']}:{p['pid']}" for p in live}))
            checks.append(Check(role, "ok", f"{len(live)} {role}(s) alive", hosts))
        else:
            checks.append(Check(role, "warn", f"no {role} is running; start `loopsq {role}`"))
    failed = sum(1 for run in _recent_failed(client, keys))
    checks.append(Check("loop-runs", "ok", "no failed loop runs recorded") if failed == 0 else
                  Check("loop-runs", "warn", f"{failed} failed loop run(s) recorded"))

    class _Workflows:
        def workflows(self) -> WorkflowStore:
            return WorkflowStore(client, keys)

    for loop in LoopStore(client, keys).all():
        if loop.status != "active":
            continue
        try:
            preflight_loop_target(loop.target, loop, _Workflows())
            checks.append(Check(f"loop:{loop.id}:preflight", "ok", f"active loop target is ready: {loop.name}"))
        except LoopsqError as exc:
            checks.append(Check(f"loop:{loop.id}:preflight", "warn",
                                f"active loop target preflight failed: {loop.name}",
                                exc.message.removeprefix("preflight failed: ")))
    return checks


def _recent_failed(client: redis.Redis, keys: Keys) -> list[str]:
    from loopsq.state.runs import RunStore

    ids = [i.decode() if isinstance(i, bytes) else str(i) for i in client.zrevrange(keys.runs, 0, 9999)]
    return [r.id for r in RunStore(client, keys).get_many(ids) if r.status == "failed"]
