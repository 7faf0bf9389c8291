"""Backpressure made visible, on real processes: two ``loopsq worker`` processes with different labels and slots
(``LOOPSQ_WORKER_LABELS=gpu`` with ``LOOPSQ_WORKER_CONCURRENCY=3``; none with 2), runs waiting on a queue no
worker serves (their loop requires ``nvme``) and on one whose only worker has every slot busy, and a timer past its
time with no scheduler to move it; then what ``loopsq status``, ``loopsq doctor``, the dashboard's ``/fleet`` and
``/metrics`` say about them.

The scene is set once for the module (its runs hold the GPU worker's slots for minutes); every test only reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from loopsq.engine import fleet, routing, timers
from loopsq.web import WebSettings, create_app
from tests.integration.processes import KEYS, Cluster, open_cluster
from tests.integration.test_web_api import AUTH, TOKEN
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GPU_SLOTS, PLAIN_SLOTS = 3, 2
TRAINS = [f"train{i}" for i in range(GPU_SLOTS + 1)]  # one more than the GPU worker holds: one waits


@dataclass
class Scene:
    cluster: Cluster
    gpu: str
    plain: str
    index_id: str

    def snapshot(self) -> fleet.FleetSnapshot:
        return fleet.read_fleet(self.cluster.client, KEYS)

    def queue(self, name: str) -> fleet.FleetQueue:
        return next(q for q in self.snapshot().queues if q.name == name)


def require(cluster: Cluster, name: str, *labels: str) -> str:
    """Give loop ``name`` a requirement set, as a stored loop with ``requires`` has it; returns its id."""
    data = cluster.loop(name)
    data["requires"] = list(labels)
    cluster.client.set(KEYS.loop(data["id"]), json.dumps(data))
    return str(data["id"])


@pytest.fixture(scope="module")
def scene(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    for cluster in open_cluster(redis_server.url, tmp_path_factory.mktemp("fleet")):
        for name in TRAINS:
            cluster.create(name, "sleep 120", "--every", "1h")
        cluster.create("index", "echo indexed", "--every", "1h")
        trains = [require(cluster, name, "gpu") for name in TRAINS]
        index_id = require(cluster, "index", "nvme")
        gpu = cluster.start("worker", name="worker-gpu", env={"LOOPSQ_WORKER_LABELS": "gpu",
                                                               "LOOPSQ_WORKER_CONCURRENCY": str(GPU_SLOTS)})
        plain = cluster.start("worker", name="worker-plain", env={"LOOPSQ_WORKER_CONCURRENCY": str(PLAIN_SLOTS)})
        for loop_id in trains:
            routing.enqueue_for_loop(cluster.client, KEYS, loop_id, "worker.jobs.run_now", loop_id, f"req-{loop_id}")
        routing.enqueue_for_loop(cluster.client, KEYS, index_id, "worker.jobs.run_now", index_id, "req-index")
        # No scheduler runs: a timer 30 s past its time stays armed, overdue.
        timers.arm(timers.raw_from(cluster.client), KEYS, index_id, datetime.now(UTC) - timedelta(seconds=30))
        scene = Scene(cluster, cluster.worker_id(gpu), cluster.worker_id(plain), index_id)

        def settled(scene: Scene = scene) -> bool:
            snap = scene.snapshot()
            busy = {w.id: w.busy for w in snap.workers}
            waiting = {q.name: (q.depth, q.oldest_age_ms or 0) for q in snap.queues}
            return (busy == {scene.gpu: GPU_SLOTS, scene.plain: 0} and waiting.get("loopsq+gpu", (0, 0)) >= (1, 2000)
                    and waiting.get("loopsq+nvme", (0, 0)) >= (1, 2000))

        cluster.wait_until(settled, 60, "the GPU worker's slots full, a run waiting behind them and one on nvme")
        yield scene


def lines_of(text: str) -> list[str]:
    return text.splitlines()


def head(status: str, check_id: str) -> str:
    """A pattern for the start of a doctor line: its status and check id, padded as doctor pads them."""
    return re.escape(f"{status:<4} {check_id:<22} ")


def test_status_shows_each_workers_busy_slots_and_labels_and_marks_the_unserved_queue(scene: Scene) -> None:
    out = scene.cluster.cli("status").stdout
    labels = {w.id: ",".join(w.labels) for w in scene.snapshot().workers}
    assert "gpu" in labels[scene.gpu].split(",") and "gpu" not in labels[scene.plain].split(",")
    fleet_part = lines_of(out)[lines_of(out).index("fleet: 2 worker(s), 3/5 slots busy"):]
    assert fleet_part[1:3] == sorted([f"  worker {scene.gpu}  busy=3/3  labels={labels[scene.gpu]}",
                                      f"  worker {scene.plain}  busy=0/2  labels={labels[scene.plain]}"])
    assert fleet_part[3] == "  queue loopsq  depth=0"
    assert re.fullmatch(r"  queue loopsq\+gpu  depth=1  oldest=\d+s", fleet_part[4]), fleet_part[4]
    assert re.fullmatch(r"  queue loopsq\+nvme  depth=1  oldest=\d+s  unserved: no live worker has labels nvme",
                        fleet_part[5]), fleet_part[5]
    assert re.fullmatch(r"timers overdue: 1 \(oldest \d+s late\)", fleet_part[6]), fleet_part[6]
    assert len(fleet_part) == 7
    # The lines before the fleet part are the ones status always printed.
    assert lines_of(out)[0] == "schedulers: 0" and "workers: 2" in lines_of(out)


def test_status_json_carries_the_fleet(scene: Scene) -> None:
    report = json.loads(scene.cluster.cli("--json", "status").stdout)
    data = report["fleet"]
    assert (data["capacity"], data["busy"]) == (5, 3)
    queues = {q["name"]: q for q in data["queues"]}
    assert {k: queues["loopsq+nvme"][k] for k in ("labels", "depth", "unserved", "missing", "servedBy")} == {
        "labels": ["nvme"], "depth": 1, "unserved": True, "missing": ["nvme"], "servedBy": []}
    assert queues["loopsq+gpu"]["servedBy"] == [scene.gpu] and queues["loopsq+gpu"]["oldestAgeMs"] >= 2000
    assert data["timers"]["overdue"] == 1 and data["timers"]["oldestLateMs"] >= 30_000
    assert report["queueDepth"] == 0  # the base queue's, as before


def test_doctor_fails_on_the_queue_no_live_worker_serves_naming_the_labels(scene: Scene) -> None:
    done = scene.cluster.cli("doctor", check=False)
    assert done.returncode == 1, done.stdout
    fails = [line for line in lines_of(done.stdout) if line.startswith("fail")]
    assert len(fails) == 1, done.stdout
    assert re.fullmatch(head("fail", "queue:loopsq+nvme") + r"no live worker has labels nvme "
                        r"\(1 run\(s\) waiting, oldest \d+s; needed by active loop\(s\): index\)", fails[0]), fails[0]
    by_id = {line.split()[1]: line for line in lines_of(done.stdout)}
    assert re.fullmatch(head("ok", "queue:loopsq+gpu") + r"1 run\(s\) waiting, oldest \d+s "
                        r"\(3 of 3 slots busy on the 1 live worker\(s\) serving it\)", by_id["queue:loopsq+gpu"])
    assert by_id["queue:loopsq"] == (
        "ok   queue:loopsq           0 run(s) waiting (3 of 5 slots busy on the 2 live worker(s) serving it)")
    assert re.fullmatch(head("warn", "timers") + r"1 armed timer\(s\) past their time, the oldest by \d+s: "
                        r"is a scheduler running\?", by_id["timers"])
    report = json.loads(scene.cluster.cli("--json", "doctor", check=False).stdout)
    check = next(c for c in report["checks"] if c["id"] == "queue:loopsq+nvme")
    assert (report["ok"], check["status"], check["message"]) == (False, "fail", "no live worker has labels nvme")


def test_doctor_warns_when_the_oldest_waiting_run_is_older_than_loopsq_queue_age_warn(scene: Scene) -> None:
    done = scene.cluster.cli("doctor", check=False, env={"LOOPSQ_QUEUE_AGE_WARN": "1s"})
    by_id = {line.split()[1]: line for line in lines_of(done.stdout)}
    assert re.fullmatch(head("warn", "queue:loopsq+gpu") + r"oldest waiting run has waited \d+s, over "
                        r"LOOPSQ_QUEUE_AGE_WARN=1s \(1 run\(s\) waiting; 3 of 3 slots busy on the 1 live worker\(s\) "
                        r"serving it\)", by_id["queue:loopsq+gpu"]), by_id["queue:loopsq+gpu"]
    assert by_id["queue:loopsq+nvme"].startswith("fail ")  # unserved: it fails, and is not warned of twice
    assert done.returncode == 1


def test_a_bad_loopsq_queue_age_warn_is_bad_input_and_checks_nothing(scene: Scene) -> None:
    done = scene.cluster.cli("doctor", check=False, env={"LOOPSQ_QUEUE_AGE_WARN": "soon"})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "error: LOOPSQ_QUEUE_AGE_WARN must be a duration greater than zero such as 60s, got 'soon'\n"


@pytest.fixture(scope="module")
def web(scene: Scene, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = WebSettings(redis_url=scene.cluster.url, data_dir=tmp_path_factory.mktemp("web"), token=TOKEN,
                           follow_mirror=False, rq_dashboard=False)
    with TestClient(create_app(settings), headers={**AUTH, "Accept": "text/html"}) as client:
        yield client


def test_the_fleet_page_shows_the_workers_slots_and_warns_of_the_unserved_queue(scene: Scene, web: TestClient) -> None:
    page = web.get("/fleet").text
    assert '<p id="fleet-summary">3 of 5 slots busy on 2 live worker(s).</p>' in page
    assert f'<tr data-worker="{scene.gpu}" data-busy="3" data-slots="3">' in page
    assert f'<tr data-worker="{scene.plain}" data-busy="0" data-slots="2">' in page
    rows = re.findall(r'<tr data-queue="([^"]+)" data-depth="(\d+)" data-unserved="(\w+)">', page)
    assert rows == [("loopsq", "0", "false"), ("loopsq+gpu", "1", "false"), ("loopsq+nvme", "1", "true")]
    assert '<span class="error why">no live worker has labels nvme</span>' in page
    assert 'id="unserved-warning"' in page
    assert re.search(r'<dd id="timers-overdue" class="error">1 \(the oldest \d+s late: is a scheduler running\?\)</dd>',
                     page)


def test_metrics_show_slots_queues_and_overdue_timers(scene: Scene, web: TestClient) -> None:
    text = web.get("/metrics", headers={"Accept": "text/plain"}).text
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(text) for s in family.samples}
    assert got[("loopsq_worker_slots", (("worker", scene.gpu),))] == 3
    assert got[("loopsq_worker_slots_busy", (("worker", scene.gpu),))] == 3
    assert got[("loopsq_worker_slots", (("worker", scene.plain),))] == 2
    assert got[("loopsq_worker_slots_busy", (("worker", scene.plain),))] == 0
    assert (got[("loopsq_fleet_slots", ())], got[("loopsq_fleet_slots_busy", ())]) == (5, 3)
    depth = {dict(k[1])["queue"]: v for k, v in got.items() if k[0] == "loopsq_queue_depth"}
    unserved = {dict(k[1])["queue"]: v for k, v in got.items() if k[0] == "loopsq_queue_unserved"}
    oldest = {dict(k[1])["queue"]: v for k, v in got.items() if k[0] == "loopsq_queue_oldest_age_seconds"}
    assert depth == {"loopsq": 0, "loopsq+gpu": 1, "loopsq+nvme": 1}
    assert unserved == {"loopsq": 0, "loopsq+gpu": 0, "loopsq+nvme": 1}
    assert oldest["loopsq"] == 0 and oldest["loopsq+gpu"] >= 2 and oldest["loopsq+nvme"] >= 2
    assert got[("loopsq_timers_overdue", ())] == 1


def test_the_fleet_page_shows_each_pool_with_its_holders_and_waiters(scene: Scene, web: TestClient) -> None:
    from loopsq.state.pools import PoolStore

    assert 'id="no-pools"' in web.get("/fleet").text
    pools = PoolStore(scene.cluster.client, KEYS)
    pools.set("page-acct", 1)
    pools.acquire("page-acct", "holder-one", 10_000)
    pools.acquire("page-acct", "waiter-two", 10_000)
    try:
        page = web.get("/fleet").text
        assert '<tr data-pool="page-acct" data-holders="1" data-waiters="1">' in page
        assert "holder-one" in page and "waiter-two" in page
    finally:
        pools.delete("page-acct")
