"""Starvation: short loops beside long runs on one ``loopsq worker --concurrency 8``, against single-run workers.

Run: ``python bench/starvation.py [--quick] [--duration S] [--spread] [--phases loopsq,capacity,processes]``.

The load, the same in every phase: 4 long runs (loops due at once, a little before the window, ``sleep 600``),
then 20 short loops every 2 s (``bash -c`` writing one ledger line, nothing else), all due at the same instants
(``--spread``: their slots spread evenly over the 2 s), for a window of ``--duration`` seconds (60; ``--quick``
15). Each phase has its own private redis-server and ``python -m loopsq scheduler``; the workers differ:

- loopsq: ONE ``loopsq worker --concurrency 8``: the long runs hold 4 slots, the short loops share the other 4;
- baseline "same capacity": 8 ``loopsq worker --concurrency 1`` processes, the way to hold 8 runs at once before
  slots (the long runs take 4 workers, the short loops the other 4): what the slots must match, in one process;
- baseline "same processes": 1 ``loopsq worker --concurrency 1``: one process as before slots; the first long run
  takes it and starves everything else (every short slot is missed): what the slots bought.

Each target writes its own start first thing (``_harness.LEDGER_SCRIPT``: bash's ``$EPOCHREALTIME`` and
``$LOOPS_SCHEDULED_FOR``). Missed slots = the short loops' slots in the window (from their schedule: first slot +
k x 2 s) that have no ledger line; start lag = the target's start - its slot, over the short loops' slots that ran.
Also per phase: how many long runs started, the workers' memory (psutil RSS and PSS summed over the worker
processes and their watchdog helpers, targets not counted; the median of 3 samples in the window) and Redis
commands per second over the window.

Printed: per phase, missed slots and p50/p99 start lag; then loopsq against each baseline (ratios) and the goals:
0 missed, p99 <= 250 ms.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

import _fleet as fl
import _harness as hx

GOAL_MISSED = 0
GOAL_P99_MS = 250.0
LONG_RUNS = 4
SHORT_LOOPS = 20
SHORT_EVERY_S = 2.0
LONG_SLEEP_S = 600
SLOTS = 8
GRACE_S = 3.0
PHASES = {
    "loopsq": (f"loopsq: 1 worker --concurrency {SLOTS}", 1, SLOTS),
    "capacity": (f"baseline, same capacity: {SLOTS} workers --concurrency 1", SLOTS, 1),
    "processes": ("baseline, same processes: 1 worker --concurrency 1", 1, 1),
}


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    expected: int = 0
    lags: list[float] = field(default_factory=list)
    long_started: int = 0
    memory: fl.Memory | None = None
    commands_per_s: float = float("nan")
    notes: list[str] = field(default_factory=list)

    @property
    def missed(self) -> int:
        return self.expected - len(self.lags)


def run_phase(h: hx.Harness, key: str, duration: float, spread: bool) -> Phase:
    from loopsq.state.connection import connect
    from loopsq.state.keys import Keys

    name, workers, slots = PHASES[key]
    phase = Phase(name)
    server = h.redis()
    client, keys = connect(server.url), Keys()
    scheduler = h.loopsq("scheduler", server.url, f"{key}-scheduler")
    procs: list[subprocess.Popen[bytes]] = [
        h.loopsq("worker", server.url, f"{key}-worker-{i}", "--concurrency", str(slots), "--grace", "1s")
        for i in range(workers)]
    pids = [p.pid for p in procs]
    try:
        hx.wait_for(lambda: client.scard(keys.workers) >= workers and client.exists(keys.scheduler_lock), 60,
                    what=f"scheduler and {workers} worker(s)")
        ledger = h.dir / f"ledger-{key}.txt"
        t_long = round(time.time() + 1.5, 3)
        t0 = round(t_long + 1.0, 3)
        t_end = t0 + duration
        long_cmd = hx.LEDGER_SCRIPT.format(ledger=ledger) + f"; exec sleep {LONG_SLEEP_S}"
        fl.due_loops(client, [f"long-{i}" for i in range(LONG_RUNS)], 3_600_000, [t_long] * LONG_RUNS,
                     {"type": "command", "command": "bash", "args": ["-c", long_cmd]})
        step = SHORT_EVERY_S / SHORT_LOOPS if spread else 0.0
        firsts = [round(t0 + i * step, 3) for i in range(SHORT_LOOPS)]
        short_ids = set(fl.due_loops(
            client, [f"short-{i:02d}" for i in range(SHORT_LOOPS)], int(SHORT_EVERY_S * 1000), firsts,
            {"type": "command", "command": "bash", "args": ["-c", hx.LEDGER_SCRIPT.format(ledger=ledger)]}))
        if time.time() > t_long:
            phase.notes.append(f"creating the loops overran the long runs' slot by {time.time() - t_long:.2f} s")
        time.sleep(max(0.0, t0 - time.time()))
        rate = fl.CommandRate(client)
        rate.start()
        samples = []
        for i in range(3):
            time.sleep(max(0.0, t0 + duration * (i + 1) / 4 - time.time()))
            samples.append(fl.memory_of(fl.own_processes(pids)))
        time.sleep(max(0.0, t_end - time.time()))
        phase.commands_per_s = rate.end()
        phase.memory = fl.median_memory(samples)
        time.sleep(GRACE_S)  # a slot due just before the end may start after it
        for first in firsts:
            k = 0
            while first + k * SHORT_EVERY_S < t_end - 1e-6:
                phase.expected += 1
                k += 1
        seen: set[tuple[str, str]] = set()
        for parts in hx.read_ledger(ledger):
            if len(parts) < 3 or (parts[2], parts[1]) in seen:
                continue
            seen.add((parts[2], parts[1]))
            slot = hx.iso_to_epoch(parts[1])
            if parts[2] not in short_ids:
                phase.long_started += 1
            elif t0 - 1e-6 <= slot < t_end - 1e-6:
                phase.lags.append(float(parts[0].replace(",", ".")) - slot)
        phase.notes.append(f"load average at the end of the phase: {hx.load_average()}")
    finally:
        h.extra_groups.update(fl.targets_of(pids))
        h.stop_many([*procs, scheduler], timeout=15.0)
        client.close()
    return phase


def report(phase: Phase) -> None:
    print(f"\n[{phase.name}]")
    print(f"  short loops: {len(phase.lags)} of {phase.expected} slots ran, missed {phase.missed}; long runs "
          f"started {phase.long_started} of {LONG_RUNS}")
    print(f"  start lag of the short loops (target start - slot): {hx.summary_ms(phase.lags)}")
    if phase.memory is not None:
        m = phase.memory
        print(f"  workers' memory: RSS {fl.mb(m.rss)}, PSS {fl.mb(m.pss)} ({m.processes} processes); Redis "
              f"{phase.commands_per_s:,.0f} commands/s over the window")
    for note in phase.notes:
        print(f"  note: {note}")


def compare(q: Phase, base: Phase) -> None:
    ql, bl = sorted(q.lags), sorted(base.lags)
    line = f"  against {base.name}: missed {q.missed} vs {base.missed}"
    if ql and bl:
        line += (f"; start lag p50 {hx.pct(ql, 50) / hx.pct(bl, 50):.2f}x ({hx.pct(ql, 50) * 1e3:.1f} vs "
                 f"{hx.pct(bl, 50) * 1e3:.1f} ms), p99 {hx.pct(ql, 99) / hx.pct(bl, 99):.2f}x "
                 f"({hx.pct(ql, 99) * 1e3:.1f} vs {hx.pct(bl, 99) * 1e3:.1f} ms)")
    else:
        line += f"; start lag: {'no' if not bl else len(bl)} baseline sample(s), no ratio"
    if q.memory and base.memory:
        line += f"; workers' RSS {q.memory.rss / base.memory.rss:.2f}x, PSS {q.memory.pss / base.memory.pss:.2f}x"
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="15 s windows")
    parser.add_argument("--duration", type=float, help="seconds of short slots measured per phase (60)")
    parser.add_argument("--spread", action="store_true", help="spread the short loops' slots over their period")
    parser.add_argument("--phases", default="capacity,loopsq,processes",
                        help="which phases, in order (loopsq, capacity, processes)")
    args = parser.parse_args()
    duration = args.duration or (15.0 if args.quick else 60.0)
    keys = [k.strip() for k in args.phases.split(",") if k.strip()]
    if unknown := [k for k in keys if k not in PHASES]:
        parser.error(f"unknown phase(s) {unknown}; choose from {list(PHASES)}")
    h = hx.Harness("starvation", int(len(keys) * (duration + 90) + 60))
    print(__doc__.split("\n", 1)[0])
    print(f"{LONG_RUNS} long runs (sleep {LONG_SLEEP_S}) + {SHORT_LOOPS} loops every {SHORT_EVERY_S:g} s "
          f"({'spread' if args.spread else 'due together'}), {duration:g} s windows; load average "
          f"{hx.load_average()}; {os.cpu_count()} cores; logs in {h.dir}; children import loopsq from "
          f"{fl.check_children_import_this_tree()}")
    phases: dict[str, Phase] = {}
    try:
        for key in keys:
            phases[key] = run_phase(h, key, duration, args.spread)
            report(phases[key])
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        h.close()
    q = phases.get("loopsq")
    if q is None:
        return
    print("\n[loopsq against the baselines]")
    if len(phases) == 1:
        print("  (no baseline phase run)")
    for key, base in phases.items():
        if key != "loopsq":
            compare(q, base)
    p99 = hx.pct(sorted(q.lags), 99)
    print("\n[goals]")
    print(f"  missed slots {q.missed} (goal {GOAL_MISSED}): {'ok' if q.missed <= GOAL_MISSED else 'NOT MET'}")
    print(f"  p99 start lag {p99 * 1e3:.1f} ms (goal <= {GOAL_P99_MS:g} ms): "
          f"{'ok' if q.lags and p99 * 1e3 <= GOAL_P99_MS else 'NOT MET'}")


if __name__ == "__main__":
    main()
