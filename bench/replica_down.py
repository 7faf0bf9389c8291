"""Runs per second on Sentinel with the replica up, then with it down: claims must not wait for a replica the
master does not have (``loopsq.state.durability``).

Run: ``.venv/bin/python bench/replica_down.py [--loops N] [--every-ms MS] [--workers W] [--window S]``.

A master, a replica and three sentinels on loopback (``tests.redis_server.SentinelGroup``), one ``loopsq
scheduler`` and W ``loopsq worker`` processes given the ``redis+sentinel://`` URL, N loops (command ``true``,
fixed rate every MS). Once every loop has run, the slots run in a window of S seconds are counted (by their
scheduled time, once they have finished); then the replica is killed (SIGKILL), and after the episode's hold
(``CONFIRM_S``, paid once per episode and process) the same window is counted again. Prints both rates, their
ratio (goal >= 0.8), the ``WAIT`` calls the master answered in each window, and what the replica check costs: one
``INFO replication`` round trip per process at most every ``REFRESH_S``.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loopsq.domain.timeutil import from_iso  # noqa: E402
from loopsq.state import durability  # noqa: E402
from loopsq.state.connection import connect  # noqa: E402
from tests.integration.processes import Cluster, open_cluster  # noqa: E402
from tests.redis_server import RedisServer, SentinelGroup  # noqa: E402


def slots_run(cluster: Cluster, names: list[str], start: float, end: float) -> int:
    return sum(1 for name in names for r in cluster.runs(name)
               if r.status == "succeeded" and start <= from_iso(r.scheduled_for).timestamp() < end)


def waits(server: RedisServer) -> int:
    return int(server.client().info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def window(cluster: Cluster, names: list[str], master: RedisServer, seconds: float) -> tuple[float, int]:
    """Runs per second over ``seconds`` of slots, and the WAIT calls the master answered meanwhile."""
    before = waits(master)
    start = time.time() + 0.5
    time.sleep(start + seconds + 3.0 - time.time())  # the window's last slots have finished by then
    return slots_run(cluster, names, start, start + seconds) / seconds, waits(master) - before


def info_cost_us(url: str, n: int = 200) -> float:
    """Median microseconds of one ``INFO replication`` round trip through loopsq's Sentinel client."""
    client = connect(url)
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        durability.online_replicas(client.info("replication"))
        samples.append((time.perf_counter() - t) * 1e6)
    return statistics.median(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=10)
    parser.add_argument("--every-ms", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    period = args.every_ms / 1000
    args.window = max(1, round(args.window / period)) * period  # whole periods: every loop has as many slots
    group = SentinelGroup().start()
    clusters = open_cluster(group.url, Path(tempfile.mkdtemp(prefix="loopsq-bench-")))
    cluster = next(clusters)
    try:
        cluster.start_all(schedulers=1, workers=args.workers)
        names = [f"rd{i}" for i in range(args.loops)]
        for name in names:
            cluster.create_fast(name, "true", args.every_ms)
        cluster.wait_until(lambda: all(slots_run(cluster, [n], 0, time.time() + 60) >= 1 for n in names), 60,
                           "every loop to run")
        master = group.server(group.master_port())
        replica = next(s for s in group.servers if s.port != master.port)
        cost_up = info_cost_us(group.url)
        up, waits_up = window(cluster, names, master, args.window)
        replica.stop(signal.SIGKILL)
        time.sleep(durability.CONFIRM_S + 1.5)
        cost_down = info_cost_us(group.url)
        down, waits_down = window(cluster, names, master, args.window)
        offered = args.loops * 1000 / args.every_ms
        print(f"replica_down: {args.loops} loops every {args.every_ms} ms ({offered:.1f} slots/s offered), "
              f"{args.workers} worker(s), {args.window:.0f} s windows (short run on a shared, loaded machine)")
        print(f"slots due per window: {args.loops * round(args.window / period)}")
        print(f"replica up:   {up:.2f} runs/s, WAIT calls {waits_up}")
        print(f"replica down: {down:.2f} runs/s, WAIT calls {waits_down}")
        print(f"ratio down/up: {down / up if up else 0.0:.2f} (goal >= 0.8)")
        print(f"replica check: INFO replication {cost_up:.0f} us (replica up) / {cost_down:.0f} us (down) per "
              f"read, at most one read per process every {durability.REFRESH_S:.0f} s")
        return 0 if up and down / up >= 0.8 else 1
    finally:
        clusters.close()
        group.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
