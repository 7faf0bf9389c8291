"""Redis outages with real processes (issue 13): Redis on AOF with ``appendfsync always``, killed with -9 and
restarted from its AOF on the same port, under a scheduler, workers, a mirror, the web app and ``up``.

- A run that finishes during an outage keeps its result (status, exit code, output), is recorded once and never
  executed again, with one worker and with two, even when its worker reaches Redis seconds after the others;
  also for an outage just shorter than the lease that starts right before a renewal.
- An outage longer than a run's lease: the run's late result is fenced off, the run is recorded abandoned once
  the grace after the outage is over, and retried.
- Right after a restart of Redis, recovery (maintenance, a worker's reap, a starting worker's orphan kill) judges
  no owner dead and kills no process of a live worker whose liveness key expired across the restart.
- Every process rides an outage out (a scheduler, a worker and a mirror through 15 s; the web app answering 503
  then 200; ``up``'s children through a restart of its Redis; processes started while Redis is away), with one
  log line when it starts and one when it ends; only a configuration error ends one, with its one line.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import from_iso
from loopsq.engine import maintenance
from loopsq.engine.recovery import reap_host
from loopsq.engine.runtime import LIVENESS_TTL_MS, Runtime
from loopsq.engine.worker_process import kill_orphans
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.runs import Claim, Owner, RunStore
from loopsq.system.procs import hostname, is_process_alive, process_start_time
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()
DOWN = "redis unavailable ("
BACK = "redis reachable again after "


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    """A private server of this test only, on AOF with every write synced before it is answered."""
    server = RedisServer(appendonly=True, appendfsync="always").start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def cluster(aof_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(aof_server.url, tmp_path)


def outage(server: RedisServer, seconds: float) -> float:
    """kill -9 Redis, keep it away ``seconds``, restart it from its AOF on the same port; the kill's epoch time."""
    killed_at = time.time()
    server.stop(signal.SIGKILL)
    time.sleep(seconds)
    server.start()
    return killed_at


def freeze(server: RedisServer, seconds: float) -> float:
    """SIGSTOP Redis for ``seconds`` (no restart: its clients hang, then time out); the freeze's epoch time."""
    assert server.proc is not None
    frozen_at = time.time()
    server.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        server.proc.send_signal(signal.SIGCONT)
    return frozen_at


def assert_rode_it_out(cluster: Cluster, procs: list[Proc], outages: int | None = 1) -> None:
    """Every process is alive and logged each outage once: one line when it started, one when it ended.

    ``outages`` None: at most one of each, as many ends as starts (a frozen Redis may only slow calls down).
    """
    for proc in procs:
        assert proc.alive(), f"{proc.name} exited with {proc.popen.returncode}\n{cluster.logs()}"
        if outages is not None:
            cluster.wait_until(lambda p=proc: p.text().count(BACK) >= outages, 10, f"{proc.name} to see Redis back")
        text = proc.text()
        counts = (text.count(DOWN), text.count(BACK))
        assert counts == (outages, outages) if outages is not None else counts in ((0, 0), (1, 1)), \
            f"{proc.name}:\n{text[-4000:]}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("workers", "kind"), [(1, "kill"), (2, "kill"), (2, "freeze")])
def test_a_run_that_finishes_during_an_outage_keeps_its_result_and_is_recorded_once(
    cluster: Cluster, aof_server: RedisServer, workers: int, kind: str
) -> None:
    # kill: SIGKILL and a restart from AOF; freeze: Redis stopped (SIGSTOP), no restart, so only the silence in
    # every process's beats tells recovery that liveness keys expired for want of Redis.
    cmd = f'echo "start $LOOPS_ATTEMPT" >> {cluster.ledger_dir}/ledger-finish; sleep 6; echo the-result'
    cluster.create("finish", cmd, "--at", timeutil.to_iso(timeutil.now()), "--attempts", "2")
    procs = cluster.start_all(schedulers=1, workers=workers)
    run = cluster.wait_until(lambda: next((r for r in cluster.runs("finish") if r.pid), None), 20,
                             "the run's process to start")
    (holder,) = [p for p in procs if p.name.startswith("worker") and cluster.worker_id(p) == run.worker_id]
    # Redis goes away about a second before the run ends, and stays away longer than the liveness TTL (5 s).
    time.sleep(4.5)
    current = cluster.run(run.id)
    assert current is not None and current.status == "running", "the run ended before the outage"
    # The worker holding the run reaches Redis 5 s after the others (stopped meanwhile; its target, a process
    # group of its own, goes on and ends during the outage): recovery must give it that time.
    holder.popen.send_signal(signal.SIGSTOP)
    try:
        killed_at = outage(aof_server, 8) if kind == "kill" else freeze(aof_server, 8)
        time.sleep(5)
    finally:
        holder.popen.send_signal(signal.SIGCONT)

    final = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.terminal and r, 30,
                               "the run to be recorded after the outage")
    assert (final.status, final.exit_code, final.stdout, final.attempt) == ("succeeded", 0, "the-result\n", 1), \
        final.to_dict()
    assert final.finished_at is not None and from_iso(final.finished_at).timestamp() > killed_at
    assert final.worker_id == run.worker_id
    assert [c["type"] for c in cluster.changes() if c["type"] == "run_abandoned"] == []
    time.sleep(2)  # a few maintenance passes and reaps more
    assert cluster.ledger("finish") == [("start", "1")]
    assert [r.id for r in cluster.runs("finish")] == [run.id]
    assert_rode_it_out(cluster, procs, 1 if kind == "kill" else None)


@pytest.mark.timeout(120)
def test_an_outage_just_shorter_than_the_lease_that_starts_right_before_a_renewal_keeps_the_result(
    cluster: Cluster, aof_server: RedisServer
) -> None:
    # Lease 10 s, renewed every 3.3 s: the outage (8 s) starts just before a renewal is due, when the lease has
    # the least left; the lease key, living a renewal period longer than the lease, outlasts it.
    cmd = f'echo "start $LOOPS_ATTEMPT" >> {cluster.ledger_dir}/ledger-edge; sleep 7; echo kept'
    cluster.create("edge", cmd, "--at", timeutil.to_iso(timeutil.now()), "--attempts", "2", "--lease", "10s")
    procs = cluster.start_all(schedulers=1, workers=1)
    run = cluster.wait_until(lambda: next((r for r in cluster.runs("edge") if r.pid), None), 20,
                             "the run's process to start")
    renewed = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.lease_expires_at != run.lease_expires_at
                                 and r, 10, "the lease's first renewal")
    time.sleep(3.0)  # the next renewal is due 3.3 s after that one
    current = cluster.run(run.id)
    assert current is not None and current.lease_expires_at == renewed.lease_expires_at, "renewed again already"
    outage(aof_server, 8)

    final = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.terminal and r, 30, "the run to be recorded")
    assert (final.status, final.stdout, final.attempt) == ("succeeded", "kept\n", 1), final.to_dict()
    assert cluster.ledger("edge") == [("start", "1")]
    assert_rode_it_out(cluster, procs)


@pytest.mark.timeout(120)
def test_an_outage_longer_than_the_lease_drops_the_late_result_and_the_run_is_retried_after_the_grace(
    cluster: Cluster, aof_server: RedisServer
) -> None:
    cmd = f'echo "start $LOOPS_ATTEMPT" >> {cluster.ledger_dir}/ledger-long; sleep 2; echo attempt-$LOOPS_ATTEMPT'
    cluster.create("long", cmd, "--at", timeutil.to_iso(timeutil.now()), "--attempts", "2", "--lease", "5s",
                   "--retry-delay", "100ms")
    procs = cluster.start_all(schedulers=1, workers=1)
    run = cluster.wait_until(lambda: next((r for r in cluster.runs("long") if r.pid), None), 20,
                             "the run's process to start")
    outage(aof_server, 10)  # the run ends while Redis is away, whose lease (5 s, the minimum) expires meanwhile

    final = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.terminal and r.attempt == 2 and r, 60,
                               "attempt 2 to end")
    assert (final.status, final.stdout) == ("succeeded", "attempt-2\n"), final.to_dict()
    # Attempt 1's result came too late (fenced off: its lease had expired); recovery recorded it abandoned once
    # the grace after the outage was over, and retried it.
    (earlier,) = final.previous_attempts or []
    assert (earlier["attempt"], earlier["status"], earlier["error"]) == (
        1, "abandoned", "run lease expired before completion"), earlier
    assert cluster.ledger("long") == [("start", "1"), ("start", "2")]
    assert "lease lost before finalize; nothing written" in procs[1].text()
    assert_rode_it_out(cluster, procs)


def _mirrored_run_ids(db: Path) -> set[str]:
    if not db.exists():
        return set()
    with sqlite3.connect(db) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM loop_runs")}


@pytest.mark.timeout(150)
def test_a_scheduler_a_worker_and_a_mirror_ride_out_a_fifteen_second_outage(
    cluster: Cluster, aof_server: RedisServer
) -> None:
    cluster.create("steady", cluster.ledger_cmd(), "--every", "1s")
    procs = cluster.start_all(schedulers=1, workers=1)
    mirror = cluster.start("mirror", wait=False)
    cluster.wait_until(lambda: "following " in mirror.text(), 20, "the mirror to follow")
    procs.append(mirror)
    cluster.wait_until(lambda: len(cluster.ledger("steady")) >= 2, 20, "runs before the outage")
    killed_at = outage(aof_server, 15)

    def ran_after() -> int:
        return sum(from_iso(line[0]).timestamp() > killed_at + 15 for line in cluster.ledger("steady"))

    cluster.wait_until(lambda: ran_after() >= 3, 30, "slots after the outage")
    db = Path(cluster.env["LOOPSQ_DATA_DIR"]) / "loops.db"

    def mirrored() -> bool:
        in_redis = {r.id for r in cluster.runs("steady") if r.terminal}
        return in_redis <= _mirrored_run_ids(db)

    cluster.wait_until(mirrored, 20, "the mirror to hold every run Redis holds")
    slots = [line[0] for line in cluster.ledger("steady")]
    assert len(slots) == len(set(slots)), "a slot ran twice"
    assert_rode_it_out(cluster, procs)


@pytest.mark.timeout(120)
def test_a_web_request_during_an_outage_gets_503_and_the_app_answers_again_once_redis_is_back(
    cluster: Cluster, aof_server: RedisServer
) -> None:
    import httpx

    from tests.redis_server import free_port

    token = "outage-test-token-0123456789"
    port = free_port()
    log = cluster.tmp / "web.log"
    with log.open("wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "loopsq", "web", "--port", str(port), "--no-rq-dashboard"],
                                 env={**cluster.env, "LOOPSQ_API_TOKEN": token}, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cluster.tmp)
    web = Proc("web", popen, log)
    cluster.procs.append(web)
    cluster.create("listed", "true", "--every", "1h")
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                        timeout=30)
    try:
        def answers() -> httpx.Response | None:
            try:
                return http.get("/api/loops")
            except httpx.TransportError:
                return None

        first = cluster.wait_until(answers, 30, "the web app to answer")
        assert first.status_code == 200 and [loop["name"] for loop in first.json()["items"]] == ["listed"]

        aof_server.stop(signal.SIGKILL)
        down = http.get("/api/loops")
        assert down.status_code == 503, down.text
        error = down.json()["error"]
        assert (error["status"], error["code"]) == (503, "redis_unavailable")
        assert error["message"].startswith(f"cannot reach Redis at {aof_server.url}: ")
        assert http.get("/api/health").status_code == 503
        time.sleep(3)
        aof_server.start()

        again = cluster.wait_until(lambda: (r := answers()) is not None and r.status_code == 200 and r, 30,
                                   "the web app to answer 200 again")
        assert [loop["name"] for loop in again.json()["items"]] == ["listed"]
        assert http.get("/api/health").status_code == 200
        assert_rode_it_out(cluster, [web])  # its mirror follower: one line down, one line back
    finally:
        http.close()


@pytest.mark.timeout(180)
def test_the_processes_up_supervises_ride_out_a_restart_of_its_embedded_redis(tmp_path: Path) -> None:
    from tests.integration.test_up import Up, clean_env, wait_for_runs
    from tests.redis_server import free_port

    env = clean_env(tmp_path)
    up = Up(env, tmp_path / "up.log", "--workers", "1", "--web-port", str(free_port()))
    try:
        up.wait_for(r"^up \| running; Ctrl-C stops everything", 60)
        created = subprocess.run([sys.executable, "-m", "loopsq", "create", "command", "beat", "--cmd", "true",
                                  "--every", "1s"], env=env, capture_output=True, text=True, timeout=60)
        assert created.returncode == 0, created.stderr
        wait_for_runs(env, "beat", 30, status="succeeded")
        mark = len(up.text())
        os.kill(up.pid_of("redis"), signal.SIGKILL)
        up.wait_for(r"^up \| redis exited with signal SIGKILL; restarting in 1s$", 10, mark)
        up.wait_for(r"^up \| started redis \(pid \d+\)$", 10, mark)
        # Runs go on on the restarted Redis (its AOF kept the loop), and no other child exited meanwhile.
        before = len(wait_for_runs(env, "beat", 10, status="succeeded"))
        deadline = time.monotonic() + 30
        while len(wait_for_runs(env, "beat", 10, status="succeeded")) <= before + 2:
            assert time.monotonic() < deadline, up.text()
            time.sleep(0.5)
        exited = re.findall(r"^up \| (\S+) exited with", up.text()[mark:], re.MULTILINE)
        assert exited == ["redis"], up.text()[mark:]
    finally:
        up.cleanup()


@pytest.mark.timeout(90)
def test_processes_started_while_redis_is_away_wait_for_it_and_a_wrong_password_ends_them_with_one_line(
    tmp_path: Path,
) -> None:
    from tests.redis_server import free_port

    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    masked = f"redis://:***@127.0.0.1:{port}/0"
    env = {**os.environ, "LOOPSQ_REDIS_URL": url, "LOOPSQ_DATA_DIR": str(tmp_path / "d"), "PYTHONUNBUFFERED": "1"}
    cluster = Cluster(url, tmp_path, env, None)  # type: ignore[arg-type]
    procs = [cluster.start(role, wait=False) for role in ("scheduler", "worker", "mirror")]
    server: subprocess.Popen[bytes] | None = None
    try:
        for proc in procs:
            cluster.wait_until(lambda p=proc: DOWN in p.text() or not p.alive(), 20, f"{proc.name} to wait")
        server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--requirepass", "hunter2"], stdout=subprocess.DEVNULL)
        cluster.wait_started(procs[0], procs[1])
        cluster.wait_until(lambda: "following " in procs[2].text(), 20, "the mirror to follow")
        assert_rode_it_out(cluster, procs)
        assert "hunter2" not in "".join(p.text() for p in procs)

        # A configuration error ends them at once, with one line and exit status 3: no password, a wrong one.
        for bad, reason in ((f"redis://127.0.0.1:{port}/0", "Authentication required."),
                            (f"redis://:nope@127.0.0.1:{port}/0",
                             "invalid username-password pair or user is disabled.")):
            shown = bad.replace(":nope@", ":***@")
            for role in ("scheduler", "worker", "mirror"):
                # (a data dir of their own: the mirror above follows "d", and a second one there is refused first)
                done = subprocess.run([sys.executable, "-m", "loopsq", "--redis-url", bad, role],
                                      capture_output=True, text=True, timeout=30,
                                      env={**env, "LOOPSQ_DATA_DIR": str(tmp_path / "other")})
                assert (done.returncode, done.stdout, done.stderr) == (
                    3, "", f"error: cannot reach Redis at {shown}: {reason}\n"), role
        assert masked in procs[0].text()
    finally:
        for proc in cluster.procs:
            if proc.alive():
                proc.terminate()
        if server is not None:
            server.kill()
            server.wait(10)


@pytest.mark.timeout(120)
def test_up_with_a_configured_redis_that_is_away_waits_for_it(tmp_path: Path) -> None:
    from tests.integration.test_up import Up, clean_env

    server = RedisServer()
    url = server.url
    up = Up(clean_env(tmp_path, LOOPSQ_REDIS_URL=url), tmp_path / "up.log", "--workers", "1", "--no-web")
    try:
        up.wait_for(rf"^up \| redis unavailable \(cannot reach Redis at {re.escape(url)}: .*\); waiting for it", 30)
        server.start()
        up.wait_for(rf"^up \| using Redis at {re.escape(url)} \(redis-server ", 30)
        up.wait_for(r"^up \| running; Ctrl-C stops everything", 60)
        assert len(re.findall(r"^up \| redis unavailable", up.text(), re.MULTILINE)) == 1
        assert len(re.findall(r"^up \| redis reachable again after ", up.text(), re.MULTILINE)) == 1
        assert "up | started redis" not in up.text()  # a configured Redis: none of its own
    finally:
        up.cleanup()
        server.cleanup()


@pytest.mark.timeout(60)
def test_right_after_a_restart_of_redis_recovery_judges_no_owner_dead_and_kills_no_process_of_a_live_worker(
    aof_server: RedisServer,
) -> None:
    # A live worker's run, its process running here; the worker's liveness key expires across the restart (its
    # TTL is an absolute time), as it does for every worker whose restart outlasts the TTL. Recovery running
    # right after the restart, from processes that start then (no beat of their own from before, so only the
    # restart itself can tell them), must wait out the grace: the worker is about to beat again.
    client = aof_server.client()
    target = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        body = {"name": "live", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 3_600_000},
                "target": {"type": "command", "command": "true"}}
        loop = LoopStore(client, KEYS).create(new_loop(body, timeutil.now()))
        store = RunStore(client, KEYS)
        claim = store.claim(loop.id, from_iso(str(loop.next_run_at)), Owner("worker:live", hostname(), 1),
                            timeutil.now())
        assert isinstance(claim, Claim), claim
        assert store.mark_started(claim.run.id, claim.token, timeutil.now(), pid=target.pid,
                                  pid_start_time=process_start_time(target.pid), host=hostname())
        client.set(KEYS.worker("worker:live"), "{}", px=LIVENESS_TTL_MS)
        liveness_gone_at = time.monotonic() + LIVENESS_TTL_MS / 1000
        before = Runtime(client=client, keys=KEYS, role="scheduler")
        assert maintenance.maintain(before).recovered == []  # (recovery knows this server's run id now)
        old_run_id = client.info("server")["run_id"]

        aof_server.stop(signal.SIGKILL)
        time.sleep(max(0.0, liveness_gone_at - time.monotonic()) + 0.2)  # down past the liveness key's expiry
        aof_server.start()
        assert client.info("server")["run_id"] != old_run_id
        assert not client.exists(KEYS.worker("worker:live")) and client.get(KEYS.lease(claim.run.id)) == claim.token

        scheduler = Runtime(client=client, keys=KEYS, role="scheduler")
        report = maintenance.maintain(scheduler)
        assert (report.recovery_paused, report.recovered) == (True, [])
        worker = Runtime(client=client, keys=KEYS, role="worker")
        assert reap_host(worker, timeutil.now()) == []
        assert kill_orphans(worker) == 0
        run = store.get(claim.run.id)
        assert run is not None and run.status == "running", run
        assert is_process_alive(target.pid, run.pid_start_time), "a live worker's process was killed"

        # Once the grace is over with the worker still silent, it is dead: its process is killed, its run recovered.
        client.delete(KEYS.recovery_grace)
        report = maintenance.maintain(scheduler)
        assert [(r.id, r.status, r.error) for r in report.recovered] == [
            (claim.run.id, "abandoned", "worker worker:live died before completion")]
        assert target.wait(timeout=10) == -signal.SIGKILL
    finally:
        if target.poll() is None:
            target.kill()
        target.wait(timeout=10)
        client.close()
