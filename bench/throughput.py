"""Throughput on one Redis: runs per second by number of workers, Redis commands per run, one Redis's ceiling.

The ceiling is projected as the server's commands per second, measured with ``redis-benchmark``, over commands
per run.

Run: ``.venv/bin/python bench/throughput.py [--runs N] [--workers 1,2,4]``.

For each worker count, on a fresh private redis-server: N once-loops of ``true``, all due, then one scheduler and
W workers (real ``python -m loopsq`` processes) work the backlog off. Timed from the first run's claim to the last
run's end (from the runs' own timestamps). A backlog is the regime where fires queue up, so a fire job takes the
timers queued behind it (the batched fast path); the lone regime, a fire that arrives alone on an idle worker, is
``bench/run_overhead.py``'s ``loopsq-1job`` side. The ceiling uses ``redis-benchmark`` on the same machine against
the same server build (SET, GET, HSET, ZADD, RPUSH, LPOP; 50 clients, no pipelining).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time

import _harness as hx
import redis

from loopsq.domain.timeutil import from_iso
from loopsq.sdk import LoopsClient
from loopsq.state import run_codec
from loopsq.state.keys import Keys

KEYS = Keys()


def one(h: hx.Harness, runs: int, workers: int) -> tuple[float, float]:
    server = h.redis()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    sdk = LoopsClient(server.url)
    for i in range(runs):
        sdk.create({"name": f"t{i:05d}", "timezone": "UTC", "schedule": {"type": "once", "at": "2020-01-01T00:00:00Z"},
                    "target": {"type": "command", "command": "true"}})
    sdk.close()
    before = int(client.info("stats")["total_commands_processed"])
    procs = [h.loopsq("scheduler", server.url, f"scheduler-{workers}")]
    procs += [h.loopsq("worker", server.url, f"worker-{workers}-{i}") for i in range(workers)]

    def settled() -> int:
        ids = client.zrange(KEYS.runs, 0, -1)
        return sum(1 for run in run_codec.load_many(client, [KEYS.run(str(i)) for i in ids])
                   if run.status == "succeeded")

    hx.wait_for(lambda: settled() >= runs, 60 + runs / 20, what=f"{runs} runs with {workers} workers")
    commands = int(client.info("stats")["total_commands_processed"]) - before
    ids = client.zrange(KEYS.runs, 0, -1)
    runs_json = [run.to_dict() for run in run_codec.load_many(client, [KEYS.run(str(i)) for i in ids])]
    first = min(from_iso(r["startedAt"]).timestamp() for r in runs_json)
    last = max(from_iso(r["finishedAt"]).timestamp() for r in runs_json)
    h.stop_many(procs)
    # Commands spent after the last run (idle polling while the check above caught up) are left in: conservative.
    client.close()
    return runs / (last - first), commands / runs


def redis_ops_per_s(h: hx.Harness) -> tuple[float, str]:
    server = h.redis()
    out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port), "-q", "-n", "100000",
                          "-c", "50", "-t", "set,get,hset,zadd,rpush,lpop"], capture_output=True, text=True,
                         timeout=300).stdout
    rates = {m.group(1): float(m.group(2)) for m in re.finditer(r"^([A-Z]+)[^:]*: ([\d.]+) requests per second",
                                                                 out.replace("\r", "\n"), re.M)}
    return statistics.median(rates.values()), ", ".join(f"{k} {v:,.0f}" for k, v in sorted(rates.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    h = hx.Harness("throughput", 1800)
    print(__doc__.split("\n", 1)[0])
    print(f"{args.runs} due runs of `true` per worker count; load average {hx.load_average()}")
    try:
        per_run: list[float] = []
        print(f"{'workers':>7}  {'runs/s':>8}  {'Redis commands/run':>18}")
        for workers in counts:
            rate, commands = one(h, args.runs, workers)
            per_run.append(commands)
            print(f"{workers:>7}  {rate:>8.0f}  {commands:>18.1f}")
            time.sleep(0.5)
        ops, detail = redis_ops_per_s(h)
        worst = max(per_run)
        print(f"redis-benchmark (50 clients, no pipelining): median {ops:,.0f} commands/s ({detail})")
        print(f"projected ceiling of one Redis: {ops:,.0f} / {worst:.1f} commands per run = {ops / worst:,.0f} runs/s "
              f"(= {ops / worst * 60:,.0f} runs a minute)")
    finally:
        h.close()


if __name__ == "__main__":
    main()
