"""Placement by labels on real processes: each run lands only on a worker whose labels satisfy its loop's
``requires``, through RQ's own queues; a requirement set created while the workers run is served; a run nobody
can take waits and says so."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def labelled(labels: str) -> dict[str, str]:
    return {"LOOPSQ_WORKER_LABELS": labels, "LOOPSQ_WORKER_CONCURRENCY": "2"}


def ran_on(cluster: Cluster, name: str) -> set[str]:
    return {str(r.worker_id) for r in cluster.runs(name) if r.status == "succeeded"}


@pytest.mark.timeout(120)
def test_runs_land_only_on_workers_whose_labels_satisfy_their_loop_and_a_new_requirement_set_is_served(
    cluster: Cluster
) -> None:
    gpu = cluster.start("worker", name="gpu", env=labelled("gpu"))
    web = cluster.start("worker", name="web", env=labelled("repo:web"))
    plain = cluster.start("worker", name="plain", env=labelled(""))
    ids = {name: cluster.worker_id(proc) for name, proc in (("gpu", gpu), ("web", web), ("plain", plain))}
    cluster.start("scheduler")
    cluster.create("train", cluster.ledger_cmd(), "--every", "1s", "--requires", "gpu")
    cluster.create("deploy", cluster.ledger_cmd(), "--every", "1s", "--requires", "repo:web")
    cluster.create("anywhere", cluster.ledger_cmd(), "--every", "1s")
    cluster.wait_until(lambda: all(len(ran_on(cluster, n)) >= 1 and len(cluster.runs(n)) >= 6
                                   for n in ("train", "deploy", "anywhere")), 60, "six runs of each loop")
    assert ran_on(cluster, "train") == {ids["gpu"]}
    assert ran_on(cluster, "deploy") == {ids["web"]}
    assert ran_on(cluster, "anywhere") <= set(ids.values())
    # Each worker listens on the queues its labels qualify it for, the most specific first.
    record = json.loads(str(cluster.client.get(f"loopsq:worker:{ids['gpu']}")))
    assert record["queues"] == ["loopsq+gpu", "loopsq"]
    assert "gpu" in record["labels"] and any(label.startswith("host:") for label in record["labels"])
    assert json.loads(str(cluster.client.get(f"loopsq:worker:{ids['plain']}")))["queues"] == ["loopsq"]
    # A requirement set that did not exist when the workers started: served by the one worker that has both.
    both = cluster.start("worker", name="both", env=labelled("gpu,repo:web"))
    cluster.create("fullstack", cluster.ledger_cmd(), "--every", "1s", "--requires", "gpu",
                   "--requires", "repo:web")
    cluster.wait_until(lambda: len(ran_on(cluster, "fullstack")) >= 1 and len(cluster.runs("fullstack")) >= 3, 30,
                       "the new requirement set's runs")
    assert ran_on(cluster, "fullstack") == {cluster.worker_id(both)}
    assert cluster.client.hexists("loopsq:queues", "loopsq+gpu+repo:web")


@pytest.mark.timeout(90)
def test_a_run_no_live_worker_can_take_waits_in_its_queue_and_run_now_names_the_labels(cluster: Cluster) -> None:
    cluster.start("worker", env=labelled("gpu"))
    cluster.create("render", "true", "--every", "1h", "--requires", "gpu", "--requires", "nvme")
    done = cluster.cli("run-now", "render", "--wait", "2", check=False)
    assert done.returncode == 1
    assert done.stderr == ("error: no worker picked up the run within 2s: no live worker has labels nvme; "
                           "the run waits in its queue (--local runs it here)\n")
    assert cluster.client.llen("rq:queue:loopsq+gpu+nvme") == 1
    # An agent loop needs its provider's CLI: with claude on no worker's PATH, its runs wait for one.
    bin_dir = cluster.tmp / "bin"
    bin_dir.mkdir()
    cluster.cli("create", "agent", "bot", "--provider", "claude", "--prompt", "hi", "--every", "1h")
    done = cluster.cli("run-now", "bot", "--wait", "2", check=False)
    assert done.returncode == 1
    assert "no live worker has labels provider:claude;" in done.stderr
    # A worker whose PATH has claude carries provider:claude and takes the waiting run.
    fake = bin_dir / "claude"
    fake.write_text("#!/bin/sh\necho '{\"type\":\"result\",\"result\":\"ok\"}'\n")
    fake.chmod(0o755)
    worker = cluster.start("worker", name="agents", env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    record = json.loads(str(cluster.client.get(f"loopsq:worker:{cluster.worker_id(worker)}")))
    assert "provider:claude" in record["labels"]
    cluster.wait_until(lambda: any(r.worker_id == cluster.worker_id(worker) for r in cluster.runs("bot")), 30,
                       "the waiting agent run to be taken by the worker that has claude")


@pytest.mark.timeout(90)
def test_a_trigger_another_service_enqueues_on_the_base_queue_still_runs_only_where_its_labels_are(
    cluster: Cluster
) -> None:
    from rq import Queue

    from loopsq.state.connection import client_for

    plain = cluster.start("worker", name="plain", env=labelled(""))
    gpu = cluster.start("worker", name="gpu", env=labelled("gpu"))
    cluster.create("train", cluster.ledger_cmd(), "--every", "1h", "--requires", "gpu")
    raw = client_for(cluster.url, decode_responses=False)
    try:
        queue = Queue("loopsq", connection=raw)
        for i in range(4):  # as the README's "Triggering runs from other services" shows
            queue.enqueue("worker.jobs.trigger", "train", idempotency_key=f"k{i}")
    finally:
        raw.close()
    cluster.wait_until(lambda: len([r for r in cluster.runs("train") if r.status == "succeeded"]) == 4, 30,
                       "the four triggered runs")
    assert ran_on(cluster, "train") == {cluster.worker_id(gpu)}
    assert cluster.worker_id(plain) not in ran_on(cluster, "train")
