"""A target cannot wedge its worker through its control file: whatever it leaves at ``$LOOPS_CONTROL_FILE`` (a FIFO,
a symlink, a directory, a socket, a device, a huge file), the run ends with a ``control file ignored: …`` warning,
the worker goes on running later runs, and it still stops on SIGTERM. Real targets on a real worker process."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.run_rules import LoopRun
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


SOCKET_CMD = (f'{sys.executable} -c "import os, socket; '
              "socket.socket(socket.AF_UNIX).bind(os.environ['LOOPS_CONTROL_FILE'])\"")

#: loop name -> (its command, the exact warning each of its runs must end with)
KINDS: dict[str, tuple[str, str]] = {
    "fifo": ('mkfifo "$LOOPS_CONTROL_FILE"', "control file ignored: not a regular file (fifo)"),
    "symlink": ('printf %s \'{"outcome":"done"}\' > done.json; ln -s "$PWD/done.json" "$LOOPS_CONTROL_FILE"',
                "control file ignored: not a regular file (symlink)"),
    "directory": ('mkdir "$LOOPS_CONTROL_FILE" && echo x > "$LOOPS_CONTROL_FILE/inside"',
                  "control file ignored: not a regular file (directory)"),
    "socket": (SOCKET_CMD, "control file ignored: not a regular file (socket)"),
    "huge": ('head -c 200000 /dev/zero | tr "\\0" " " > "$LOOPS_CONTROL_FILE"',
             "control file ignored: larger than 65536 bytes"),
}
if os.geteuid() == 0:  # mknod needs root; the worker must not even open the device
    KINDS["device"] = ('mknod "$LOOPS_CONTROL_FILE" c 1 3',
                       "control file ignored: not a regular file (character device)")


@pytest.mark.timeout(90)
def test_whatever_a_target_leaves_at_its_control_path_is_a_warning_and_the_worker_goes_on(
        cluster: Cluster) -> None:
    for name, (cmd, _warning) in KINDS.items():
        cluster.create(name, cmd, "--every", "1s")
    # A well-behaved loop on the same worker: its control file still applies after all of the above.
    cluster.create("fine", 'printf %s \'{"outcome":"no_op"}\' > "$LOOPS_CONTROL_FILE"', "--every", "1s")
    _scheduler, worker = cluster.start_all(schedulers=1, workers=1)

    def ran(name: str) -> list[LoopRun]:
        """The runs that executed (seven loops due every second on one worker: under load some slots are missed
        or skipped while the previous run is still active)."""
        runs = cluster.runs(name)
        others = {r.error for r in runs if r.status == "skipped"}
        assert others <= {"previous run still active"}, (name, others)
        return [r for r in runs if r.status in ("succeeded", "failed")]

    everything = [*KINDS, "fine"]
    cluster.wait_until(lambda: all(len(ran(n)) >= 3 for n in everything), 60, "three runs of each loop")
    for name, (_cmd, warning) in KINDS.items():
        runs = ran(name)
        assert {r.status for r in runs} == {"succeeded"}, (name, [r.to_dict() for r in runs])
        assert {r.control_warning for r in runs} == {warning}, name
        assert all(r.outcome is None and r.control is None for r in runs), name
        assert cluster.loop(name)["status"] == "active"  # the symlink's {"outcome":"done"} was never read
    fine = ran("fine")
    assert {(r.outcome, r.control_warning) for r in fine} == {("no_op", None)}
    # Once no run is in flight, whatever the targets left was removed (from the worker's own directory, the one
    # its runs are in), and nothing through the symlink.
    for name in everything:
        cluster.cli("pause", name)
    cluster.wait_until(lambda: not any(r.status == "running" for n in everything for r in cluster.runs(n)), 10,
                       "the runs in flight to end")
    private = list(Path(tempfile.gettempdir()).glob(f"loopsq-control-{worker.pid}-*"))
    assert len(private) == 1, private
    assert list(private[0].iterdir()) == []
    assert worker.terminate() == 0  # SIGTERM still stops it, promptly
    assert (cluster.tmp / "done.json").read_text() == '{"outcome":"done"}'
    assert not private[0].exists()  # removed at exit, with nothing left in it
