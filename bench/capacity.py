"""Capacity: N long runs held at once by ONE ``loopsq worker --concurrency N``, against N plain RQ worker processes.

Run: ``python bench/capacity.py [--quick] [--runs N] [--seconds S]`` (default 100 runs of ``sleep 30``;
``--quick``: 10 of ``sleep 10``).

Each side gets its own private redis-server; they run one after the other on the same machine, doing the same
work: N runs of the same target, all due at one instant T.

- baseline: N RQ ``SimpleWorker`` processes (``bench/_baseline.py worker``) on one queue; at T the benchmark
  enqueues N bare RQ jobs in one pipeline (``Queue.enqueue_many``). Each job (``_capacity_jobs.hold``) writes
  ``time.time()`` first thing, then ``subprocess.run``s the target. SimpleWorker, not RQ's forking ``Worker``:
  it is what loopsq's worker is built on (the job runs in the worker process, no work horse), and it is the
  cheaper baseline on every figure here (a forking worker adds a horse process per run, with its own RSS, and a
  fork to the start lag), so the ratios are not flattered.
- loopsq: N loops (interval 1 h) whose first slot is T, timers armed at T, ``python -m loopsq scheduler`` and one
  ``python -m loopsq worker --concurrency N``.

The target on both sides: ``bash -c 'echo "$EPOCHREALTIME $LOOPS_SCHEDULED_FOR …" >> ledger; exec sleep S'``: it
writes its own start first thing with bash's clock, then becomes ``sleep``. Start lag = that start - T (the due
time, the enqueue instant). For the baseline the job's own start (its ``time.time()``) - T is printed too.

Printed per side, while all N run (a window from 0.5 s after the last start to 1.5 s before the first end):
- memory of the worker processes, summed, NOT counting the targets (``bash``/``sleep``): psutil's
  ``memory_full_info`` (``/proc/<pid>/smaps_rollup``) of each worker process and of its Python children (loopsq's
  worker has one: its watchdog helper, ``executor.watchdog``; the RQ workers have none). RSS counts a shared page
  (the interpreter, libraries) in every process mapping it; PSS splits it between them; the median of 3 samples.
  Also the same figures with the workers idle, before T;
- p50/p99 start lag, and how many of the N started; for loopsq split at each run's claim (its ``startedAt``);
- Redis commands per second over the window, the busiest commands, and over 2 s with the workers idle before T
  (loopsq's includes its scheduler's polling; the baseline has no scheduler): (busy - idle) / N per run held;
- from T to the last start: the CPU the worker processes used, and the Redis commands per run, server side (the
  commands inside loopsq's Lua scripts counted; loopsq's also include its worker's beat and its scheduler's moves);
Then the ratios loopsq/baseline and the goals: RSS <= 0.15x the baseline's, p99 start lag <= 1.5x the baseline's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import _fleet as fl
import _harness as hx
import redis

GOAL_RSS = 0.15
GOAL_P99 = 1.5
SAMPLES = 3
IDLE_WINDOW_S = 2.0


@dataclass
class Side:
    """What one side measured."""

    name: str
    runs: int
    lags: list[float] = field(default_factory=list)
    job_lags: list[float] = field(default_factory=list)
    idle: fl.Memory | None = None
    busy: fl.Memory | None = None
    commands_per_s: float = float("nan")
    idle_commands_per_s: float = float("nan")
    #: From T to the last target's start: the wall time, and the CPU the worker processes used meanwhile.
    burst_wall_s: float = float("nan")
    burst_cpu_s: float = float("nan")
    #: Server-side calls per command over the window while all run.
    window_commands: dict[str, int] = field(default_factory=dict)
    window_s: float = float("nan")
    #: Server-side calls per command from T to the last target's start.
    burst_commands: dict[str, int] = field(default_factory=dict)
    #: loopsq's lag split at each run's claim (its recorded ``startedAt``): label -> seconds.
    parts: dict[str, list[float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def iso(epoch: float) -> str:
    return hx.epoch_to_iso(epoch)


def wait_lines(path: Path, count: int, until: float) -> int:
    """Poll ``path`` (not Redis: the window counts Redis commands) until it has ``count`` lines or ``until``."""
    lines = 0
    while time.time() < until:
        lines = sum(1 for _ in hx.read_ledger(path))
        if lines >= count:
            break
        time.sleep(0.05)
    return lines


def measure_window(side: Side, conn: redis.Redis, pids: list[int], t_due: float, seconds: float,
                   ledger: Path, cpu_at_t: float, commands_at_t: dict[str, int]) -> None:
    """Wait for every target to start (the workers' CPU meanwhile), then sample the workers' memory and Redis's
    commands over the window in which all of them run."""
    t_end = t_due + seconds - 1.5
    started = wait_lines(ledger, side.runs, t_end - 1.0)
    side.burst_cpu_s = fl.cpu_seconds(fl.own_processes(pids)) - cpu_at_t
    side.burst_commands = fl.commands_between(commands_at_t, fl.commandstats(conn))
    starts = [float(parts[0].replace(",", ".")) for parts in hx.read_ledger(ledger)]
    side.burst_wall_s = max(starts, default=float("nan")) - t_due
    if started < side.runs:
        side.notes.append(f"only {started} of {side.runs} targets had started {t_end - 1.0 - t_due:.1f} s after T")
    w0 = time.time() + 0.5
    if w0 >= t_end - 0.5:
        side.notes.append("no time left for a window while all run; use a longer --seconds")
        w0 = t_end - 1.0
    time.sleep(max(0.0, w0 - time.time()))
    rate = fl.CommandRate(conn)
    before = fl.commandstats(conn)
    rate.start()
    samples = []
    for i in range(SAMPLES):
        at = w0 + (t_end - w0) * i / (SAMPLES - 1)
        time.sleep(max(0.0, at - time.time()))
        samples.append(fl.memory_of(fl.own_processes(pids)))
    side.commands_per_s = rate.end()
    side.window_s = time.time() - w0
    side.window_commands = fl.commands_between(before, fl.commandstats(conn))
    side.busy = fl.median_memory(samples)


def lags_from(side: Side, ledger: Path, t_due: float) -> None:
    starts = fl.ledger_starts(ledger)
    side.lags = [start - t_due for (_loop, slot), start in starts.items() if abs(hx.iso_to_epoch(slot) - t_due) < 1e-3]


def kill_groups(h: hx.Harness, procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each process group (an RQ worker and the job's target in it), then reap."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        h.stop(proc, timeout=5.0, term=False)


def run_baseline(h: hx.Harness, n: int, seconds: float) -> Side:
    from rq import Queue

    side = Side(f"baseline: {n} RQ SimpleWorker processes, {n} bare RQ jobs", n)
    server = h.redis()
    conn = redis.Redis.from_url(server.url)
    procs = [h.spawn([hx.PYTHON, str(hx.BENCH / "_baseline.py"), "worker", server.url, "cap"], f"bl-worker-{i}")
             for i in range(n)]
    try:
        hx.wait_for(lambda: conn.scard("rq:workers") >= n, 60 + n, interval=0.2, what=f"{n} RQ workers")
        time.sleep(1.0)
        pids = [p.pid for p in procs]
        side.idle = fl.memory_of(fl.own_processes(pids))
        side.idle_commands_per_s = fl.CommandRate(conn).over(IDLE_WINDOW_S)
        ledger, job_ledger = h.dir / "ledger-baseline.txt", h.dir / "jobs-baseline.txt"
        queue = Queue("cap", connection=conn)
        t_due = round(time.time() + 1.0, 3)
        data = [Queue.prepare_data("_capacity_jobs.hold", (str(job_ledger), str(ledger), i, iso(t_due), seconds),
                                   job_id=f"cap-{i}", timeout=int(seconds) + 120, result_ttl=60) for i in range(n)]
        own = fl.own_processes(pids)
        time.sleep(max(0.0, t_due - time.time()))
        cpu_at_t, commands_at_t = fl.cpu_seconds(own), fl.commandstats(conn)
        queue.enqueue_many(data)
        side.notes.append(f"enqueueing the {n} jobs took {(time.time() - t_due) * 1000:.1f} ms (one pipeline)")
        measure_window(side, conn, pids, t_due, seconds, ledger, cpu_at_t, commands_at_t)
        lags_from(side, ledger, t_due)
        side.job_lags = [float(parts[0]) - t_due for parts in hx.read_ledger(job_ledger)]
    finally:
        kill_groups(h, procs)
        conn.close()
    return side


def run_loopsq(h: hx.Harness, n: int, seconds: float) -> Side:
    from loopsq.state.connection import connect
    from loopsq.state.keys import Keys
    from loopsq.state.runs import RunStore

    side = Side(f"loopsq: 1 worker --concurrency {n} (+ 1 scheduler), {n} loops due at once", n)
    server = h.redis()
    client, conn, keys = connect(server.url), redis.Redis.from_url(server.url), Keys()
    scheduler = h.loopsq("scheduler", server.url, "scheduler")
    worker = h.loopsq("worker", server.url, "worker", "--concurrency", str(n), "--grace", "1s")
    try:
        hx.wait_for(lambda: client.scard(keys.workers) >= 1 and client.exists(keys.scheduler_lock), 30,
                    what="loopsq scheduler and worker")
        time.sleep(1.0)
        side.idle = fl.memory_of(fl.own_processes([worker.pid]))
        side.idle_commands_per_s = fl.CommandRate(conn).over(IDLE_WINDOW_S)
        ledger = h.dir / "ledger-loopsq.txt"
        script = hx.LEDGER_SCRIPT.format(ledger=ledger) + f"; exec sleep {seconds:g}"
        target = {"type": "command", "command": "bash", "args": ["-c", script]}
        t_due = round(time.time() + 1.5 + n / 100, 3)
        fl.due_loops(client, [f"cap-{i:04d}" for i in range(n)], 3_600_000, [t_due] * n, target)
        if time.time() > t_due:
            side.notes.append(f"creating the loops overran T by {time.time() - t_due:.2f} s")
        own = fl.own_processes([worker.pid])
        time.sleep(max(0.0, t_due - 0.01 - time.time()))  # (before the scheduler moves the timers)
        commands_at_t = fl.commandstats(conn)
        measure_window(side, conn, [worker.pid], t_due, seconds, ledger, fl.cpu_seconds(own), commands_at_t)
        store = RunStore(client, keys)
        runs = store.get_many(store.running_ids())
        side.notes.append(f"{len(runs)} run(s) recorded running at the end of the window")
        scheduler_mem = fl.memory_of(fl.own_processes([scheduler.pid]))
        side.notes.append(f"not counted: the scheduler, RSS {fl.mb(scheduler_mem.rss)}, PSS {fl.mb(scheduler_mem.pss)}")
        lags_from(side, ledger, t_due)
        starts = fl.ledger_starts(ledger)
        claims = {(r.loop_id, r.scheduled_for): hx.iso_to_epoch(r.started_at) for r in runs if r.started_at}
        side.parts["T -> run claimed"] = [c - t_due for c in claims.values()]
        side.parts["run claimed -> target start"] = [starts[k] - c for k, c in claims.items() if k in starts]
    finally:
        h.extra_groups.update(fl.targets_of([worker.pid]))
        h.stop(worker, timeout=15.0)
        h.stop(scheduler)
        client.close()
        conn.close()
    return side


def report(side: Side) -> None:
    print(f"\n[{side.name}]")
    print(f"  started {len(side.lags)} of {side.runs}; start lag (target start - T): {hx.summary_ms(side.lags)}")
    if side.job_lags:
        print(f"  job start (its time.time()) - T:              {hx.summary_ms(side.job_lags)}")
    for label, values in side.parts.items():
        print(f"    {label:42s} {hx.summary_ms(values)}")
    for label, mem in (("idle", side.idle), ("all running", side.busy)):
        if mem is not None:
            print(f"  worker memory, {label:11s}: RSS {fl.mb(mem.rss):>10s}  PSS {fl.mb(mem.pss):>10s}  "
                  f"USS {fl.mb(mem.uss):>10s}  ({mem.processes} processes)")
    print(f"  from T to the last start {side.burst_wall_s * 1e3:.0f} ms; the worker processes used "
          f"{side.burst_cpu_s * 1e3:.0f} ms of CPU meanwhile ({side.burst_cpu_s / side.runs * 1e3:.1f} ms per run)")
    total = sum(side.burst_commands.values())
    top = ", ".join(f"{k} {v / side.runs:.1f}" for k, v in list(side.burst_commands.items())[:8])
    print(f"  Redis commands per run from T to the last start: {total / side.runs:.1f} ({top})")
    top = ", ".join(f"{k} {v / side.window_s:,.0f}" for k, v in list(side.window_commands.items())[:8] if v > 0)
    per_run = (side.commands_per_s - side.idle_commands_per_s) / side.runs
    print(f"  Redis {side.commands_per_s:,.0f} commands/s while all run{': ' + top if top else ''}; idle before T "
          f"{side.idle_commands_per_s:,.0f}/s, so {per_run:.1f}/s per run held")
    for note in side.notes:
        print(f"  note: {note}")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def goals(base: Side, q: Side) -> None:
    bl, ql = sorted(base.lags), sorted(q.lags)
    assert base.busy is not None and q.busy is not None
    rss, pss = ratio(q.busy.rss, base.busy.rss), ratio(q.busy.pss, base.busy.pss)
    p50, p99 = ratio(hx.pct(ql, 50), hx.pct(bl, 50)), ratio(hx.pct(ql, 99), hx.pct(bl, 99))
    print("\n[ratios loopsq/baseline]")
    print(f"  worker RSS {rss:.3f}x ({fl.mb(q.busy.rss)} vs {fl.mb(base.busy.rss)}), PSS {pss:.3f}x")
    print(f"  start lag p50 {p50:.2f}x ({hx.pct(ql, 50) * 1e3:.1f} vs {hx.pct(bl, 50) * 1e3:.1f} ms), p99 {p99:.2f}x "
          f"({hx.pct(ql, 99) * 1e3:.1f} vs {hx.pct(bl, 99) * 1e3:.1f} ms)")
    if base.commands_per_s >= 1:
        print(f"  Redis commands/s {ratio(q.commands_per_s, base.commands_per_s):.2f}x "
              f"({q.commands_per_s:,.0f} vs {base.commands_per_s:,.0f})")
    else:  # RQ's SimpleWorker writes nothing while its job runs (no heartbeat of the job, nor of itself)
        print(f"  Redis commands/s: loopsq {q.commands_per_s:,.0f}, the baseline {base.commands_per_s:,.1f} (RQ's "
              f"SimpleWorker sends nothing while its job runs: no heartbeat, no lease)")
    all_started = len(ql) == q.runs and len(bl) == base.runs
    print("\n[goals]")
    print(f"  RSS {rss:.3f}x the baseline's (goal <= {GOAL_RSS:g}x): {'ok' if rss <= GOAL_RSS else 'NOT MET'}")
    print(f"  p99 start lag {p99:.2f}x the baseline's (goal <= {GOAL_P99:g}x): "
          f"{'ok' if p99 <= GOAL_P99 and all_started else 'NOT MET'}"
          + ("" if all_started else " (not every run started)"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="10 runs of sleep 10")
    parser.add_argument("--runs", type=int, help="runs held at once, = the loopsq worker's slots (100)")
    parser.add_argument("--seconds", type=float, help="how long each target sleeps (30)")
    args = parser.parse_args()
    n = args.runs or (10 if args.quick else 100)
    seconds = args.seconds or (10.0 if args.quick else 30.0)
    h = hx.Harness("capacity", int(180 + 2 * seconds + 2 * n))
    print(__doc__.split("\n", 1)[0])
    print(f"{n} runs of sleep {seconds:g}; load average {hx.load_average()}; {os.cpu_count()} cores; logs in {h.dir}; "
          f"children import loopsq from {fl.check_children_import_this_tree()}")
    try:
        base = run_baseline(h, n, seconds)
        report(base)
        q = run_loopsq(h, n, seconds)
        report(q)
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        h.close()
    print(f"\nload average at the end: {hx.load_average()} (at {datetime.now(UTC):%H:%M:%S} UTC)")
    goals(base, q)


if __name__ == "__main__":
    main()
