"""A worker stopped by SIGTERM leaves no ``/tmp/loopsq-control-<pid>-*`` directory behind: not when it was idle
after runs, not when a run was still going (its grace ends, the run is handed on, the process exits)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def control_dirs(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"loopsq-control-{pid}-*"))


@pytest.mark.timeout(60)
def test_sigterm_during_a_run_removes_the_worker_s_control_directory(cluster: Cluster) -> None:
    cluster.create("slow", 'touch "$LOOPS_CONTROL_FILE.started"; sleep 30', "--every", "1h")
    worker = cluster.start("worker")
    cluster.cli("trigger", "slow")
    cluster.wait_until(lambda: next((p for d in control_dirs(worker.pid) for p in d.iterdir()), None), 20,
                       "the run to start in the worker's control directory")
    [private] = control_dirs(worker.pid)
    assert worker.terminate() == 0
    assert not private.exists()
    assert control_dirs(worker.pid) == []
