"""Signals to the long-running processes (``system.signals``): SIGUSR2 prints every thread's stack to the log and
the process goes on; SIGTERM, acted on by a thread of its own, then stops it cleanly."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("role", ["scheduler", "worker"])
def test_sigusr2_dumps_every_threads_stack_and_the_process_goes_on_then_sigterm_stops_it(
    cluster: Cluster, role: str
) -> None:
    proc = cluster.start(role)
    proc.popen.send_signal(signal.SIGUSR2)
    cluster.wait_until(lambda: "Current thread 0x" in proc.text(), 20, f"the {role}'s stack dump")
    text = proc.text()
    assert "Thread 0x" in text and "(most recent call first)" in text
    assert proc.alive()
    assert proc.terminate(timeout=30) == 0, proc.text()
    assert proc.text().rstrip().endswith(f"[loopsq-{role}] stopped"), proc.text()[-2000:]
