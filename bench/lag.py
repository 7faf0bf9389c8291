"""Scheduling lag: from a slot's time to the start of its run's process, loopsq against bare rq-scheduler + RQ.

Run: ``.venv/bin/python bench/lag.py [--quick] [--loops N] [--workers N] [--duration S] [--baseline-duration S]``.

Each phase gets its own private redis-server, scheduler and workers (default 3):

- baseline: N one-shot rq-scheduler timers (``enqueue_at``, millisecond scores, stock ``Scheduler.run()`` loop
  polling every 20 ms) executed by RQ ``SimpleWorker``s; each job starts the ledger command and re-arms its timer
  one period later. This is the machinery loopsq sits on, without loopsq's state (claims, leases, runs).
- loopsq: N loops, each ``interval 60 s``, phases spread evenly over the minute (created with a staggered
  ``now``), run by ``python -m loopsq scheduler`` and ``python -m loopsq worker``.

Lag = the run's process start - its slot. The target is ``bash -c 'echo "$EPOCHREALTIME $LOOPS_SCHEDULED_FOR …"
>> ledger'``: the process writes its own start time with bash's builtin clock as its first action (no ``date``
fork); this includes exec and bash start-up (~1-2 ms) and is the same command in both phases. The recorded
``startedAt`` of a loopsq run is its claim time, before the spawn, so it would flatter loopsq.

Only slots in [T0, T0 + duration) are counted; a slot without a ledger line is reported as missed. A breakdown
splits the lag at RQ's job ``enqueued_at``/``started_at`` (read from the job hashes while they live, 60 s).
Prints p50/p90/p99/max in both phases, their ratio, and ``lag p99 = … (goal <= 250 ms)``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import _harness as hx
import redis

GOAL_P99_MS = 250.0
EVERY_S = 60.0
GRACE_S = 3.0
COLLECT_EVERY_S = 10.0


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    lags: list[float] = field(default_factory=list)
    expected: int = 0
    duplicates: int = 0
    parts: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    maintenance_ms: list[float] = field(default_factory=list)

    @property
    def missed(self) -> int:
        return self.expected - len(self.lags)


def expected_slots(phases: list[float], t0: float, t_end: float) -> int:
    """How many slots of the given first times, every EVERY_S, fall in [t0, t_end)."""
    count = 0
    lo, hi, step = round(t0 * 1000), round(t_end * 1000), round(EVERY_S * 1000)
    for first in phases:
        slot = round(first * 1000)
        while slot < hi:
            if slot >= lo:
                count += 1
            slot += step
    return count


def collect_jobs(conn: redis.Redis, prefix: str, jobs: dict[str, tuple[float, float]]) -> None:
    """Record ``enqueued_at``/``started_at`` of every started job whose id starts with ``prefix``."""
    keys = [k.decode() for k in conn.scan_iter(match=f"rq:job:{prefix}*", count=1000)]
    pipe = conn.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, "enqueued_at", "started_at")
    for key, (enq, started) in zip(keys, pipe.execute(), strict=True):
        if enq and started:
            jobs.setdefault(key[len("rq:job:"):], (hx.iso_to_epoch(enq.decode()), hx.iso_to_epoch(started.decode())))


def job_times_by_slot(jobs: dict[str, tuple[float, float]], prefix: str) -> dict[tuple[str, int], tuple[float, float]]:
    """(loop id, slot ms) -> (enqueued, started) of the earliest job that fired for it."""
    out: dict[tuple[str, int], tuple[float, float]] = {}
    for job_id, times in jobs.items():
        rest = job_id[len(prefix):]
        if prefix == "loopsq-fire-":
            loop_id, ms, _rand = rest.rsplit("-", 2)
        else:
            loop_id, ms = ("bl-" + rest).rsplit("-", 1)
        key = (loop_id, int(ms))
        if key not in out or times[0] < out[key][0]:
            out[key] = times
    return out


def analyse(phase: Phase, ledger: Path, t0: float, t_end: float, jobs: dict[tuple[str, int], tuple[float, float]],
            claims: dict[tuple[str, int], float]) -> None:
    """Fill ``phase`` from the ledger: one lag per (loop, slot) in the window, and the breakdown."""
    seen: set[tuple[str, int]] = set()
    for parts in hx.read_ledger(ledger):
        if len(parts) < 3:
            continue
        started = float(parts[0].replace(",", "."))
        slot = hx.iso_to_epoch(parts[1])
        key = (parts[2], round(slot * 1000))
        if not round(t0 * 1000) <= key[1] < round(t_end * 1000):
            continue
        if key in seen:
            phase.duplicates += 1
            continue
        seen.add(key)
        phase.lags.append(started - slot)
        if key in jobs:
            enq, job_start = jobs[key]
            phase.parts["slot -> job enqueued (scheduler)"].append(enq - slot)
            phase.parts["enqueued -> job started (queue)"].append(job_start - enq)
            if key in claims:
                phase.parts["job started -> run claimed"].append(claims[key] - job_start)
                phase.parts["run claimed -> process start"].append(started - claims[key])
            else:
                phase.parts["job started -> process start"].append(started - job_start)


def _until(deadline: float, conn: redis.Redis, prefix: str, jobs: dict[str, tuple[float, float]]) -> None:
    next_collect = time.time() + COLLECT_EVERY_S
    while (left := deadline - time.time()) > 0:
        time.sleep(min(left, max(0.0, next_collect - time.time()), 1.0))
        if time.time() >= next_collect:
            collect_jobs(conn, prefix, jobs)
            next_collect = time.time() + COLLECT_EVERY_S


def run_baseline(h: hx.Harness, n_loops: int, n_workers: int, duration: float) -> Phase:
    """The bare rq-scheduler + SimpleWorker phase."""
    import _baseline

    phase = Phase("bare rq-scheduler + RQ SimpleWorker")
    server = h.redis()
    conn = redis.Redis.from_url(server.url)
    ledger = h.dir / "ledger-baseline.txt"
    procs = [h.spawn([hx.PYTHON, str(hx.BENCH / "_baseline.py"), "scheduler", server.url, "bl", "0.02"], "bl-scheduler")]
    procs += [h.spawn([hx.PYTHON, str(hx.BENCH / "_baseline.py"), "worker", server.url, "bl"], f"bl-worker-{i}")
              for i in range(n_workers)]
    hx.wait_for(lambda: conn.scard("rq:workers") >= n_workers, 30, what="baseline workers")
    t0 = round(time.time() + 1.5 + n_loops / 1000, 3)
    firsts = [round(t0 + i * EVERY_S / n_loops, 3) for i in range(n_loops)]
    for i, first in enumerate(firsts):
        _baseline.arm(conn, "bl", first, EVERY_S, str(ledger), i)
    t_end = t0 + duration
    jobs: dict[str, tuple[float, float]] = {}
    _until(t_end + GRACE_S, conn, "bl-", jobs)
    collect_jobs(conn, "bl-", jobs)
    h.stop_many(procs)
    phase.notes.append(f"load average at the end of the phase: {hx.load_average()}")
    phase.expected = expected_slots(firsts, t0, t_end)
    analyse(phase, ledger, t0, t_end, job_times_by_slot(jobs, "bl-"), {})
    phase.statuses["failed jobs"] = int(conn.zcard("rq:failed:bl") or 0)
    conn.close()
    return phase


SCHEDULER_WITH_MAINTENANCE = """
import logging, os, signal, sys, threading
from loopsq.engine.scheduler_process import run_scheduler
logging.basicConfig(level=logging.INFO, format="[loopsq-scheduler] %(message)s")
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
signal.signal(signal.SIGINT, lambda *_: stop.set())
run_scheduler(os.environ["LOOPSQ_REDIS_URL"], stop, maintenance_s=float(sys.argv[1]))
"""


def run_loopsq(h: hx.Harness, n_loops: int, n_workers: int, duration: float, maintenance_s: float | None) -> Phase:
    """The loopsq phase: real scheduler and worker processes."""
    from loopsq.domain.loop_spec import new_loop
    from loopsq.engine import timers
    from loopsq.state.connection import connect
    from loopsq.state.keys import Keys
    from loopsq.state.loops import LoopStore

    phase = Phase("loopsq scheduler + workers" + ("" if maintenance_s is None else
                                                  f" (experiment: maintenance every {maintenance_s:g} s)"))
    server = h.redis()
    client = connect(server.url)
    raw = redis.Redis.from_url(server.url)
    keys = Keys()
    ledger = h.dir / "ledger-loopsq.txt"
    if maintenance_s is None:
        procs = [h.loopsq("scheduler", server.url, "scheduler")]
    else:  # the same scheduler loop, through its Python API, with another maintenance period
        procs = [h.spawn([hx.PYTHON, "-c", SCHEDULER_WITH_MAINTENANCE, str(maintenance_s)], "scheduler",
                         {"LOOPSQ_REDIS_URL": server.url})]
    procs += [h.loopsq("worker", server.url, f"worker-{i}") for i in range(n_workers)]
    hx.wait_for(lambda: client.scard(keys.workers) >= n_workers and client.exists(keys.scheduler_lock), 30,
                what="loopsq scheduler and workers")
    store = LoopStore(client, keys)
    target = {"type": "command", "command": "bash", "args": ["-c", hx.LEDGER_SCRIPT.format(ledger=ledger)]}
    t0 = round(time.time() + 1.5 + n_loops / 300, 3)
    firsts: list[float] = []
    for i in range(n_loops):
        first_ms = round((t0 + i * EVERY_S / n_loops) * 1000)
        now = datetime.fromtimestamp((first_ms - EVERY_S * 1000) / 1000, UTC)
        body = {"name": f"lag-{i:05d}", "schedule": {"type": "interval", "everyMs": int(EVERY_S * 1000)},
                "target": target, "timezone": "UTC"}
        loop = store.create(new_loop(body, now))
        assert loop.next_run_at is not None
        timers.arm(raw, keys, loop.id, datetime.fromtimestamp(first_ms / 1000, UTC))
        firsts.append(first_ms / 1000)
    if time.time() > t0:
        phase.notes.append(f"setup overran the first slot by {time.time() - t0:.2f} s")
    t_end = t0 + duration
    jobs: dict[str, tuple[float, float]] = {}
    _until(t_end + GRACE_S, raw, "loopsq-fire-", jobs)
    collect_jobs(raw, "loopsq-fire-", jobs)
    phase.notes.append(f"load average at the end of the phase: {hx.load_average()}")
    h.stop_many(procs)
    phase.maintenance_ms = time_maintenance(server.url)
    from loopsq.state.commit import STREAM_MAXLEN

    entries = int(client.xlen(keys.changes))
    stream_bytes = int(client.memory_usage(keys.changes, samples=0) or 0)
    used = int(client.info("memory")["used_memory"])
    per_entry = stream_bytes / max(1, entries)
    phase.notes.append(
        f"Redis used_memory {used / 1e6:.1f} MB; change stream {entries} entries, {per_entry:.0f} B/entry "
        f"({entries / max(1, int(client.zcard(keys.runs))):.1f} per run); at its cap of {STREAM_MAXLEN} "
        f"entries that is ~{per_entry * STREAM_MAXLEN / 1e9:.1f} GB"
    )
    # Claim times and outcomes from the run rows.
    claims: dict[tuple[str, int], float] = {}
    run_ids = [str(r) for r in client.zrange(keys.runs, 0, -1)]
    from loopsq.state import run_codec

    for i in range(0, len(run_ids), 500):
        for loaded in run_codec.load_many(client, [keys.run(r) for r in run_ids[i:i + 500]]):
            run = loaded.to_dict()
            slot = hx.iso_to_epoch(run["scheduledFor"])
            if round(t0 * 1000) <= round(slot * 1000) < round(t_end * 1000):
                phase.statuses[run["status"]] += 1
                if run.get("startedAt"):
                    claims[(run["loopId"], round(slot * 1000))] = hx.iso_to_epoch(run["startedAt"])
    phase.expected = expected_slots(firsts, t0, t_end)
    analyse(phase, ledger, t0, t_end, job_times_by_slot(jobs, "loopsq-fire-"), claims)
    for name in ["scheduler"] + [f"worker-{i}" for i in range(n_workers)]:
        tail = h.log_tail(name, 200)
        errors = [line for line in tail.splitlines() if "Traceback" in line or "ERROR" in line or "failed" in line]
        if errors:
            phase.notes.append(f"{name}.log has {len(errors)} error line(s), e.g. {errors[0][:120]}")
    client.close()
    raw.close()
    return phase


def time_maintenance(url: str, passes: int = 5) -> list[float]:
    """Milliseconds of ``maintain()`` passes over the phase's final state, in this process (processes stopped).

    The leading scheduler runs this pass every second in the thread that moves due timers, so its duration is
    added to the lag of every slot that falls due during it.
    """
    from loopsq.engine.maintenance import maintain
    from loopsq.engine.runtime import Runtime

    rt = Runtime(url, role="scheduler")
    out = []
    for _ in range(passes):
        start = time.perf_counter()
        maintain(rt)
        out.append((time.perf_counter() - start) * 1000)
    rt.client.close()
    return out


def report(phase: Phase) -> None:
    print(f"\n[{phase.name}]")
    print(f"  runs measured {len(phase.lags)} of {phase.expected} slots; missed {phase.missed}, "
          f"duplicate executions {phase.duplicates}"
          + (f"; run statuses {dict(phase.statuses)}" if phase.statuses else ""))
    print(f"  lag (process start - slot): {hx.summary_ms(phase.lags)}")
    for name, values in phase.parts.items():
        print(f"    {name:34s} {hx.summary_ms(values)}")
    if phase.maintenance_ms:
        m = sorted(phase.maintenance_ms)
        print(f"  one maintenance pass over this state (in-process, after the processes stopped): median {m[len(m) // 2]:.0f} ms, "
              f"max {m[-1]:.0f} ms; the scheduler runs one every 1 s in its timer-moving thread")
    for note in phase.notes:
        print(f"  note: {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="200 loops, 40 s loopsq phase, 8 s baseline")
    parser.add_argument("--loops", type=int)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--duration", type=float, help="seconds of slots measured in the loopsq phase (150)")
    parser.add_argument("--baseline-duration", type=float, help="seconds of slots in the baseline phase (90; 0 skips)")
    parser.add_argument("--maintenance-s", type=float,
                        help="experiment: run the scheduler through run_scheduler(maintenance_s=S) instead of the CLI")
    args = parser.parse_args()
    n_loops = args.loops or (200 if args.quick else 1000)
    duration = args.duration or (40.0 if args.quick else 150.0)
    base_duration = args.baseline_duration if args.baseline_duration is not None else (8.0 if args.quick else 90.0)
    bound = int(duration + base_duration + 2 * GRACE_S + 120 + n_loops / 50)
    h = hx.Harness("lag", bound)
    print(__doc__.split("\n", 1)[0])
    print(f"{n_loops} timers/loops every {EVERY_S:.0f} s, phases spread evenly; {args.workers} workers, 1 scheduler; "
          f"baseline {base_duration:.0f} s, loopsq {duration:.0f} s; load average {hx.load_average()}; logs in {h.dir}")
    try:
        base = run_baseline(h, n_loops, args.workers, base_duration) if base_duration > 0 else Phase("baseline skipped")
        if base_duration > 0:
            report(base)
        loopsq = run_loopsq(h, n_loops, args.workers, duration, args.maintenance_s)
        report(loopsq)
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        h.close()
    b, q = sorted(base.lags), sorted(loopsq.lags)
    if b and q:
        print(f"\nratio loopsq/baseline: p50 {hx.pct(q, 50) / hx.pct(b, 50):.2f}x, p99 {hx.pct(q, 99) / hx.pct(b, 99):.2f}x")
    p99 = hx.pct(q, 99) * 1000 if q else float("nan")
    verdict = "ok" if q and p99 <= GOAL_P99_MS and loopsq.missed == 0 else "NOT MET"
    extra = f", {loopsq.missed} slot(s) missed" if loopsq.missed else ""
    print(f"lag p99 = {p99:.0f} ms (goal <= {GOAL_P99_MS:.0f} ms){extra}: {verdict}")


if __name__ == "__main__":
    main()
