"""Loops whose workspace names look like each other's Redis keys (``X`` and ``X:fence``, ``X:queue``, ``*``, ``{}``)
run side by side on real workers: each holds a lease of its own, none crashes in the worker or stays ``running``.
Before names were encoded in keys, ``X:fence``'s lease was ``X``'s fence counter (``ValueError`` in the worker) and
``X:queue``'s lease was ``X``'s wait queue (``WRONGTYPE``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import KEYS, Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

#: loop name -> its workspace. x1 and x2 share X and wait for each other (overlap allow), so X's queue is used.
WORKSPACES = {"x1": "X", "x2": "X", "fence": "X:fence", "queue": "X:queue", "star": "*", "braces": "{}"}
ALONE = ["fence", "queue", "star", "braces"]


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


@pytest.mark.timeout(120)
def test_loops_on_workspaces_named_like_each_others_keys_run_side_by_side_each_with_its_own_lease(
        cluster: Cluster) -> None:
    for name, workspace in WORKSPACES.items():
        if name in ALONE:
            cluster.create(name, "sleep 0.9", "--every", "1s", "--workspace", workspace)
        else:
            cluster.create(name, "sleep 0.3", "--every", "1s", "--workspace", workspace, "--overlap", "allow",
                           "--workspace-wait", "10s")
    workers = cluster.start_all(schedulers=1, workers=2)[1:]
    ids = {name: cluster.loop(name)["id"] for name in WORKSPACES}

    def holders() -> dict[str, str] | None:
        """The loop holding each workspace, when every one of them is held at once."""
        found = {}
        for workspace in set(WORKSPACES.values()):
            value = cluster.client.get(KEYS.workspace(workspace))
            if value is None:
                return None
            run = cluster.run(str(value).split("|", 1)[0])
            assert run is not None and run.workspace == workspace, (workspace, value, run)
            found[workspace] = run.loop_id
        return found

    held = cluster.wait_until(holders, 30, "every workspace held at once")
    assert held["X:fence"] == ids["fence"] and held["X:queue"] == ids["queue"]
    assert held["*"] == ids["star"] and held["{}"] == ids["braces"] and held["X"] in (ids["x1"], ids["x2"])
    cluster.wait_until(lambda: all(sum(r.status == "succeeded" for r in cluster.runs(n)) >= 3 for n in WORKSPACES),
                       60, "three runs of each loop")
    for name in WORKSPACES:
        cluster.cli("pause", name)
    cluster.wait_until(lambda: not any(r.status == "running" for n in WORKSPACES for r in cluster.runs(n)), 20,
                       "every run to end")
    for name, workspace in WORKSPACES.items():
        runs = cluster.runs(name)
        assert {r.status for r in runs} <= {"succeeded", "skipped", "missed"}, [r.to_dict() for r in runs]
        succeeded = [r for r in runs if r.status == "succeeded"]
        assert {r.workspace for r in succeeded} == {workspace}
        if name in ALONE:  # nobody else's lease ever stood in its way
            assert not [r for r in runs if (r.error or "").startswith("workspace busy")], name
            fences = [r.workspace_fence for r in sorted(succeeded, key=lambda r: r.started_at or "")]
            assert fences == list(range(1, len(fences) + 1)), (name, fences)
    shared = sorted(r.workspace_fence or 0 for n in ("x1", "x2") for r in cluster.runs(n) if r.status == "succeeded")
    assert shared == list(range(1, len(shared) + 1))  # one fence per acquisition of X, whichever loop took it
    assert cluster.client.get("loopsq:workspace:X%3Afence:fence") == str(len(
        [r for r in cluster.runs("fence") if r.status == "succeeded"]))
    for proc in workers:
        assert proc.alive()
        for word in ("Traceback", "WRONGTYPE", "ValueError"):
            assert word not in proc.text(), proc.text()[-4000:]
    assert json.loads(cluster.cli("show", "fence").stdout)["workspace"] == "X:fence"
