"""Per-step overhead of a workflow: a 20-step sequential loopsq workflow of ``true`` against the same chain built
as 20 RQ jobs linked with ``depends_on``, each running ``subprocess.run(['true'])``, executed by an RQ
``SimpleWorker`` in burst mode; both in this process, on a private redis-server, interleaved, in the same run.

Run: ``.venv/bin/python bench/workflows.py [--quick] [--reps R] [--steps N]``.

Definitions (medians over the repetitions):

- ``spawn``: one bare ``subprocess.run(['true'])`` (measured here, interleaved with the rest);
- ``loopsq wall``: ``execute_workflow`` of the chain, from the run's creation to its last event;
- ``rq wall``: enqueueing the 20 chained jobs plus ``SimpleWorker.work(burst=True)`` until the last job ended
  (its ``ended_at``; the worker's own exit, which waits up to 1 s for its pubsub thread, is not counted);
- ``per step`` = wall / N; ``overhead per step`` = (wall - N x spawn) / N: what orchestration adds to each step.

Goals (issue #5): loopsq's overhead per step <= 3 ms, and its per-step time >= 3x faster than RQ's chain. Also
printed: Redis round trips per step (client requests; a pipeline counts once) and server commands per step (INFO
commandstats deltas, which include the commands Lua scripts call), for both sides.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from redis.connection import AbstractConnection  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402

GOAL_OVERHEAD_MS = 3.0
GOAL_SPEEDUP = 3.0

# -- round trips: a wrapper on the one method every request goes through ------------------------------------
_trips: Counter[str] = Counter()
_orig_send = AbstractConnection.send_packed_command


def _counting_send(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
    _trips["main" if threading.current_thread() is threading.main_thread() else "background"] += 1
    _orig_send(self, command, check_health)  # type: ignore[no-untyped-call]


AbstractConnection.send_packed_command = _counting_send  # type: ignore[method-assign]


def commandstats(conn: redis.Redis) -> Counter[str]:
    """Calls per command so far (server side)."""
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in conn.info("commandstats").items()})


class Bench:
    """One private Redis; loopsq's Runtime and an RQ queue on it."""

    def __init__(self, server: RedisServer, steps: int) -> None:
        from rq import Queue

        from loopsq.domain import timeutil
        from loopsq.domain.workflow_spec import workflow_body_from_json
        from loopsq.engine.runtime import Runtime
        from loopsq.state.workflows import WorkflowStore

        self.steps = steps
        self.client = server.client()
        self.raw = redis.Redis.from_url(server.url)
        self.rt = Runtime(client=self.client, role="bench").start()
        chain = [{"id": f"s{i:02d}", "target": {"type": "command", "command": "true"},
                  **({"dependsOn": [f"s{i - 1:02d}"]} if i else {})} for i in range(steps)]
        self.spec = WorkflowStore(self.client).create(workflow_body_from_json({"name": "chain", "steps": chain}),
                                                      timeutil.now())
        self.queue = Queue("bench-chain", connection=self.raw)

    def close(self) -> None:
        self.rt.stop()
        self.client.close()
        self.raw.close()

    def loopsq_chain(self) -> float:
        from loopsq.engine.workflow_runner import execute_workflow

        started = time.perf_counter()
        outcome = execute_workflow(self.rt, self.spec)
        elapsed = time.perf_counter() - started
        assert outcome.status == "succeeded", outcome
        return elapsed

    def rq_chain(self) -> tuple[float, float]:
        """(enqueue + work until the last job ended, the same from the worker's start).

        Measured to the last job's ``ended_at``, not to the return of ``work()``: on leaving, RQ's worker joins
        its pubsub thread with a 1 s timeout, a fixed cost per ``work()`` call that has nothing to do with steps.
        """
        from rq import SimpleWorker

        started = time.time()
        previous = None
        for _ in range(self.steps):
            # The job is ``subprocess.run(['true'])`` itself (a function RQ can import by its dotted path).
            previous = self.queue.enqueue(subprocess.run, ["true"], depends_on=previous)
        worker = SimpleWorker([self.queue], connection=self.raw)
        working = time.time()
        worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
        assert previous is not None
        previous.refresh()
        assert previous.get_status() == "finished" and previous.ended_at is not None, previous.get_status()
        ended = previous.ended_at.replace(tzinfo=UTC).timestamp()
        return ended - started, ended - working


def spawn_once() -> float:
    started = time.perf_counter()
    subprocess.run(["true"], check=False)
    return time.perf_counter() - started


def per_step_profile(bench: Bench, fn: Callable[[], object]) -> tuple[float, float, Counter[str]]:
    """Client round trips (main thread, background threads) and server commands per step of one chain."""
    _trips.clear()
    before = commandstats(bench.client)
    fn()
    after = commandstats(bench.client)
    after["info"] -= 1
    n = bench.steps
    delta = Counter({k: v for k, v in (after - before).items() if v > 0})
    return _trips["main"] / n, _trips["background"] / n, delta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 repetitions (finishes well under 30 s)")
    parser.add_argument("--reps", type=int, default=None, help="repetitions of each side [10 quick, 30 else]")
    parser.add_argument("--steps", type=int, default=20, help="steps in the chain [20]")
    args = parser.parse_args()
    reps = args.reps or (10 if args.quick else 30)
    n = args.steps

    server = RedisServer().start()
    bench = Bench(server, n)
    try:
        bench.loopsq_chain()  # warm up both sides (scripts loaded, imports done)
        bench.rq_chain()
        spawn: list[float] = []
        ours: list[float] = []
        theirs: list[float] = []
        theirs_work: list[float] = []
        for _ in range(reps):
            # Interleaved, so a noisy neighbour slows both sides alike.
            spawn.extend(spawn_once() for _ in range(n))
            ours.append(bench.loopsq_chain())
            total, work = bench.rq_chain()
            theirs.append(total)
            theirs_work.append(work)
        trips_ours = per_step_profile(bench, bench.loopsq_chain)
        trips_theirs = per_step_profile(bench, bench.rq_chain)
    finally:
        bench.close()
        server.cleanup()

    ms = 1000.0
    sp = statistics.median(spawn) * ms
    ow, tw, tww = (statistics.median(x) * ms for x in (ours, theirs, theirs_work))
    o_step, t_step = ow / n, tw / n
    o_over, t_over = o_step - sp, t_step - sp
    print(f"workflow chain of {n} x `true`, {reps} repetitions, medians")
    print(f"  bare spawn of true                 {sp:7.2f} ms")
    print(f"  loopsq   wall {ow:8.1f} ms   per step {o_step:6.2f} ms   overhead per step {o_over:6.2f} ms")
    print(f"  rq chain wall {tw:8.1f} ms   per step {t_step:6.2f} ms   overhead per step {t_over:6.2f} ms"
          f"   (worker only {tww / n:.2f} ms/step)")
    speedup = t_step / o_step
    print(f"  speedup per step (rq / loopsq)     {speedup:7.2f}x   goal >= {GOAL_SPEEDUP:.0f}x   "
          f"{'met' if speedup >= GOAL_SPEEDUP else 'MISSED'}")
    print(f"  speedup on overhead only           {t_over / o_over if o_over > 0 else float('inf'):7.2f}x")
    print(f"  loopsq overhead per step           {o_over:7.2f} ms   goal <= {GOAL_OVERHEAD_MS:.0f} ms   "
          f"{'met' if o_over <= GOAL_OVERHEAD_MS else 'MISSED'}")
    for name, (main_t, bg_t, cmds) in (("loopsq", trips_ours), ("rq", trips_theirs)):
        top = ", ".join(f"{k} {v / n:.1f}" for k, v in cmds.most_common(8))
        print(f"  {name:<6} round trips per step: {main_t:.2f} (+{bg_t:.2f} background); "
              f"server commands per step: {sum(cmds.values()) / n:.1f} ({top})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
