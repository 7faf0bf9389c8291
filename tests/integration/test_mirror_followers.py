"""One mirror follower per data dir, with real processes: a second ``loopsq mirror`` (or one beside a ``loopsq web``
that follows) is refused with one line naming the process that follows, and exits 1; a ``loopsq web`` beside a
``loopsq mirror`` serves reads without following; ``loopsq up`` refuses a data dir another process follows; a
kill -9 of the follower frees the data dir at once. Never two consumers in one group."""

from __future__ import annotations

import re
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loopsq.state.keys import Keys
from tests.integration.processes import Cluster, Proc, open_cluster
from tests.redis_server import RedisServer, free_port

pytestmark = pytest.mark.integration
KEYS = Keys()
TOKEN = "followers-test-token-0123456789"


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def data_dir(cluster: Cluster) -> Path:
    return Path(cluster.env["LOOPSQ_DATA_DIR"])


def start_mirror(cluster: Cluster, name: str = "mirror", env: dict[str, str] | None = None) -> Proc:
    proc = cluster.start("mirror", name=name, env=env, wait=False)
    cluster.wait_until(lambda: "following " in proc.text() or not proc.alive(), 30, f"{name} to follow")
    assert proc.alive(), proc.text()
    return proc


class Web:
    """A ``loopsq web`` process on a free port, and an HTTP client for it."""

    def __init__(self, cluster: Cluster, *args: str) -> None:
        port = free_port()
        log = cluster.tmp / "web.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", "loopsq", "web", "--port", str(port), "--no-rq-dashboard", *args],
                env={**cluster.env, "LOOPSQ_API_TOKEN": TOKEN}, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=cluster.tmp)
        self.proc = Proc("web", popen, log)
        cluster.procs.append(self.proc)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"},
                                 timeout=30)
        cluster.wait_until(lambda: self.answers() or not self.proc.alive(), 30, "the web app to answer")
        assert self.proc.alive(), self.proc.text()

    def answers(self) -> bool:
        try:
            return self.http.get("/api/health").status_code == 200
        except httpx.TransportError:
            return False

    def loop_names(self) -> list[str]:
        response = self.http.get("/api/loops")
        assert response.status_code == 200, response.text
        return sorted(loop["name"] for loop in response.json()["items"])


def groups(cluster: Cluster) -> dict[str, list[str]]:
    """Every consumer group of the change stream with its consumers' names."""
    out: dict[str, list[str]] = {}
    for group in cluster.client.xinfo_groups(KEYS.changes):
        out[group["name"]] = sorted(str(c["name"]) for c in cluster.client.xinfo_consumers(KEYS.changes,
                                                                                             group["name"]))
    return out


def refusal(cluster: Cluster, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    done = cluster.cli(*args, check=False, env=env, timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_a_second_loopsq_mirror_on_a_data_dir_is_refused_naming_the_first_and_a_kill_9_frees_it(
    cluster: Cluster,
) -> None:
    first = start_mirror(cluster)
    data = data_dir(cluster)
    assert refusal(cluster, "mirror") == (
        1, "", f"error: another mirror follows {data} (pid {first.pid}, loopsq mirror); stop it, or use another "
               "--data-dir\n")
    assert (data / "mirror.lock").read_text() == f"{first.pid} loopsq mirror\n"
    first.kill9()  # no cleanup at all: the kernel drops its lock
    second = start_mirror(cluster, "mirror2")
    assert (data / "mirror.lock").read_text() == f"{second.pid} loopsq mirror\n"
    cluster.create("after", "true", "--every", "1h")
    cluster.wait_until(lambda: any(groups(cluster).values()), 20, "the mirror to read")
    (consumers,) = groups(cluster).values()
    assert len(consumers) == 1


def test_a_loopsq_mirror_beside_a_web_app_that_follows_is_refused_naming_the_web_app(cluster: Cluster) -> None:
    web = Web(cluster)
    cluster.wait_until(lambda: "mirror follower: redis://" in web.proc.text(), 30, "the web app to follow")
    data = data_dir(cluster)
    assert refusal(cluster, "mirror") == (
        1, "", f"error: another mirror follows {data} (pid {web.proc.pid}, loopsq web); stop it or restart it with "
               "--no-mirror, or use another --data-dir\n")
    # up would run a mirror there too: it refuses before it starts anything.
    assert refusal(cluster, "up", "--no-web", "--workers", "1") == (
        1, "", f"error: another mirror follows {data} (pid {web.proc.pid}, loopsq web); stop it or restart it with "
               "--no-mirror, or use another --data-dir\n")
    # A web app that does not follow leaves the data dir to a loopsq mirror.
    web.proc.terminate()
    Web(cluster, "--no-mirror")
    start_mirror(cluster)


def test_a_web_app_beside_a_loopsq_mirror_serves_reads_without_following_it(cluster: Cluster) -> None:
    mirror = start_mirror(cluster)
    cluster.create("before", "true", "--every", "1h")
    web = Web(cluster)
    data = data_dir(cluster)
    line = (f"[loopsq-web] mirror follower: not following the change stream: another mirror follows {data} "
            f"(pid {mirror.pid}, loopsq mirror); reads here still catch up from Redis")
    assert web.loop_names() == ["before"]
    cluster.create("after", "true", "--every", "1h")
    assert web.loop_names() == ["after", "before"]  # read-your-writes without a follower of its own
    lines = web.proc.text().splitlines()
    assert lines.count(line) == 1, web.proc.text()
    assert not any("mirror follower: redis://" in text for text in lines)
    consumer = cluster.env.get("LOOPSQ_HOST") or socket.gethostname()
    cluster.wait_until(lambda: list(groups(cluster).values()) == [[consumer]], 20,
                       "one group with the mirror's one consumer")
    # With the mirror gone, the web app still answers reads from Redis's changes.
    mirror.kill9()
    cluster.create("later", "true", "--every", "1h")
    assert web.loop_names() == ["after", "before", "later"]


# -- the group's name -----------------------------------------------------------------------------------------


def group_of(proc: Proc) -> str:
    """The group a mirror process announced (``following <url> as <group> into <path>``)."""
    match = re.search(r"following \S+ as (mirror:\S+) into ", proc.text())
    assert match, proc.text()
    return match.group(1)


def _id(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq)


def test_a_mirror_restarted_on_its_data_dir_under_another_host_name_resumes_its_group(cluster: Cluster) -> None:
    first = start_mirror(cluster, env={"LOOPSQ_HOST": "dyno-a"})
    group = group_of(first)
    cluster.create("a", "true", "--every", "1h")
    cluster.wait_until(lambda: groups(cluster) == {group: ["dyno-a"]}, 20, "dyno-a to read")
    first.kill9()  # a dyno restarted with its disk comes back under another host name
    second = start_mirror(cluster, "mirror2", env={"LOOPSQ_HOST": "dyno-b"})
    assert group_of(second) == group
    cluster.create("b", "true", "--every", "1h")
    cluster.wait_until(lambda: groups(cluster) == {group: ["dyno-b"]}, 20, "the one group, read by dyno-b alone")
    assert re.search(rf"^\[loopsq-mirror\] mirror group {group}: removed consumer dyno-a left by an earlier "
                     r"follower of this data dir \(0 pending, idle \d+s\)$", second.text(), re.MULTILINE)
    second.terminate()
    third = start_mirror(cluster, "mirror3", env={"LOOPSQ_MIRROR_NAME": "archive"})
    assert group_of(third) == "mirror:archive"


@pytest.mark.timeout(120)
def test_a_mirror_on_a_new_disk_makes_a_new_group_and_the_old_one_stops_holding_the_stream_then_goes(
    cluster: Cluster,
) -> None:
    cluster.start("scheduler", env={"LOOPSQ_MIRROR_IDLE": "2s"})
    old = start_mirror(cluster, env={"LOOPSQ_DATA_DIR": str(cluster.tmp / "disk-1")})
    old_group = group_of(old)
    cluster.create_fast("first", "true", 3_600_000)
    cluster.wait_until(lambda: groups(cluster).get(old_group), 20, "the old mirror to read")
    old.kill9()  # the dyno goes, and its ephemeral disk with it
    new = start_mirror(cluster, "mirror2", env={"LOOPSQ_DATA_DIR": str(cluster.tmp / "disk-2")})
    new_group = group_of(new)
    assert new_group != old_group
    (old_read,) = [str(g["last-delivered-id"]) for g in cluster.client.xinfo_groups(KEYS.changes)
                   if g["name"] == old_group]
    for i in range(150):
        cluster.create_fast(f"l{i}", "true", 3_600_000)

    def trimmed_past_the_old_group() -> bool:
        first = cluster.client.xrange(KEYS.changes, count=1)
        return bool(first) and _id(first[0][0]) > _id(old_read)

    cluster.wait_until(trimmed_past_the_old_group, 30, "the stream trimmed past what the old group read")
    db = cluster.tmp / "disk-2" / "loops.db"

    def mirrored() -> int:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM loops").fetchone()[0])

    cluster.wait_until(lambda: mirrored() == 151, 20, "the new mirror to hold every loop")
    # Silent for 7 times LOOPSQ_MIRROR_IDLE, the old group is removed; the new one stays.
    cluster.wait_until(lambda: set(groups(cluster)) == {new_group}, 30, "the old group to be removed")
