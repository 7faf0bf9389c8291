"""Secrets by file (issue #31, point 7): with ``LOOPSQ_REDIS_URL_FILE`` and ``LOOPSQ_API_TOKEN_FILE``, no secret is
in the environment of any loopsq process, nor of the targets it runs, nor of ``loopsq up``'s children: each
``/proc/<pid>/environ`` is read."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from loopsq.domain import timeutil
from tests.integration.processes import Cluster, open_cluster
from tests.integration.test_up import Up, clean_env, kill_tree
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration
PASSWORD = "pw-in-a-file-7f3a9c"
TOKEN = "token-in-a-file-0123456789abcdef"


@pytest.fixture
def private_server() -> Iterator[RedisServer]:
    server = RedisServer(password=PASSWORD).start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def cluster(private_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    assert private_server.port, "no port: never fall back to a default Redis"
    url_file = tmp_path / "secrets" / "redis-url"
    url_file.parent.mkdir(mode=0o700)
    url_file.write_text(private_server.url + "\n")
    token_file = tmp_path / "secrets" / "api-token"
    token_file.write_text(TOKEN + "\n")
    for cluster in open_cluster(private_server.url, tmp_path):
        cluster.env.pop("LOOPSQ_REDIS_URL")
        cluster.env.pop("LOOPSQ_API_TOKEN", None)
        cluster.env.update(LOOPSQ_REDIS_URL_FILE=str(url_file), LOOPSQ_API_TOKEN_FILE=str(token_file))
        yield cluster


def environ_of(pid: int) -> bytes:
    return Path(f"/proc/{pid}/environ").read_bytes()


def secrets_in(blob: bytes) -> list[str]:
    return [name for name, value in (("the Redis password", PASSWORD), ("the API token", TOKEN))
            if value.encode() in blob]


@pytest.mark.timeout(90)
def test_no_process_configured_by_files_holds_a_secret_in_its_environment(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "target.env"
    cluster.create("env", f"env > {out}; sleep 60", "--at", timeutil.to_iso(timeutil.now()))
    procs = cluster.start_all(schedulers=1, workers=1)
    port = free_port()
    with (tmp_path / "web.log").open("wb") as log:
        web = subprocess.Popen([sys.executable, "-m", "loopsq", "web", "--port", str(port), "--no-mirror"],
                               env=cluster.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        cluster.wait_until(lambda: out.exists() and out.stat().st_size > 0, 30, "the target to write its environment")
        run = cluster.wait_until(lambda: next((r for r in cluster.runs("env") if r.pid), None), 20, "the run's pid")
        cluster.wait_until(lambda: "serving http://" in (tmp_path / "web.log").read_text() or web.poll() is not None,
                           30, "the web app to listen")
        assert web.poll() is None, (tmp_path / "web.log").read_text()
        import httpx

        def answer_of() -> httpx.Response | None:
            try:  # "serving" is logged as uvicorn starts: it may not listen yet on a loaded machine
                return httpx.get(f"http://127.0.0.1:{port}/api/loops", headers={"Authorization": f"Bearer {TOKEN}"})
            except httpx.ConnectError:
                return None

        answer = cluster.wait_until(answer_of, 30, "the web app to answer")
        assert answer.status_code == 200 and "\"name\":\"env\"" in answer.text, answer.text  # the file's token
        found = {p.name: secrets_in(environ_of(p.pid)) for p in procs}
        found["web"] = secrets_in(environ_of(web.pid))
        found["target"] = secrets_in(environ_of(run.pid or 0)) + secrets_in(out.read_bytes())
        assert found == {name: [] for name in found}
        assert b"LOOPSQ_REDIS_URL_FILE" not in out.read_bytes()  # loopsq's own variables stay with loopsq
    finally:
        web.terminate()
        web.wait(20)


@pytest.mark.timeout(120)
def test_up_hands_its_children_the_files_not_the_secrets(tmp_path: Path) -> None:
    # The embedded Redis has a password (in <data-dir>/redis.url) and the web app a token (in <data-dir>/api.token):
    # up's children are given the two files' paths.
    port = free_port()
    up = Up(clean_env(tmp_path), tmp_path / "up.log", "--web-port", str(port))
    try:
        up.wait_for(r"^up \| running", 60)
        data = tmp_path / "data"
        url = (data / "redis.url").read_text().strip()
        token = (data / "api.token").read_text().strip()
        password = redis.from_url(url).connection_pool.connection_kwargs["password"]
        assert password and token
        wanted = {"loopsq scheduler", "loopsq worker", "loopsq mirror", "loopsq web"}

        def started() -> list[psutil.Process] | None:  # each past the exec of up's parent-death shim
            found = psutil.Process(up.proc.pid).children()
            return found if wanted <= {" ".join(c.cmdline()[2:4]) for c in found} else None

        deadline = time.monotonic() + 30
        while (kids := started()) is None:
            assert time.monotonic() < deadline, [c.cmdline() for c in psutil.Process(up.proc.pid).children()]
            time.sleep(0.1)
        for child in kids:
            blob = environ_of(child.pid)
            assert password.encode() not in blob and token.encode() not in blob, child.cmdline()
            if "loopsq" in child.cmdline():
                assert f"LOOPSQ_REDIS_URL_FILE={data / 'redis.url'}".encode() in blob, child.cmdline()
        web = next(c for c in kids if c.cmdline()[2:4] == ["loopsq", "web"])
        assert f"LOOPSQ_API_TOKEN_FILE={data / 'api.token'}".encode() in environ_of(web.pid)
        deadline = time.monotonic() + 30
        while True:  # the web app took the token from its file
            try:
                import httpx

                if httpx.get(f"http://127.0.0.1:{port}/api/loops",
                             headers={"Authorization": f"Bearer {token}"}).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, up.text()
            time.sleep(0.2)
        assert up.stop() == 0, up.text()
    finally:
        kill_tree(up.proc.pid)
