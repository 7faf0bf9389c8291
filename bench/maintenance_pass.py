"""One maintenance pass over idle, armed loops: the indexed pass against the pass over every loop it replaced.

Run: ``.venv/bin/python bench/maintenance_pass.py [--sizes 1000,10000] [--passes 15]``.

For each size, on a fresh private redis-server, in this process: N loops every hour, each with its timer armed
an hour ahead (idle: nothing is due, nothing is wrong). Once the full reconciliation's first round is over (it
seeds the indexes), three passes are timed, each ``--passes`` times, interleaved so that machine load hits them
alike:

- ``indexed``: the pass the scheduler runs every second (``maintenance.maintain``);
- ``+batch``: the same with a batch of the full reconciliation (``RECONCILE_BATCH`` loops), as one pass in every
  few minutes' round has;
- ``old``: the pass over every loop, without the index writes (``maintain(full=True, reindex=False)``), which is
  what every pass did before the indexes.

Prints medians, Redis commands per pass (``INFO commandstats``, also the commands scripts call), and the ratio
old / indexed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta

import _harness as hx

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import from_iso
from loopsq.engine import maintenance, timers
from loopsq.engine.runtime import Runtime


def commands(rt: Runtime) -> int:
    return sum(int(v["calls"]) for v in rt.client.info("commandstats").values())


def timed(rt: Runtime, what: str) -> tuple[float, int]:
    if what == "+batch":
        rt.client.hset(rt.keys.reconcile, "nextAt", 0)
    before = commands(rt)
    start = time.perf_counter()
    if what == "old":
        maintenance.maintain(rt, full=True, reindex=False)
    else:
        maintenance.maintain(rt)
    took = time.perf_counter() - start
    spent = commands(rt) - before - 1  # (less the INFO of ``before``)
    if what == "+batch":
        rt.client.hset(rt.keys.reconcile, mapping={"cursor": 0, "nextAt": timeutil.to_ms(timeutil.now()) + 600_000})
    return took, spent


def one(h: hx.Harness, size: int, passes: int) -> dict[str, tuple[float, int]]:
    server = h.redis()
    rt = Runtime(client=server.client(), role="scheduler").start()
    try:
        now = timeutil.now()
        for i in range(size):
            body = {"name": f"idle-{i:05d}", "timezone": "UTC", "schedule": {"type": "interval", "everyMs": 3_600_000},
                    "target": {"type": "command", "command": "true"}}
            loop = rt.loops.create(new_loop(body, now + timedelta(milliseconds=i)))
            timers.arm(rt.raw, rt.keys, loop.id, from_iso(str(loop.next_run_at)))
        while not int(rt.client.hget(rt.keys.reconcile, "nextAt") or 0):
            maintenance.maintain(rt)
        maintenance.maintain(rt)  # (trims the change stream of the writes above)
        results: dict[str, list[tuple[float, int]]] = {"indexed": [], "+batch": [], "old": []}
        for _ in range(passes):
            for what in results:
                results[what].append(timed(rt, what))
        return {what: (statistics.median(t for t, _ in xs), int(statistics.median(c for _, c in xs)))
                for what, xs in results.items()}
    finally:
        rt.stop()
        server.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--passes", type=int, default=15)
    args = parser.parse_args()
    h = hx.Harness("maintenance-pass", 1800)
    print(f"load average: {hx.load_average()}")
    print(f"{'loops':>7} | {'indexed ms':>10} | {'cmds':>5} | {'+batch ms':>9} | {'cmds':>5} | {'old ms':>8} | {'cmds':>6} | "
          "old/indexed")
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            r = one(h, size, args.passes)
            (ti, ci), (tb, cb), (to, co) = r["indexed"], r["+batch"], r["old"]
            print(f"{size:>7} | {ti * 1000:>10.2f} | {ci:>5} | {tb * 1000:>9.2f} | {cb:>5} | {to * 1000:>8.1f} | {co:>6} | "
                  f"{to / ti:.0f}x", flush=True)
    finally:
        h.close()


if __name__ == "__main__":
    main()
