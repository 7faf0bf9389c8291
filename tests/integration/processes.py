"""A small harness for tests about real processes: ``loopsq scheduler`` and ``loopsq worker`` subprocesses with
their logs captured to files, clean stops (SIGTERM) and kill -9, the CLI, deadline-bound waits, and ledgers that
commands append to.

Every wait has a deadline; a failed wait raises ``AssertionError`` with the processes' logs attached, so a hang
or a miss explains itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis

from loopsq.domain.run_rules import LoopRun
from loopsq.domain.timeutil import from_iso
from loopsq.state import run_codec
from loopsq.state.connection import client_for
from loopsq.state.keys import Keys
from loopsq.system.procs import is_process_alive

T = TypeVar("T")

LOG_TAIL = 6000
KEYS = Keys()

# A command that records its slot and run id, one line per execution (``<slot> <run id> <attempt marker>``).
LEDGER_CMD = 'echo "$LOOPS_SCHEDULED_FOR $LOOPS_RUN_ID" >> {ledger}/ledger-$LOOPS_LOOP_NAME'


@dataclass
class Proc:
    """One ``loopsq`` subprocess and its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    signalled: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def sigterm(self) -> None:
        """Send SIGTERM once (a second one could land during interpreter shutdown, when Python has restored the
        default action, and turn a clean exit into death by signal)."""
        if self.alive() and not self.signalled:
            self.popen.send_signal(signal.SIGTERM)
            self.signalled = True

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait (a worker finishes its current job first); SIGKILL if it will not stop."""
        self.sigterm()
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            self.popen.kill()
            self.popen.wait(timeout=5)
            raise AssertionError(
                f"{self.name} did not stop within {timeout}s of SIGTERM\n{self.text()[-2 * LOG_TAIL:]}"
            ) from None

    def dump_stacks(self) -> None:
        """Ask a stuck scheduler or worker for every thread's stack (SIGUSR2, ``faulthandler``), into its log."""
        if self.alive():
            size = self.log.stat().st_size if self.log.exists() else 0
            self.popen.send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and (self.log.stat().st_size if self.log.exists() else 0) == size:
                time.sleep(0.05)
            time.sleep(0.2)  # (the dump is written in one go; this lets its last lines land)

    def kill9(self) -> None:
        """kill -9: no cleanup at all, as a crash or an OOM kill."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def kill_watchdog(self) -> int:
        """kill -9 this worker's group watchdog (``loopsq.executor.watchdog``), so that the run processes it
        started outlive a kill -9 of the worker, as they would if the watchdog had died first: what recovery's own
        orphan kill is there for. Returns the watchdog's pid."""
        import psutil

        from loopsq.executor.watchdog import WATCHDOG_CODE

        watchdog = next(p for p in psutil.Process(self.pid).children() if WATCHDOG_CODE in p.cmdline())
        watchdog.kill()
        deadline = time.monotonic() + 10
        # A zombie until the worker reaps it (at its next spawn): dead all the same.
        while is_process_alive(watchdog.pid):
            assert time.monotonic() < deadline, f"watchdog {watchdog.pid} of {self.name} did not die"
            time.sleep(0.02)
        return int(watchdog.pid)


@dataclass
class Cluster:
    """Processes of one test against the session's private redis-server, and the CLI with the same env."""

    url: str
    tmp: Path
    env: dict[str, str]
    client: redis.Redis
    procs: list[Proc] = field(default_factory=list)

    @property
    def ledger_dir(self) -> Path:
        path = self.tmp / "ledgers"
        path.mkdir(exist_ok=True)
        return path

    # -- processes ------------------------------------------------------------------------------------------
    def start(self, role: str, *, name: str | None = None, env: dict[str, str] | None = None,
              wait: bool = True) -> Proc:
        """Start ``loopsq <role>`` (scheduler or worker); by default wait until it has registered."""
        name = name or f"{role}{sum(p.name.startswith(role) for p in self.procs) + 1}"
        log = self.tmp / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "loopsq", role], env={**self.env, **(env or {})}, stdout=out,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.tmp,
            )
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        if wait:
            self.wait_started(proc)
        return proc

    def start_rq_worker(self, name: str) -> Proc:
        """A plain ``rq worker`` (RQ's own command, no loopsq start-up) on loopsq's queue, as another service
        might run; it executes loopsq's jobs by their dotted paths."""
        log = self.tmp / f"{name}.log"
        rq_cli = Path(sys.executable).parent / "rq"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [str(rq_cli), "worker", "loopsq", "--url", self.url, "--worker-class", "rq.worker.SimpleWorker",
                 "--name", name], env=self.env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.tmp,
            )
        proc = Proc(f"worker-{name}", popen, log)
        self.procs.append(proc)
        self.wait_until(lambda: "Listening on" in proc.text() or not proc.alive(), 20, f"{name} to start")
        assert proc.alive(), f"{name} exited with {popen.returncode}\n{self.logs()}"
        return proc

    def wait_started(self, *procs: Proc) -> None:
        """Wait until each process has logged its id (it registered); fail if one exits first."""
        for proc in procs:
            self.wait_until(lambda p=proc: "started id=" in p.text() or not p.alive(), 20, f"{proc.name} to start")
            assert "started id=" in proc.text(), f"{proc.name} exited with {proc.popen.returncode}\n{self.logs()}"

    def start_all(self, schedulers: int = 0, workers: int = 0) -> list[Proc]:
        """Start several schedulers and workers at once (in parallel), and wait until all have registered."""
        procs = [self.start("scheduler", wait=False) for _ in range(schedulers)]
        procs += [self.start("worker", wait=False) for _ in range(workers)]
        self.wait_started(*procs)
        return procs

    def worker_id(self, proc: Proc) -> str:
        """The worker id a process logged at start (``started id=...``)."""
        for line in proc.text().splitlines():
            if "started id=" in line:
                return line.split("started id=", 1)[1].strip()
        raise AssertionError(f"{proc.name} logged no id\n{proc.text()[-LOG_TAIL:]}")

    def stop_all(self) -> None:
        """SIGTERM every process still running (schedulers first, so nothing new is fired), then wait."""
        for role in ("scheduler", "worker"):
            for proc in self.procs:
                if proc.name.startswith(role):
                    proc.sigterm()
        stuck: list[str] = []
        for proc in self.procs:  # (every one, even after one would not stop: none runs on into the next test)
            try:
                proc.terminate()
            except AssertionError as exc:
                stuck.append(str(exc))
        if stuck:
            raise AssertionError("\n\n".join(stuck))

    def logs(self) -> str:
        """Every process's log (the tail of each), for failure messages."""
        parts = []
        for proc in self.procs:
            state = "running" if proc.alive() else f"exit={proc.popen.returncode}"
            parts.append(f"----- {proc.name} (pid {proc.pid}, {state}) -----\n{proc.text()[-LOG_TAIL:]}")
        return "\n".join(parts)

    # -- the CLI --------------------------------------------------------------------------------------------
    def cli(self, *args: str, check: bool = True, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``python -m loopsq ARGS``; with ``check``, fail (with logs) on a non-zero exit."""
        try:
            done = subprocess.run([sys.executable, "-m", "loopsq", *args], env={**self.env, **(env or {})},
                                  capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  cwd=self.tmp)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"loopsq {' '.join(args)} did not finish within {timeout}s (hung)\n"
                                 f"stdout: {exc.stdout!r}\n{self.logs()}") from None
        if check and done.returncode != 0:
            raise AssertionError(f"loopsq {' '.join(args)} exited {done.returncode}\nstdout: {done.stdout}\n"
                                 f"stderr: {done.stderr}\n{self.logs()}")
        return done

    def create_fast(self, name: str, cmd: str, every_ms: int, catch_up: str | None = None) -> None:
        """What ``create command NAME --cmd CMD --every <every_ms>ms [--catch-up POLICY]`` stores, through the SDK
        in this process (a CLI process per loop costs half a second)."""
        from loopsq.sdk import LoopsClient

        body: dict[str, object] = {
            "name": name, "schedule": {"type": "interval", "everyMs": every_ms, "anchor": "fixed_rate"},
            "target": {"type": "command", "command": cmd, "shell": True}}
        if catch_up is not None:
            body["catchUp"] = catch_up
        client = LoopsClient(self.url)
        try:
            client.create(body)
        finally:
            client.close()

    def create(self, name: str, cmd: str, *options: str) -> str:
        """``loopsq create command NAME --cmd CMD OPTIONS``; returns the loop id."""
        out = self.cli("create", "command", name, "--cmd", cmd, *options).stdout
        return out.split()[2]

    def ledger_cmd(self) -> str:
        """The ledger command for this cluster (a file per loop under ``ledger_dir``)."""
        return LEDGER_CMD.format(ledger=self.ledger_dir)

    # -- waiting --------------------------------------------------------------------------------------------
    def wait_until(self, predicate: Callable[[], T], timeout: float, what: str, every: float = 0.1) -> T:
        """Poll ``predicate`` until it returns something truthy (returned); AssertionError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.logs()}")
            time.sleep(every)

    # -- reading state ----------------------------------------------------------------------------------------
    def loop(self, name: str) -> dict[str, Any]:
        """The stored loop (camelCase JSON) by name."""
        loop_id = self.client.hget(KEYS.loop_names, name)
        assert loop_id, f"no loop named {name}"
        return json.loads(str(self.client.get(KEYS.loop(str(loop_id)))))

    def runs(self, name: str) -> list[LoopRun]:
        """A loop's runs from Redis, oldest first."""
        ids = self.client.zrange(KEYS.loop_runs(self.loop(name)["id"]), 0, -1)
        runs = run_codec.load_many(self.client, [KEYS.run(str(i)) for i in ids])
        return sorted(runs, key=lambda r: (r.scheduled_for, r.created_at))

    def ran(self, name: str) -> list[LoopRun]:
        """A loop's runs that executed or were skipped, oldest first: its ``runs`` less the ``missed`` records of
        slots that fell due before the processes were up (a loop's timer is armed at its creation)."""
        return [r for r in self.runs(name) if r.status != "missed"]

    def run(self, run_id: str) -> LoopRun | None:
        return run_codec.load(self.client, KEYS.run(run_id))

    def timer_at(self, name: str) -> float | None:
        """Epoch seconds of the loop's armed (not yet fired) timer, None when it has none armed."""
        from loopsq.engine import timers

        raw = client_for(self.url, decode_responses=False)
        try:
            loop_id = self.loop(name)["id"]
            return timers.armed_state(raw, KEYS, [loop_id])[loop_id][0]
        finally:
            raw.close()

    def changes(self) -> list[dict[str, Any]]:
        """Every change-stream entry: ``{"id", "type", "at", "data"}`` with ``data`` parsed."""
        out = []
        for entry_id, fields_ in self.client.xrange(KEYS.changes):
            out.append({"id": entry_id, "type": fields_["type"], "at": fields_["at"],
                        "data": json.loads(fields_["data"])})
        return out

    def ledger(self, name: str) -> list[tuple[str, ...]]:
        """The lines a loop's command appended to its ledger, split on spaces."""
        path = self.ledger_dir / f"ledger-{name}"
        if not path.exists():
            return []
        return [tuple(line.split()) for line in path.read_text().splitlines() if line.strip()]


def slots_ms(slots: list[str]) -> list[int]:
    """ISO slots as epoch milliseconds."""
    return [int(from_iso(s).timestamp() * 1000) for s in slots]


def gaps(slots: list[str], every_ms: int) -> list[tuple[str, str]]:
    """Consecutive pairs of the (sorted) slots that are not exactly ``every_ms`` apart."""
    ordered = sorted(slots)
    ms = slots_ms(ordered)
    return [(ordered[i], ordered[i + 1]) for i in range(len(ms) - 1) if ms[i + 1] - ms[i] != every_ms]


def open_cluster(url: str, tmp: Path) -> Iterator[Cluster]:
    """A fresh cluster on a flushed private server; on teardown every process is stopped and, if anything went
    wrong, the logs are printed (pytest shows them with the failure)."""
    client = client_for(url)  # any URL form loopsq takes, a redis+sentinel:// one included
    client.flushall()
    env = {**os.environ, "LOOPSQ_REDIS_URL": url, "LOOPSQ_DATA_DIR": str(tmp / "data"), "PYTHONUNBUFFERED": "1"}
    env.pop("LOOPSQ_FAULT", None)
    cluster = Cluster(url, tmp, env, client)
    try:
        yield cluster
    finally:
        try:
            cluster.stop_all()
        finally:
            print(cluster.logs())
            client.close()
