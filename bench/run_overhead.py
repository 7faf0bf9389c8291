"""Per-run overhead: a loopsq run of ``true`` against a bare RQ job running ``subprocess.run(['true'])``, both
executed by loopsq's worker class (RQ's ``SimpleWorker`` plus a heartbeat of the running job) in burst mode in
this process, interleaved, in the same run.

Run: ``.venv/bin/python bench/run_overhead.py [--quick] [--runs K] [--reps R] [--claim-wait]``.

Each repetition: K loops with a due slot (interval 1 h, command ``true``) get their timers armed in the past and
moved onto loopsq's queue, as the scheduler does; K ``subprocess.run(['true'])`` jobs go on a second queue. The
time of ``worker.work(burst=True)`` over each queue, divided by K, is the per-run cost (arming, moving and
enqueueing are not timed, on either side). Three sides:

- ``loopsq``: as deployed. A fire job goes on to fire the timer jobs queued behind it (``fire_queue.fire_queued``).
- ``loopsq-1job``: every fire is its own RQ job (``fire_queued`` takes nothing): the cost of a fire that
  arrives alone on an idle worker (RQ dequeues it; loopsq's worker runs it without RQ's per-job bookkeeping,
  ``rq_worker._Worker.execute_job``).
- ``slots`` and ``slots-1job``: the same two regimes on the worker as ``loopsq worker`` runs it, with slots
  (``--concurrency``, 4 by default): the main thread hands each job to a slot's thread, and takes the timer jobs
  waiting behind a dequeued one in one script each (``rq_worker._Worker._take_queued_fire``); ``slots-1job`` takes
  nothing that way either (every fire a dequeue of its own). The burst is timed until every slot is done.
- ``bare``: the baseline.
- ``loopsq-wait`` (with ``--claim-wait``): as ``loopsq``, with a replica attached to the server and every claim
  followed by ``WAIT 1`` on its connection, as on a Sentinel deployment (``loopsq.state.durability``).

Prints the medians over the repetitions, the ratio loopsq/bare (issue 21.3's goal: <= 0.7x) and loopsq-1job/bare
(goal: <= 1.2x),
Redis round trips per run (client writes, a pipeline counts once, counted by wrapping redis-py's
``send_packed_command``), server commands per run (INFO commandstats deltas, which include the commands Lua
scripts call), and a breakdown of a loopsq run by function (self time, from a separate instrumented pass that is
not part of the ratio).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import _harness as hx
import redis
from redis.connection import AbstractConnection

#: Issue 21.3's goals, against a bare RQ job: batched fires (a fire job takes the timer jobs queued behind it), and
#: a fire that arrives alone (one RQ job per fire).
GOAL_RATIO = 0.7
GOAL_LONE = 1.2
SIDES = ("loopsq", "loopsq-1job", "slots", "slots-1job", "bare")
#: The slots of the ``slots`` sides (``loopsq worker``'s default).
SLOTS = 4

# -- round-trip counting (a wrapper on the one method every request goes through) ---------------------------------
_trips: Counter[str] = Counter()
_orig_send = AbstractConnection.send_packed_command


def _counting_send(self: AbstractConnection, command: Any, check_health: bool = True) -> None:
    _trips["main" if threading.current_thread() is threading.main_thread() else "background"] += 1
    _orig_send(self, command, check_health)  # type: ignore[no-untyped-call]


AbstractConnection.send_packed_command = _counting_send  # type: ignore[method-assign]


def cpu_seconds(conn: redis.Redis) -> float:
    """CPU used so far by this process, its reaped children and the redis-server (wall time's load-proof twin)."""
    t = os.times()
    info = conn.info("cpu")
    return t.user + t.system + t.children_user + t.children_system + float(info["used_cpu_user"]) + float(
        info["used_cpu_sys"])


def commandstats(conn: redis.Redis) -> Counter[str]:
    """Calls per command so far (server side)."""
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in conn.info("commandstats").items()})


class Bench:
    """One private Redis, loopsq's Runtime in this process, and both queues."""

    def __init__(self, h: hx.Harness, claim_wait: bool = False) -> None:
        from loopsq.engine import rq_worker, timers
        from loopsq.engine.runtime import Runtime
        from loopsq.engine.worker_process import set_current_runtime
        from loopsq.state.loops import LoopStore

        self.server = h.redis()
        self.replica: hx.RedisServer | None = None
        if claim_wait:
            self.replica = hx.RedisServer(replica_of=self.server.port).start()
            hx_wait_link(self.replica)
        self.rt = Runtime(self.server.url, role="worker").start()
        set_current_runtime(self.rt)
        self.store = LoopStore(self.rt.client, self.rt.keys)
        self.stats_conn = redis.Redis.from_url(self.server.url)
        from rq import Queue

        self.bare_queue = Queue("bare", connection=self.rt.raw, default_timeout=-1)
        self.timers = timers
        self.rq_worker = rq_worker
        self.serial = 0

    def prepare_loopsq(self, k: int) -> None:
        from loopsq.domain.loop_spec import new_loop
        from loopsq.domain.timeutil import from_iso

        now = datetime.now(UTC)
        for _ in range(k):
            self.serial += 1
            body = {"name": f"ovh-{self.serial:06d}", "schedule": {"type": "interval", "everyMs": 3_600_000},
                    "target": {"type": "command", "command": "true"}, "timezone": "UTC"}
            loop = self.store.create(new_loop(body, now - timedelta(hours=1, seconds=1)))
            self.timers.arm(self.rt.raw, self.rt.keys, loop.id, from_iso(str(loop.next_run_at)))
        moved = self.timers.move_due(self.rt.raw)
        assert moved == k, f"{moved} timers moved, {k} armed"

    def prepare_bare(self, k: int) -> None:
        for _ in range(k):
            self.bare_queue.enqueue(subprocess.run, ["true"], job_timeout=-1, result_ttl=60, failure_ttl=7 * 86400)

    def burst(self, queue_name: str, slots: int = 0, take: bool = True) -> float:
        from rq import Queue

        from loopsq.engine.slots import Slots

        self.serial += 1
        if slots:
            pool = Slots(slots)
            worker = self.rq_worker.make_worker(self.rt.raw, f"bench-{self.serial}", slots=pool,
                                                queue_names=lambda: [queue_name])
            if not take:
                worker._take_queued_fire = lambda: False  # type: ignore[attr-defined, method-assign]
            start = time.perf_counter()
            worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
            pool.drain()
            return time.perf_counter() - start
        worker = self.rq_worker._Worker([Queue(queue_name, connection=self.rt.raw, default_timeout=-1)],
                                        connection=self.rt.raw, name=f"bench-{self.serial}")
        start = time.perf_counter()
        worker.work(burst=True, logging_level="WARNING", with_scheduler=False)
        return time.perf_counter() - start

    def measure(self, side: str, k: int) -> tuple[float, float, int, int, Counter[str]]:
        """(seconds, CPU seconds, main-thread round trips, background round trips, server commands) of a burst."""
        from loopsq.engine import fire_queue

        (self.prepare_bare if side == "bare" else self.prepare_loopsq)(k)
        original_fire_queued = fire_queue.fire_queued
        if side in ("loopsq-1job", "slots-1job"):
            fire_queue.fire_queued = _take_nothing(original_fire_queued)  # type: ignore[assignment]
        self.rt.runs.claim_replicas = 1 if side == "loopsq-wait" else 0
        before_cmds = commandstats(self.stats_conn)
        cpu0 = cpu_seconds(self.stats_conn)
        before = Counter(_trips)
        try:
            elapsed = self.burst("bare" if side == "bare" else self.timers.QUEUE_NAME,
                                 slots=SLOTS if side.startswith("slots") else 0, take=side != "slots-1job")
        finally:
            fire_queue.fire_queued = original_fire_queued  # type: ignore[assignment]
            self.rt.runs.claim_replicas = 0
        cpu = cpu_seconds(self.stats_conn) - cpu0
        trips = Counter(_trips)
        trips.subtract(before)
        cmds = commandstats(self.stats_conn)
        cmds.subtract(before_cmds)
        cmds["info"] -= 1
        return elapsed, cpu, trips["main"] - 1, trips["background"], +cmds  # -1: the INFO of the stats client

    def check(self) -> str:
        from rq.registry import FailedJobRegistry

        statuses: Counter[str] = Counter()
        ids = [str(i) for i in self.rt.client.zrange(self.rt.keys.runs, 0, -1)]
        for run in self.rt.runs.get_many(ids):
            statuses[run.status] += 1
        failed = {q: FailedJobRegistry(q, connection=self.rt.raw).count for q in ("bare", self.timers.QUEUE_NAME)}
        return f"loopsq run statuses {dict(statuses)}; RQ failed jobs {failed}"

    def close(self) -> None:
        self.rt.stop()
        if self.replica is not None:
            self.replica.cleanup()


def hx_wait_link(replica: hx.RedisServer) -> None:
    """Until the replica's link to its master is up."""
    deadline = time.monotonic() + 20
    while replica.client().info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise hx.BenchTimeout("the replica did not sync within 20 s")
        time.sleep(0.05)


def _take_nothing(fire_queued: Callable[..., Any]) -> Callable[..., Any]:
    """``fire_queue.fire_queued`` with no time to take anything: it only settles the job it was handed (loopsq's
    worker runs a dequeued fire job and then calls it with that job done)."""
    def take_nothing(rt: Any, budget_s: float = 0.0, **kwargs: Any) -> Any:
        return fire_queued(rt, 0.0, **kwargs)

    return take_nothing


class SelfTimer:
    """Wraps functions to accumulate self time (time minus wrapped callees) per label, main thread only."""

    def __init__(self) -> None:
        self.self_s: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()
        self._stack: list[float] = []
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        original = getattr(owner, attr)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not threading.main_thread():
                return original(*args, **kwargs)
            self._stack.append(0.0)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                total = time.perf_counter() - start
                child = self._stack.pop()
                self.self_s[label] += total - child
                self.calls[label] += 1
                if self._stack:
                    self._stack[-1] += total

        setattr(owner, attr, wrapper)
        self._undo.append(lambda: setattr(owner, attr, original))

    def undo(self) -> None:
        for fn in reversed(self._undo):
            fn()


def breakdown(b: Bench, k: int) -> tuple[float, SelfTimer]:
    """One instrumented burst of k loopsq runs."""
    from loopsq.engine import rq_worker, runner, steering, timers
    from loopsq.state.loops import LoopStore
    from loopsq.state.runs import RunStore

    b.prepare_loopsq(k)  # arms and moves the timers: not part of the runs
    st = SelfTimer()
    st.wrap(rq_worker._Worker, "execute_job", "rq_worker._Worker.execute_job")
    st.wrap(runner, "fire", "runner.fire (rest)")
    st.wrap(LoopStore, "get", "LoopStore.get (loop reads)")
    st.wrap(RunStore, "active_ids", "RunStore.active_ids")
    st.wrap(RunStore, "claim", "RunStore.claim")
    st.wrap(runner, "ensure_timer", "runner.ensure_timer (arm/disarm)")
    st.wrap(timers, "arm", "timers.arm")
    st.wrap(timers, "take_fire", "timers.take_fire")
    st.wrap(steering, "execute_target", "execute_target (spawn+wait true)")
    st.wrap(RunStore, "mark_started", "RunStore.mark_started")
    st.wrap(RunStore, "finalize", "RunStore.finalize")
    try:
        elapsed = b.burst(timers.QUEUE_NAME)
    finally:
        st.undo()
    return elapsed, st


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="K=100 runs, 3 repetitions")
    parser.add_argument("--runs", type=int, help="runs per burst (200)")
    parser.add_argument("--reps", type=int, help="repetitions per side (7)")
    parser.add_argument("--claim-wait", action="store_true",
                        help="also measure claims that WAIT for a replica (a replica is attached)")
    args = parser.parse_args()
    sides = (*SIDES, "loopsq-wait") if args.claim_wait else SIDES
    k = args.runs or (100 if args.quick else 200)
    reps = args.reps or (3 if args.quick else 7)
    h = hx.Harness("overhead", 120 + reps * k // 5)
    print(__doc__.split("\n", 1)[0])
    print(f"{reps} repetitions x {k} runs per side, interleaved; loopsq's worker class in this process; private "
          f"redis-server; load average {hx.load_average()}")
    try:
        b = Bench(h, claim_wait=args.claim_wait)
        # Warm-up: imports, script loading, allocator.
        for side in sides:
            b.measure(side, 20)
        per: dict[str, list[float]] = {side: [] for side in sides}
        cpu: dict[str, list[float]] = {side: [] for side in sides}
        trips: dict[str, list[float]] = {side: [] for side in sides}
        bg: dict[str, list[float]] = {side: [] for side in sides}
        cmds: dict[str, Counter[str]] = {side: Counter() for side in sides}
        for rep in range(reps):
            for side in (sides if rep % 2 == 0 else sides[::-1]):
                elapsed, cpu_s, main_trips, bg_trips, c = b.measure(side, k)
                per[side].append(elapsed / k)
                cpu[side].append(cpu_s / k)
                trips[side].append(main_trips / k)
                bg[side].append(bg_trips / k)
                cmds[side].update(c)
        spawn = []
        for _ in range(100):
            t = time.perf_counter()
            subprocess.run(["true"])
            spawn.append(time.perf_counter() - t)
        elapsed_i, st = breakdown(b, k)
        status = b.check()
        b.close()
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        h.close()

    q, r = statistics.median(per["loopsq"]), statistics.median(per["bare"])
    print(f"\nper-run time, median of {reps} bursts (min..max):")
    labels = [("loopsq", "loopsq fire(true)"), ("loopsq-1job", "loopsq, one RQ job per fire"),
              ("slots", f"loopsq, {SLOTS} slots"), ("slots-1job", f"loopsq, {SLOTS} slots, one job per fire"),
              ("bare", "bare RQ subprocess.run(['true'])")]
    if args.claim_wait:
        labels.append(("loopsq-wait", "loopsq, claims WAIT for a replica"))
    for side, label in labels:
        v = per[side]
        print(f"  {label:34s} {statistics.median(v) * 1e3:7.2f} ms  ({min(v) * 1e3:.2f}..{max(v) * 1e3:.2f})  "
              f"= {1 / statistics.median(v):6.0f} runs/s per worker")
    print(f"  subprocess.run(['true']) alone    {statistics.median(spawn) * 1e3:7.2f} ms (median of 100, in-process)")
    cq, cr = statistics.median(cpu["loopsq"]), statistics.median(cpu["bare"])
    print(f"CPU per run (this process + its children + redis-server; insensitive to other load): loopsq "
          f"{cq * 1e3:.2f} ms, bare {cr * 1e3:.2f} ms, ratio {cq / cr:.2f}x")
    print("\nRedis round trips per run (client requests; a pipeline or an EVALSHA counts once):")
    for side in sides:
        print(f"  {side:11s} worker thread {statistics.median(trips[side]):5.1f}   "
              f"beat thread {statistics.median(bg[side]):4.1f}")
    total_runs = reps * k
    for side in sides:
        top = ", ".join(f"{name} {n / total_runs:.1f}" for name, n in cmds[side].most_common(12))
        print(f"server commands per run, {side} ({sum(cmds[side].values()) / total_runs:.1f} in all): {top}")
    print(f"\nloopsq run, self time per run by function (instrumented burst of {k}: "
          f"{elapsed_i / k * 1e3:.2f} ms/run with instrumentation):")
    accounted = 0.0
    for label, secs in sorted(st.self_s.items(), key=lambda kv: -kv[1]):
        accounted += secs
        print(f"  {label:42s} {secs / k * 1e3:6.2f} ms  ({st.calls[label] / k:.1f} calls/run)")
    print(f"  {'RQ worker outside the job':42s} {(elapsed_i - accounted) / k * 1e3:6.2f} ms")
    print(f"\n{status}")
    # Paired ratios (each repetition's two adjacent bursts) are robust against load from other processes.
    ratio = statistics.median(a / c for a, c in zip(per["loopsq"], per["bare"], strict=True))
    one_job = statistics.median(a / c for a, c in zip(per["loopsq-1job"], per["bare"], strict=True))
    print(f"load average at the end: {hx.load_average()}")
    print(f"\nper-run overhead ratio loopsq/bare = {ratio:.2f}x (median of {reps} paired repetitions; wall medians "
          f"{q * 1e3:.2f} ms vs {r * 1e3:.2f} ms; CPU ratio {cq / cr:.2f}x; goal <= {GOAL_RATIO:.1f}x): "
          f"{'ok' if ratio <= GOAL_RATIO else 'NOT MET'}")
    print(f"one RQ job per fire (a fire alone on an idle worker) loopsq-1job/bare = {one_job:.2f}x (goal <= "
          f"{GOAL_LONE:.1f}x): {'ok' if one_job <= GOAL_LONE else 'NOT MET'}")
    slotted = statistics.median(a / c for a, c in zip(per["slots"], per["bare"], strict=True))
    slotted_one = statistics.median(a / c for a, c in zip(per["slots-1job"], per["bare"], strict=True))
    print(f"with {SLOTS} slots (the worker as deployed): batched slots/bare = {slotted:.2f}x (goal <= "
          f"{GOAL_RATIO:.1f}x): {'ok' if slotted <= GOAL_RATIO else 'NOT MET'}; one job per fire "
          f"slots-1job/bare = {slotted_one:.2f}x (goal <= {GOAL_LONE:.1f}x): "
          f"{'ok' if slotted_one <= GOAL_LONE else 'NOT MET'}")
    if args.claim_wait:
        waited = statistics.median(a / c for a, c in zip(per["loopsq-wait"], per["bare"], strict=True))
        cost = statistics.median(a / c for a, c in zip(per["loopsq-wait"], per["loopsq"], strict=True))
        print(f"claims that WAIT for a replica: loopsq-wait/bare = {waited:.2f}x (goal <= {GOAL_RATIO:.1f}x), "
              f"loopsq-wait/loopsq = {cost:.2f}x (the cost of WAIT, median of {reps} paired repetitions; wall "
              f"{statistics.median(per['loopsq-wait']) * 1e3:.2f} ms vs {q * 1e3:.2f} ms); CPU per run "
              f"{statistics.median(cpu['loopsq-wait']) * 1e3:.2f} ms vs {cq * 1e3:.2f} ms "
              f"({statistics.median(cpu['loopsq-wait']) / cq:.2f}x; the replica's CPU not included)")


if __name__ == "__main__":
    main()
