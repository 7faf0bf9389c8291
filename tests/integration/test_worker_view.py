"""doctor and preflight from the workers' point of view: each live worker publishes what it can run (PATH, provider
CLIs, the accounts CLI, their versions); doctor judges each active loop against the live workers, not the caller's
PATH; ``create --preflight`` warns when no live worker can run the target; the reason a run failed is shown by
``run-now``, ``runs`` and ``show`` in human output."""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopsq.system.exec_path import normalize_execution_path
from tests.integration.processes import KEYS, Cluster, Proc, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

SYSTEM_PATH = "/usr/bin:/bin"


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def fake_cli(directory: Path, name: str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho '{name} 1.0'\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def published(cluster: Cluster, proc: Proc) -> dict[str, Any]:
    """The worker's liveness record once its versions are in."""
    key = KEYS.worker(cluster.worker_id(proc))

    def ready() -> dict[str, Any] | None:
        raw = cluster.client.get(key)
        record = json.loads(raw) if raw else None
        if record is None or "can" not in record:
            return None
        tools = [*record["can"]["tools"].values(), record["can"]["accounts"] or {"version": "-"}]
        return record if all("version" in t for t in tools) else None

    found: dict[str, Any] = cluster.wait_until(ready, 20, "the worker's published capabilities")
    return found


def start_worker(cluster: Cluster, path: str, home: Path | None = None) -> Proc:
    """A worker with ``path`` before the system PATH and its own HOME (so the runner's ``~/.local/bin`` stays out)."""
    return cluster.start("worker", env={"PATH": f"{path}:{SYSTEM_PATH}" if path else SYSTEM_PATH,
                                        "HOME": str(home or cluster.tmp / "home")})


def target_path(cluster: Cluster, path: str, home: Path | None = None) -> str:
    """The PATH such a worker's targets get, and publishes: the common bin dirs appended."""
    return normalize_execution_path({"PATH": path, "HOME": str(home or cluster.tmp / "home")})


def python_path(cluster: Cluster) -> dict[str, str]:
    """The CLI's own environment with ``bin`` (fake claude, fake accounts) first on PATH."""
    return {"PATH": f"{cluster.tmp / 'bin'}:{SYSTEM_PATH}"}


def test_each_live_worker_publishes_its_path_and_the_clis_it_finds_with_their_versions(cluster: Cluster) -> None:
    bin_dir = cluster.tmp / "bin"
    claude, accounts = fake_cli(bin_dir, "claude"), fake_cli(bin_dir, "accounts")
    with_tools = start_worker(cluster, str(bin_dir))
    bare = start_worker(cluster, "")
    assert published(cluster, with_tools)["can"] == {
        "path": target_path(cluster, f"{bin_dir}:{SYSTEM_PATH}"),
        "tools": {"claude": {"path": str(claude), "version": "claude 1.0"}},
        "accounts": {"path": str(accounts), "version": "accounts 1.0"},
    }
    assert published(cluster, bare)["can"] == {"path": target_path(cluster, SYSTEM_PATH), "tools": {},
                                               "accounts": None}


def test_doctor_judges_each_active_loop_against_the_live_workers_not_the_caller_s_path(cluster: Cluster) -> None:
    fake_cli(cluster.tmp / "bin", "claude")
    env = python_path(cluster)
    created = cluster.cli("create", "agent", "bot", "--provider", "claude", "--prompt", "hi", "--every", "1h",
                          env=env).stdout
    loop_id = created.split()[2]
    bare = start_worker(cluster, "")
    published(cluster, bare)
    bare_id = cluster.worker_id(bare)
    done = cluster.cli("doctor", env=env, check=False)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout
    assert f"fail loop:{loop_id}:workers no live worker can run it: bot ({bare_id}: Executable not found in " \
           "PATH: claude)" in lines
    assert f"ok   loop:{loop_id}:local local: active loop target is ready: bot" in lines
    assert next(line for line in lines if line[5:].startswith("provider:claude ")).startswith(
        "ok   provider:claude        local: claude is available (")
    assert bare_id.startswith("worker:")  # shown once, not worker:worker:...
    # The PATH its targets get, published: the system PATH first, then the common dirs appended (~/.local/bin among
    # them; which others depends on the variables the worker inherits, such as BUN_INSTALL or PNPM_HOME).
    # (The id column is padded to 22 characters: a 4-digit pid leaves two blanks after the id, so blanks are
    # judged as one.)
    worker_line = re.sub(" +", " ", next(line for line in lines if line.startswith(f"ok   {bare_id} ")))
    assert worker_line.startswith(f"ok {bare_id} provider CLIs: none; no accounts CLI (PATH {SYSTEM_PATH}:"), \
        worker_line
    assert f":{cluster.tmp / 'home' / '.local' / 'bin'}:" in worker_line, worker_line
    # A worker that has claude: the loop can run, on one of the two.
    able = start_worker(cluster, str(cluster.tmp / "bin"))
    published(cluster, able)
    done = cluster.cli("doctor", env=env, check=False)
    assert f"ok   loop:{loop_id}:workers 1 of 2 live worker(s) can run it: bot ({bare_id}: Executable not found " \
           "in PATH: claude)" in done.stdout.splitlines()
    assert done.returncode == 0, done.stdout


def test_doctor_and_preflight_pass_an_agent_whose_cli_is_in_the_worker_s_home_local_bin(cluster: Cluster) -> None:
    home = cluster.tmp / "agenthome"
    (home / ".local").mkdir(parents=True)
    fake_cli(home / ".local" / "bin", "claude")
    env = {"PATH": SYSTEM_PATH, "HOME": str(home)}  # this host's preflight finds it the same way
    args = ("--provider", "claude", "--prompt", "hi", "--every", "1h", "--preflight")
    worker = start_worker(cluster, "", home=home)  # a bare PATH: claude only in ~/.local/bin, as its installer puts it
    assert published(cluster, worker)["can"]["tools"] == {
        "claude": {"path": str(home / ".local" / "bin" / "claude"), "version": "claude 1.0"}}
    created = cluster.cli("create", "agent", "bot", *args, env=env)
    assert created.stderr == ""
    loop_id = created.stdout.split()[2]
    done = cluster.cli("doctor", env=env, check=False)
    assert f"ok   loop:{loop_id}:workers 1 of 1 live worker(s) can run it: bot" in done.stdout.splitlines()
    assert done.returncode == 0, done.stdout


def test_doctor_judges_a_command_s_executable_on_a_same_host_worker_s_path(cluster: Cluster) -> None:
    tool = fake_cli(cluster.tmp / "tools", "mytool")
    loop_id = cluster.create("tooled", "mytool", "--no-shell", "--every", "1h")
    published(cluster, start_worker(cluster, ""))
    report = json.loads(cluster.cli("--json", "doctor", env={"PATH": f"{tool.parent}:{SYSTEM_PATH}"},
                                    check=False).stdout)
    checks = {c["id"]: c for c in report["checks"]}
    assert checks[f"loop:{loop_id}:workers"]["status"] == "fail"
    assert checks[f"loop:{loop_id}:workers"]["detail"].endswith(": Executable not found in PATH: mytool")
    assert checks[f"loop:{loop_id}:local"]["status"] == "ok"


def test_create_preflight_warns_when_no_live_worker_can_run_the_target(cluster: Cluster) -> None:
    fake_cli(cluster.tmp / "bin", "claude")
    env = python_path(cluster)
    args = ("--provider", "claude", "--prompt", "hi", "--every", "1h", "--preflight")
    lonely = cluster.cli("create", "agent", "first", *args, env=env)
    assert lonely.stderr == "warning: no worker is live to run this loop; start `loopsq worker`\n"
    bare = start_worker(cluster, "")
    published(cluster, bare)
    done = cluster.cli("create", "agent", "second", *args, env=env)
    assert done.stdout.startswith("created loop ")  # stored all the same: a worker may come that can
    assert done.stderr == (f"warning: no live worker can run this loop ({cluster.worker_id(bare)}: Executable "
                           "not found in PATH: claude)\n")
    published(cluster, start_worker(cluster, str(cluster.tmp / "bin")))
    fine = cluster.cli("create", "agent", "third", *args, env=env)
    assert fine.stderr == ""


def test_the_reason_a_run_failed_is_shown_by_run_now_runs_and_show(cluster: Cluster) -> None:
    # provider:any: routed to any worker although none has claude (the one below fails it, which is the point)
    cluster.cli("create", "agent", "bot", "--provider", "claude", "--prompt", "hi", "--every", "1h",
                "--requires", "provider:any")
    start_worker(cluster, "")
    done = cluster.cli("run-now", "bot", check=False)
    assert done.returncode == 1
    run_id, status = done.stdout.split()[:2]
    assert status == "failed"
    missing = "Executable not found in PATH: claude. Effective PATH="  # then the worker's normalised PATH (0.3.1)
    assert done.stderr.startswith(f"error: run {run_id} failed: {missing}") and done.stderr.count("\n") == 1
    row, reason = cluster.cli("runs", "bot").stdout.splitlines()
    assert row.startswith(f"{run_id}  failed      attempt=1  slot=")
    assert reason.startswith(f"  error: {missing}")
    shown = json.loads(cluster.cli("show", "bot").stdout)
    assert shown["lastRun"]["id"] == run_id
    assert shown["lastRun"]["status"] == "failed" and shown["lastRun"]["error"].startswith(missing)
