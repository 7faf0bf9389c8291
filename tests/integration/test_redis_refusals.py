"""Redis errors that are not outages, with real processes on a private redis-server (issue "Loops never stop
silently", point 4): Redis refusing writes (``OOM`` at ``maxmemory`` under ``noeviction``, ``READONLY`` from a
replica), refusing commands (``BUSY`` while a long script runs), forgetting its scripts (``SCRIPT FLUSH``), and
data of the wrong type (``WRONGTYPE``).

In each: no process exits, the cause is logged once in its own words (never as Redis being unreachable), things
resume when Redis takes writes again, and a run that ended meanwhile is recorded once with its result.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from loopsq.domain import timeutil
from loopsq.state.keys import Keys
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration
KEYS = Keys()
OOM = "Redis refuses writes: OOM command not allowed when used memory > 'maxmemory'."
WRITES_BACK = "Redis accepts writes again after "
UNREACHABLE = "redis unavailable ("


@pytest.fixture
def server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def cluster(server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(server.url, tmp_path)


def fill_to_maxmemory(client: redis.Redis) -> None:
    """A key of 4 MB (appended in small pieces: a big command's query buffer would be counted, then freed), then
    ``maxmemory`` 1 MB under what Redis uses now, under ``noeviction``: from here on every write that may grow
    memory is refused with ``OOM`` (connections' buffers coming and going do not bring it under the limit)."""
    for _ in range(64):
        client.append("test:filler", "x" * 64 * 1024)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) - 1024 * 1024)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("test:probe", "x")


def start_web(cluster: Cluster) -> tuple[Proc, httpx.Client]:
    port = free_port()
    log = cluster.tmp / "web.log"
    with log.open("wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "loopsq", "web", "--port", str(port), "--no-rq-dashboard"],
                                 env={**cluster.env, "LOOPSQ_API_TOKEN": "refusal-test-token-0123456789"},
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cluster.tmp)
    web = Proc("web", popen, log)
    cluster.procs.append(web)
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def answers() -> bool:
        try:
            return http.get("/api/health").status_code == 200
        except httpx.TransportError:
            return False

    cluster.wait_until(answers, 30, "the web app to answer")
    return web, http


def assert_alive(cluster: Cluster, *procs: Proc) -> None:
    for proc in procs:
        assert proc.alive(), f"{proc.name} exited with {proc.popen.returncode}\n{cluster.logs()}"


@pytest.mark.timeout(120)
def test_a_run_that_ends_while_redis_is_out_of_memory_is_recorded_once_when_it_takes_writes_again(
    cluster: Cluster, server: RedisServer
) -> None:
    cmd = f'echo start >> {cluster.ledger_dir}/ledger-oom; sleep 3; echo the-result'
    cluster.create("oom", cmd, "--at", timeutil.to_iso(timeutil.now()))
    scheduler, worker = cluster.start_all(schedulers=1, workers=1)
    web, http = start_web(cluster)
    run = cluster.wait_until(lambda: next((r for r in cluster.runs("oom") if r.pid), None), 20,
                             "the run's process to start")

    fill_to_maxmemory(cluster.client)
    time.sleep(6)  # the run ends (its finalize is refused) and every process keeps running into OOM for a while
    assert_alive(cluster, scheduler, worker, web)
    # (its end may be recorded already: a Lua script that wrote once may go on writing past maxmemory)
    health = http.get("/api/health")
    assert (health.status_code, health.json()["status"], health.json()["reason"]) == \
        (200, "degraded", "writes refused: OOM command not allowed when used memory > 'maxmemory'."), health.text
    doctor = cluster.cli("doctor", check=False)
    assert doctor.returncode == 1
    assert "writes refused: OOM command not allowed when used memory > 'maxmemory'." in doctor.stdout, doctor.stdout
    assert worker.text().count(OOM) == 1, worker.text()

    cluster.client.config_set("maxmemory", 0)
    final = cluster.wait_until(lambda: (r := cluster.run(run.id)) and r.terminal and r, 30,
                               "the run to be recorded once Redis takes writes")
    assert (final.status, final.exit_code, final.stdout, final.worker_id) == \
        ("succeeded", 0, "the-result\n", run.worker_id), final.to_dict()
    time.sleep(2)
    assert cluster.ledger("oom") == [("start",)]
    assert [r.id for r in cluster.ran("oom")] == [run.id]
    assert [c["type"] for c in cluster.changes() if c["type"] == "run_abandoned"] == []
    assert http.get("/api/health").json()["status"] == "ok"
    assert_alive(cluster, scheduler, worker, web)
    cluster.wait_until(lambda: worker.text().count(WRITES_BACK) == 1, 10, "the worker to log writes back")
    for proc in (scheduler, worker, web):
        text = proc.text()
        assert text.count(OOM) <= 1 and text.count(WRITES_BACK) == text.count(OOM), f"{proc.name}:\n{text}"
        assert UNREACHABLE not in text and "cannot reach Redis" not in text, f"{proc.name}:\n{text}"
        assert "unhandled exception" not in text and "Traceback" not in text, f"{proc.name}:\n{text}"
        assert len(text.splitlines()) < 40, f"{proc.name} logged too much:\n{text}"


def ledger_grows(cluster: Cluster, name: str, by: int, timeout: float = 20) -> None:
    start = len(cluster.ledger(name))
    cluster.wait_until(lambda: len(cluster.ledger(name)) >= start + by, timeout, f"{name} to run {by} more times")


def assert_one_episode(cluster: Cluster, procs: list[Proc], first: str, back: str, *,
                       allow_reset: bool = False) -> None:
    """Every process is alive; any that met the refusal logged it once (``first``, the server's own words) and
    its end once, never as Redis being unreachable, and no traceback."""
    for proc in procs:
        assert proc.alive(), f"{proc.name} exited with {proc.popen.returncode}\n{cluster.logs()}"
        text = proc.text()
        assert text.count(first) <= 1 and text.count(back) == text.count(first), f"{proc.name}:\n{text}"
        # (REPLICAOF drops the server's clients: a connection reset then is an outage, truly, and said so.)
        unreachable = [line for line in text.splitlines() if "cannot reach Redis" in line]
        assert all("Connection reset by peer" in line or "Connection closed by server" in line
                   for line in unreachable) if allow_reset else not unreachable, f"{proc.name}:\n{text}"
        assert "Traceback" not in text, f"{proc.name}:\n{text}"


@pytest.mark.timeout(120)
def test_processes_pointed_at_a_read_only_replica_wait_with_one_line_and_resume_when_it_is_promoted(
    cluster: Cluster, server: RedisServer
) -> None:
    cluster.create_fast("ro", cluster.ledger_cmd(), 1000)
    procs = cluster.start_all(schedulers=1, workers=1)
    ledger_grows(cluster, "ro", 2)
    # A failover seen from the processes' side: their server becomes a replica of another (which holds the same
    # data: it replicated this one first), so it answers every write with READONLY.
    other = RedisServer(replica_of=server.port).start()
    try:
        cluster.wait_until(lambda: other.client().info("replication")["master_link_status"] == "up", 20,
                           "the other server to replicate")
        other.client().replicaof("NO", "ONE")
        cluster.client.replicaof("127.0.0.1", str(other.port))
        time.sleep(4)
        line = "Redis refuses writes: READONLY You can't write against a read only replica."
        for proc in procs:
            cluster.wait_until(lambda p=proc: line in p.text(), 10, f"{proc.name} to log READONLY")
        doctor = cluster.cli("doctor", check=False)
        assert doctor.returncode == 1 and f"writes refused: {line[len('Redis refuses writes: '):]}" in doctor.stdout
        cluster.client.replicaof("NO", "ONE")
        ledger_grows(cluster, "ro", 2)
        for proc in procs:
            cluster.wait_until(lambda p=proc: WRITES_BACK in p.text(), 10, f"{proc.name} to log writes back")
        assert_one_episode(cluster, procs, line, WRITES_BACK, allow_reset=True)
    finally:
        other.cleanup()


@pytest.mark.timeout(120)
def test_a_long_script_that_makes_redis_answer_busy_is_waited_out_with_one_line(
    cluster: Cluster, server: RedisServer
) -> None:
    cluster.create_fast("busy", cluster.ledger_cmd(), 1000)
    procs = cluster.start_all(schedulers=1, workers=1)
    ledger_grows(cluster, "busy", 2)
    cluster.client.config_set("busy-reply-threshold", 100)
    blocker = server.client(socket_timeout=30)
    failed: list[BaseException] = []

    def run_forever() -> None:
        try:
            blocker.eval("while true do end", 0)
        except redis.RedisError as exc:  # killed: "ERR Error running script ... Script killed by user"
            failed.append(exc)

    thread = threading.Thread(target=run_forever)
    thread.start()
    time.sleep(3)
    killer = server.client()
    killer.script_kill()
    thread.join(10)
    assert failed, "the script was not killed"
    ledger_grows(cluster, "busy", 2)
    line = "Redis refuses commands: BUSY Redis is busy running a script."
    back = "Redis accepts commands again after "
    for proc in procs:
        cluster.wait_until(lambda p=proc: line in p.text() and back in p.text(), 10, f"{proc.name} to log BUSY")
    assert_one_episode(cluster, procs, line, back)


@pytest.mark.timeout(120)
def test_a_script_flush_under_running_processes_costs_nothing(cluster: Cluster, server: RedisServer) -> None:
    cluster.create_fast("flush", cluster.ledger_cmd(), 1000)
    procs = cluster.start_all(schedulers=1, workers=1)
    ledger_grows(cluster, "flush", 2)
    for _ in range(5):
        cluster.client.script_flush()
        time.sleep(0.5)
    ledger_grows(cluster, "flush", 3)
    for proc in procs:
        assert proc.alive(), f"{proc.name} exited with {proc.popen.returncode}\n{cluster.logs()}"
        text = proc.text()
        assert "NOSCRIPT" not in text and "Traceback" not in text and "redis error" not in text, \
            f"{proc.name}:\n{text}"


@pytest.mark.timeout(120)
def test_data_of_the_wrong_type_is_logged_once_with_its_traceback_and_the_processes_go_on(
    cluster: Cluster, server: RedisServer
) -> None:
    from loopsq.engine import timers

    cluster.create_fast("wrongtype", cluster.ledger_cmd(), 1000)
    scheduler, worker = procs = cluster.start_all(schedulers=1, workers=1)
    ledger_grows(cluster, "wrongtype", 2)
    queue = timers.queue_key(timers.QUEUE_NAME)
    # rq-scheduler's timers and RQ's queue become strings: every pass of the scheduler and every dequeue of the
    # worker meets WRONGTYPE.
    saved = cluster.client.zrange(timers.scheduled_key(), 0, -1, withscores=True)
    cluster.client.delete(timers.scheduled_key(), queue)
    cluster.client.set(timers.scheduled_key(), "corrupted")
    cluster.client.set(queue, "corrupted")
    time.sleep(4)
    for proc in procs:
        assert proc.alive(), f"{proc.name} exited with {proc.popen.returncode}\n{cluster.logs()}"
    assert scheduler.text().count("redis error in the scheduler loop") == 1, scheduler.text()
    assert worker.text().count("redis error in RQ's work loop") == 1, worker.text()
    for proc in procs:
        assert "WRONGTYPE" in proc.text() and "Traceback" in proc.text(), proc.text()
        assert "cannot reach Redis" not in proc.text(), proc.text()
    cluster.client.delete(timers.scheduled_key(), queue)
    if saved:
        cluster.client.zadd(timers.scheduled_key(), dict(saved))
    ledger_grows(cluster, "wrongtype", 2, timeout=30)
    for proc in procs:
        assert proc.alive(), f"{proc.name} exited with {proc.popen.returncode}\n{cluster.logs()}"
