"""The Procfile and docker-compose.yml name the same processes, every command they run is a real ``loopsq``
command, and the Procfile runs a loop under honcho against a private redis-server."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import psutil
import pytest
import yaml

from loopsq.cli import cli
from tests.redis_server import RedisServer

ROOT = Path(__file__).parents[2]
PROCFILE = ROOT / "Procfile"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
#: Commands the files may name before they exist (``loopsq web`` is being built); checked once registered.
PENDING = {"web"}


def resolve(argv: list[str]) -> list[str]:
    """Parse ``argv`` as the ``loopsq`` CLI would, running nothing; returns the command path.

    Raises click's UsageError for an unknown command or option, or a missing argument.
    """
    assert argv[0] == "loopsq", f"not a loopsq command: {argv}"
    tokens = argv[1:]
    group: click.Group = cli
    ctx = click.Context(cli, info_name="loopsq")
    path: list[str] = []
    while True:
        name, command, tokens = group.resolve_command(ctx, tokens)
        assert name is not None and command is not None
        path.append(name)
        if isinstance(command, click.Group):
            group, ctx = command, click.Context(command, parent=ctx, info_name=name)
            continue
        command.make_context(name, list(tokens), parent=ctx)
        return path


def check_loopsq_command(argv: list[str]) -> list[str]:
    """``resolve``, except that a pending command counts as real while it is not registered yet."""
    if len(argv) > 1 and argv[1] in PENDING and argv[1] not in cli.commands:
        return argv[1:]
    return resolve(argv)


def procfile() -> dict[str, str]:
    entries = {}
    for line in PROCFILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, command = line.split(":", 1)
            entries[name.strip()] = command.strip()
    return entries


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


# -- structure ----------------------------------------------------------------------------------------------------


def test_the_command_resolver_rejects_unknown_commands_and_options() -> None:
    assert resolve(["loopsq", "scheduler", "--poll-ms", "5"]) == ["scheduler"]
    assert resolve(["loopsq", "workflows", "list"]) == ["workflows", "list"]
    with pytest.raises(click.UsageError, match="No such command 'frobnicate'"):
        resolve(["loopsq", "frobnicate"])
    with pytest.raises(click.UsageError, match="No such option '--bogus'"):
        resolve(["loopsq", "worker", "--bogus"])


def test_the_procfile_runs_the_scheduler_a_worker_and_the_web_app_as_real_commands() -> None:
    entries = procfile()
    assert entries == {"scheduler": "loopsq scheduler", "worker": "loopsq worker", "web": "loopsq web"}
    for command in entries.values():
        check_loopsq_command(shlex.split(command))


def test_compose_runs_redis_with_aof_on_a_named_volume() -> None:
    spec = compose()
    redis = spec["services"]["redis"]
    assert redis["image"].startswith("redis:")
    command = redis["command"]
    assert command[0] == "redis-server"
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    volume, mount = redis["volumes"][0].split(":")
    assert mount == "/data"
    assert volume in spec["volumes"]


def test_compose_runs_the_scheduler_workers_and_web_on_that_redis_as_real_loopsq_commands() -> None:
    services = compose()["services"]
    assert set(services) == {"redis", "scheduler", "worker", "web"}
    for name in ("scheduler", "worker", "web"):
        service = services[name]
        assert service["command"][:2] == ["loopsq", name]
        check_loopsq_command(service["command"])
        assert service["environment"]["LOOPSQ_REDIS_URL"].startswith("redis://redis:6379/")
        assert "redis" in service["depends_on"]
        assert service["build"] == "."


def test_the_web_service_listens_beyond_its_container_and_reads_its_token_from_a_secret() -> None:
    spec = compose()
    web = spec["services"]["web"]
    command = web["command"]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert web["ports"] == [f"127.0.0.1:8080:{command[command.index('--port') + 1]}"]
    # A Compose secret, mounted at /run/secrets/<name>: the token is a file in the container, in no environment.
    assert web["secrets"] == ["api_token"]
    assert web["environment"]["LOOPSQ_API_TOKEN_FILE"] == "/run/secrets/api_token"
    assert spec["secrets"]["api_token"] == {"environment": "LOOPSQ_API_TOKEN"}
    assert not any("LOOPSQ_API_TOKEN" in service.get("environment", {})
                   for service in spec["services"].values())


def test_the_worker_service_can_be_scaled() -> None:
    worker = compose()["services"]["worker"]
    # --scale worker=N needs containers without a fixed name and without a fixed host port.
    assert "container_name" not in worker
    assert "ports" not in worker


def test_the_dockerfile_installs_the_package_and_its_default_command_is_a_real_one() -> None:
    text = DOCKERFILE.read_text()
    assert "RUN pip install ." in text
    cmd = next(line for line in text.splitlines() if line.startswith("CMD "))
    argv = json.loads(cmd.removeprefix("CMD "))
    assert argv == ["loopsq", "up"]
    check_loopsq_command(argv)


# -- honcho ---------------------------------------------------------------------------------------------------------


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process and everything under it, then SIGKILL what is left."""
    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _, alive = psutil.wait_procs(family, timeout=10)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    proc.wait(timeout=10)


@pytest.mark.integration
def test_honcho_starts_the_procfile_s_scheduler_and_worker_and_a_loop_runs(redis_server: RedisServer,
                                                                            tmp_path: Path) -> None:
    client = redis_server.client()
    client.flushall()
    client.close()
    env = {k: v for k, v in os.environ.items() if k not in ("LOOPSQ_REDIS_URL", "REDIS_URL", "LOOPSQ_DATA_DIR")}
    env.update(REDIS_URL=redis_server.url, LOOPSQ_DATA_DIR=str(tmp_path / "data"), PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")

    def loopsq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "loopsq", *args], env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)

    created = loopsq("create", "command", "from-procfile", "--every", "1s", "--cmd", "echo hi")
    assert created.returncode == 0, created.stderr
    log = tmp_path / "honcho.log"
    honcho = Path(sys.executable).parent / "honcho"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(honcho), "-f", str(PROCFILE), "-d", str(tmp_path), "start", "scheduler", "worker"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        statuses: list[str] = []
        while time.monotonic() < deadline and "succeeded" not in statuses:
            time.sleep(0.5)
            listed = loopsq("--json", "runs", "from-procfile")
            assert listed.returncode == 0, listed.stderr
            statuses = [run["status"] for run in json.loads(listed.stdout)]
        output = log.read_text(errors="replace")
        assert "succeeded" in statuses, output
        assert "scheduler.1 | [loopsq-scheduler] started id=" in output
        assert "worker.1    | [loopsq-worker] started id=" in output
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert "worker.1    | [loopsq-worker] stopped" in log.read_text(errors="replace")
    finally:
        _kill_tree(proc)


#: honcho with its SIGTERM-to-SIGKILL wait (5 s, hard-coded) shortened, as a platform with a short kill timeout.
HONCHO_KILL_WAIT_S = 3
HONCHO_SHORT_KILL = ("import sys, honcho.manager, honcho.command; honcho.manager.KILL_WAIT = int(sys.argv.pop(1)); "
                     "honcho.command.main()")


def _group(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["status"]):
        with contextlib.suppress(ProcessLookupError, psutil.Error):
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
    return members


def _wait(predicate: Any, timeout: float, what: str, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {timeout}s\n{log.read_text(errors='replace')}"
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_procfile_under_honcho_binds_port_and_ctrl_c_hands_the_run_on_with_nothing_left_running(
        redis_server: RedisServer, tmp_path: Path) -> None:
    from tests.redis_server import free_port

    client = redis_server.client()
    client.flushall()
    web_port = free_port()
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPSQ_") and k not in ("REDIS_URL", "PORT")}
    # honcho gives each process type PORT, PORT+100, ... in Procfile order: web is third.
    env.update(LOOPSQ_REDIS_URL=redis_server.url, LOOPSQ_DATA_DIR=str(tmp_path / "data"), PORT=str(web_port - 200),
               LOOPSQ_API_TOKEN="t" * 32, LOOPSQ_KILL_TIMEOUT=f"{HONCHO_KILL_WAIT_S}s", PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")

    def loopsq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "loopsq", *args], env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)

    def honcho(log: Path, *args: str) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            return subprocess.Popen([sys.executable, "-c", HONCHO_SHORT_KILL, str(HONCHO_KILL_WAIT_S), "-f",
                                     str(PROCFILE), "-d", str(tmp_path), "--no-colour", "start", *args], env=env,
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)

    # The first run goes on long (with a grandchild); its re-run after the shutdown ends at once.
    cmd = (f'echo "$LOOPS_SCHEDULED_FOR $LOOPS_ATTEMPT" >> {marks}/ledger; [ -e {marks}/ran ] && exit 0; '
           f"touch {marks}/ran; (sleep 60 & echo $! > {marks}/grandchild; wait) & sleep 60")
    # A slot of the loop's own (a triggered run is ad hoc: it is never retried).
    at = (datetime.now(UTC) + timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    created = loopsq("create", "command", "long", "--at", at, "--cmd", cmd)
    assert created.returncode == 0, created.stderr
    log = tmp_path / "honcho.log"
    proc = honcho(log)
    try:
        health = f"http://127.0.0.1:{web_port}/api/health"
        _wait(lambda: _get(health) == 200, 60, f"the web app on {health}", log)
        web_pid = _wait(lambda: next((c.laddr for p in psutil.Process(proc.pid).children(recursive=True)
                                      for c in _listening(p) if c.laddr.port == web_port), None), 10, "web", log)
        assert web_pid.ip == "0.0.0.0"
        assert f"[loopsq-web] serving http://0.0.0.0:{web_port} " in log.read_text()
        run = _wait(lambda: next((r for r in json.loads(loopsq("--json", "runs", "long").stdout)
                                  if r["status"] == "running" and r.get("pid")), None), 30, "the run", log)
        _wait(lambda: (marks / "grandchild").exists() and (marks / "grandchild").read_text().strip(), 10,
              "the grandchild", log)
        members = _group(run["pid"])
        assert int((marks / "grandchild").read_text()) in {p.pid for p in members} and len(members) >= 4
        # Ctrl-C: the terminal sends SIGINT to honcho, which SIGTERMs each process and SIGKILLs it 3 s later.
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=HONCHO_KILL_WAIT_S + 15)
        output = log.read_text(errors="replace")
        assert "sending SIGKILL" not in output, output  # everything stopped within the kill window
        assert "[loopsq-worker] 4 slot(s); on SIGTERM the current runs get 500ms to finish (kill timeout 3s: " \
               "LOOPSQ_KILL_TIMEOUT)" in output
        assert _group(run["pid"]) == [], output
        (stopped,) = json.loads(loopsq("--json", "runs", "long").stdout)
        assert (stopped["status"], stopped["error"], stopped["attempt"]) == (
            "abandoned", "worker shut down before completion", 1)
        # The formation starts again: the run is re-run at once (its slot, still attempt 1: a shutdown is no failure).
        log2 = tmp_path / "honcho2.log"
        proc = honcho(log2)
        retried = _wait(lambda: next((r for r in json.loads(loopsq("--json", "runs", "long").stdout)
                                      if r["attempt"] == 1 and r.get("rerun") == 1 and r["status"] == "succeeded"),
                                     None), 30, "the re-run",
                        log2)
        assert retried["id"] == stopped["id"] and retried["scheduledFor"] == stopped["scheduledFor"]
        assert (marks / "ledger").read_text().split() == [stopped["scheduledFor"], "1", stopped["scheduledFor"], "1"]
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=HONCHO_KILL_WAIT_S + 15)
    finally:
        _kill_tree(proc)
        client.close()


def _get(url: str) -> int | None:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except OSError:
        return None


def _listening(proc: psutil.Process) -> list[Any]:
    with contextlib.suppress(psutil.Error):
        return [c for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    return []


def test_the_compose_worker_s_kill_timeout_matches_its_stop_grace_period() -> None:
    worker = compose()["services"]["worker"]
    assert worker["environment"]["LOOPSQ_KILL_TIMEOUT"] == worker["stop_grace_period"]
