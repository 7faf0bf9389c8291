"""Cancelling a running loop run (``loopsq cancel``, the API, the SDK) with a real worker: the process group is
killed within a second, the run is recorded failed with the reason and never retried; a workflow loop's run
cancels its workflow run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from loopsq.domain.run_rules import LoopRun
from loopsq.sdk import LoopsClient
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.system.procs import is_process_alive
from loopsq.web import WebSettings, create_app
from tests.integration.processes import KEYS, Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

TOKEN = "test-token-0123456789abcdef"


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def _running(cluster: Cluster, name: str) -> LoopRun:
    return cluster.wait_until(lambda: (runs := cluster.runs(name)) and runs[0].pid and runs[0].status == "running"
                              and runs[0], 30, f"a run of {name} with its process")


def _gone_within(pid: int, seconds: float) -> float:
    start = time.monotonic()
    while is_process_alive(pid) and time.monotonic() - start < seconds + 1:
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.mark.timeout(90)
def test_cancel_kills_the_run_within_a_second_records_the_reason_and_never_retries(cluster: Cluster) -> None:
    cluster.create("slow", "sleep 30", "--at", "2020-01-01T00:00:00Z", "--attempts", "3", "--retry-delay", "1s")
    cluster.start_all(schedulers=1, workers=1)
    run = _running(cluster, "slow")
    assert run.pid is not None
    cancelling = subprocess.Popen([sys.executable, "-m", "loopsq", "cancel", run.id, "--reason", "not needed"],
                                  env=cluster.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL)
    cluster.wait_until(lambda: cluster.client.exists(KEYS.cancel(run.id)), 20, "the cancel request", every=0.005)
    # From the request in Redis to the end of the run's process: within a second.
    assert _gone_within(run.pid, 1.0) <= 1.0
    out, err = cancelling.communicate(timeout=20)
    assert (cancelling.returncode, out, err) == (0, f"{run.id} failed  cancelled by user: not needed\n", "")
    time.sleep(2.5)  # longer than the retry delay: no second attempt may come
    (final,) = cluster.runs("slow")
    assert (final.status, final.error, final.attempt) == ("failed", "cancelled by user: not needed", 1)
    assert cluster.loop("slow")["status"] == "stopped"
    again = cluster.cli("cancel", run.id, check=False)
    assert (again.returncode, again.stderr) == (2, f"error: run {run.id} is not running (failed)\n")
    missing = cluster.cli("cancel", "nope", check=False)
    assert (missing.returncode, missing.stderr) == (1, "error: run not found: nope\n")


@pytest.mark.timeout(90)
def test_cancelling_a_workflow_loops_run_cancels_its_workflow_run(cluster: Cluster) -> None:
    spec = {"name": "flow", "steps": [{"id": "wait", "target": {"type": "command", "command": "sleep 30",
                                                                  "shell": True}}]}
    path = cluster.tmp / "flow.json"
    path.write_text(json.dumps(spec))
    cluster.cli("workflows", "create", str(path))
    cluster.cli("create", "workflow", "wfloop", "--workflow", "flow", "--at", "2020-01-01T00:00:00Z")
    cluster.start_all(schedulers=1, workers=1)
    store = WorkflowRunStore(cluster.client)
    loop_run = cluster.wait_until(lambda: (runs := cluster.runs("wfloop")) and runs[0], 30, "the loop run")
    state = cluster.wait_until(
        lambda: (ids := store.for_loop_run(loop_run.id)) and (s := store.load(ids[0])) and s.steps["wait"].get("pid")
        and s, 30, "the step's process")
    pid = int(state.steps["wait"]["pid"])
    assert cluster.cli("cancel", loop_run.id).stdout == f"{loop_run.id} failed  cancelled by user\n"
    assert _gone_within(pid, 1.0) <= 1.5
    wf = store.require(state.run_id)
    assert (wf.run["status"], wf.run["error"]) == ("cancelled", "cancelled by user")
    assert wf.steps["wait"]["status"] == "cancelled"
    final = cluster.run(loop_run.id)
    assert final is not None and (final.status, final.error) == ("failed", "cancelled by user")


@pytest.mark.timeout(90)
def test_the_api_and_the_sdk_cancel_a_run(cluster: Cluster, redis_server: RedisServer, tmp_path: Path) -> None:
    cluster.create("api-slow", "sleep 30", "--at", "2020-01-01T00:00:00Z")
    cluster.create("sdk-slow", "sleep 30", "--at", "2020-01-01T00:00:00Z")
    cluster.start_all(schedulers=1, workers=2)
    by_api, by_sdk = _running(cluster, "api-slow"), _running(cluster, "sdk-slow")
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "web", token=TOKEN, follow_mirror=False)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        response = client.post(f"/api/runs/{by_api.id}/cancel", json={"reason": "from the API"})
        assert response.status_code == 202
        assert (response.json()["id"], response.json()["status"]) == (by_api.id, "running")
        missing = client.post("/api/runs/nope/cancel")
        assert (missing.status_code, missing.json()["error"]["message"]) == (404, "run not found: nope")
    LoopsClient(redis_server.url).cancel_run(by_sdk.id, "from the SDK")
    for run, reason in ((by_api, "from the API"), (by_sdk, "from the SDK")):
        final = cluster.wait_until(lambda r=run: (f := cluster.run(r.id)) and f.terminal and f, 10, "the cancel")
        assert (final.status, final.error) == ("failed", f"cancelled by user: {reason}")
    assert not cluster.client.exists(KEYS.cancel("nope"))
