"""Two deployments on ONE Redis database (#31.6), namespaces ``a`` and ``b``, the same loop names in each, a
scheduler and a worker each: each loop runs only in its own deployment, ``list`` shows only its own loops, removing
a loop in one leaves the other's, and ``doctor``'s memory figure for ``a`` counts ``a``'s keys only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def _deployment(cluster: Cluster, ns: str) -> dict[str, str]:
    """The environment of deployment ``ns``: its namespace and a data dir of its own (its mirror is its own)."""
    return {"LOOPSQ_NAMESPACE": ns, "LOOPSQ_DATA_DIR": str(cluster.tmp / f"data-{ns}")}


def _ledger(cluster: Cluster, ns: str) -> list[str]:
    path = cluster.tmp / f"ledger-{ns}"
    return path.read_text().split() if path.exists() else []


def _names(cluster: Cluster, ns: str) -> set[str]:
    listed = json.loads(cluster.cli("--namespace", ns, "--json", "list", env=_deployment(cluster, ns)).stdout)
    rows = listed if isinstance(listed, list) else listed.get("loops", [])
    return {str(row["name"]) for row in rows}


@pytest.mark.timeout(300)
def test_two_namespaces_share_one_redis_without_crosstalk(cluster: Cluster) -> None:
    for ns in ("a", "b"):
        # Which deployment's worker ran a command: its environment says (DEPLOYMENT), not the loop.
        env = {**_deployment(cluster, ns), "DEPLOYMENT": ns}
        cluster.start("scheduler", name=f"scheduler-{ns}", env=env)
        cluster.start("worker", name=f"worker-{ns}", env=env)
        # The same name in both; ``a`` by the flag, ``b`` by the environment.
        args = ("--namespace", "a") if ns == "a" else ()
        cluster.cli(*args, "create", "command", "tick", "--every", "1s",
                    "--cmd", f'echo "$DEPLOYMENT" >> {cluster.tmp}/ledger-{ns}', env=_deployment(cluster, ns))
    cluster.cli("--namespace", "a", "create", "command", "only-a", "--every", "1h", "--cmd", "true",
                env=_deployment(cluster, "a"))

    cluster.wait_until(lambda: len(_ledger(cluster, "a")) >= 3 and len(_ledger(cluster, "b")) >= 3, 60,
                       "both deployments' tick to run three times")
    assert set(_ledger(cluster, "a")) == {"a"} and set(_ledger(cluster, "b")) == {"b"}
    assert _names(cluster, "a") == {"tick", "only-a"} and _names(cluster, "b") == {"tick"}
    # Each deployment's RQ queue and timer set are its own; the default namespace's stay unused.
    queues = {str(q) for q in cluster.client.smembers("rq:queues")}
    assert {"rq:queue:a", "rq:queue:b"} <= queues and "rq:queue:loopsq" not in queues, queues
    assert cluster.client.zcard("a:timers") >= 1 and cluster.client.zcard("b:timers") >= 1
    assert not cluster.client.exists("rq:scheduler:scheduled_jobs", "loopsq:meta")

    cluster.cli("--namespace", "a", "remove", "tick", env=_deployment(cluster, "a"))
    assert _names(cluster, "a") == {"only-a"} and _names(cluster, "b") == {"tick"}
    seen = len(_ledger(cluster, "b"))
    cluster.wait_until(lambda: len(_ledger(cluster, "b")) >= seen + 2, 30, "b's tick to go on running")

    # Nothing changes the keys while they are counted. (A generous wait: an RQ worker on redis-py 8 may take up to
    # a minute to leave, its pub/sub thread waiting out RQ's 60 s sleep_time.)
    for proc in cluster.procs:
        proc.sigterm()
    for proc in cluster.procs:
        proc.terminate(timeout=90)
    a_keys = list(cluster.client.scan_iter(match="a:*", count=1000))
    b_keys = list(cluster.client.scan_iter(match="b:*", count=1000))
    assert a_keys and b_keys
    report = json.loads(cluster.cli("--namespace", "a", "--json", "status",
                                     env=_deployment(cluster, "a")).stdout)["redisMemory"]
    expected = sum(int(cluster.client.memory_usage(k, samples=0) or 0) for k in a_keys)
    assert (report["namespace"], report["namespaceKeys"], report["namespaceBytes"], report["namespaceComplete"]) == (
        "a", len(a_keys), expected, True)
    doctor = json.loads(cluster.cli("--namespace", "a", "--json", "doctor", check=False,
                                     env=_deployment(cluster, "a")).stdout)
    memory = next(c for c in doctor["checks"] if c["id"] == "redis-memory")
    assert "namespace a: " in memory["message"] and f" in {len(a_keys)} keys; " in memory["message"], memory
