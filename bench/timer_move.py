"""Moving due timers onto the queue: loopsq's scripted mover against rq-scheduler's stock moving.

Run: ``.venv/bin/python bench/timer_move.py [--repeats N]``.

Both sides move the same load on their own private redis-server: N loop timers armed by ``timers.arm`` (a job
hash and an rq-scheduler entry each) and all due, for N = 1 (a lone timer), 100 and 1,000 (a burst, as 1,000 loops
on the same cron minute give). ``stock`` is rq-scheduler's ``get_jobs_to_queue`` + ``enqueue_job`` (fetch and
unpickle each job, save it whole, push it, ZREM); ``loopsq`` is ``timers.move_due`` (one Lua round trip per 500).
Prints the median time per move and per timer, Redis commands per timer (``INFO stats`` total_commands_processed),
and the ratio loopsq/stock; each side's result is checked: every id on the queue once, no entry left.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import _harness as hx  # noqa: F401  (puts the repository on sys.path)
import redis

from loopsq.engine import timers
from loopsq.state.keys import Keys
from tests.redis_server import RedisServer

KEYS = Keys()


def _arm(raw: redis.Redis, n: int) -> None:
    raw.flushdb()
    due = datetime.now(UTC) - timedelta(seconds=1)
    for i in range(n):
        timers.arm(raw, KEYS, f"loop{i:05d}", due)


def _commands(raw: redis.Redis) -> int:
    return int(raw.info("stats")["total_commands_processed"])


def _one(raw: redis.Redis, n: int, move: Callable[[redis.Redis], int]) -> tuple[float, float]:
    _arm(raw, n)
    before = _commands(raw)
    start = time.perf_counter()
    moved = move(raw)
    elapsed = time.perf_counter() - start
    commands = _commands(raw) - before - 1  # the INFO call itself
    queued = [i.decode() for i in raw.lrange(timers.queue(raw).key, 0, -1)]
    assert moved == n and len(queued) == n == len(set(queued)), (moved, len(queued))
    assert timers.scheduled_count(raw) == 0
    return elapsed, commands / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    print(__doc__.split("\n", 1)[0])
    servers = {name: RedisServer().start() for name in ("stock", "loopsq")}
    try:
        clients = {name: timers.raw_client(server.url) for name, server in servers.items()}
        movers = {"stock": timers.move_due_stock, "loopsq": timers.move_due}
        print(f"{'timers':>7}  {'side':6}  {'median per move':>16}  {'per timer':>10}  {'commands/timer':>14}")
        for n in (1, 100, 1000):
            results: dict[str, list[tuple[float, float]]] = {"stock": [], "loopsq": []}
            for _ in range(args.repeats):  # interleaved, so machine load hits both alike
                for side in ("stock", "loopsq"):
                    results[side].append(_one(clients[side], n, movers[side]))
            medians = {}
            for side in ("stock", "loopsq"):
                elapsed = statistics.median(r[0] for r in results[side])
                medians[side] = elapsed
                commands = statistics.median(r[1] for r in results[side])
                print(f"{n:>7}  {side:6}  {elapsed * 1000:>13.2f} ms  {elapsed / n * 1e6:>7.0f} us  {commands:>14.2f}")
            print(f"{'':>7}  ratio loopsq/stock: {medians['loopsq'] / medians['stock']:.2f}x")
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
