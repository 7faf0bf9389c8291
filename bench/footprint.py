"""Redis footprint: memory over time with history windows, against the commit before them, same workload, same run.

Run: ``.venv/bin/python bench/footprint.py [--loops 200] [--duration 180] [--keep-runs 20] [--output-bytes 1024]
[--workers 4] [--baseline 5fc4aec] [--quick]`` (under ``flock /work/bench.lock``).

Each variant gets its own private redis-server and a new deployment as the README describes it: one scheduler,
``--workers`` workers and one mirror (``loopsq mirror``, the archive), all ``python -m loopsq`` processes, and
``--loops`` loops every second, each printing ``--output-bytes`` of text (a fixed page of words: no variant
benefits from its content). The baseline is a ``git worktree`` of ``--baseline`` (main before history windows):
its processes run its code, found first on their ``PYTHONPATH`` and in their working directory. The variants run
one after the other, so they do not share the two cores.

Printed: ``used_memory`` over time, then per variant the rate reached (runs/s), the slope of ``used_memory`` in
bytes per run over the second half of the run (the window is full by then: ``--keep-runs`` runs take
``--keep-runs`` seconds), Redis bytes per active loop at the end ((used_memory - that of the same deployment
with no loop) / loops), how many such loops fit in 25 MB, and the bytes per key kind (``MEMORY USAGE``) per run
and per loop. Goals: slope <= 2% of the baseline's, <= 32 KB per loop.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import _harness as hx
import redis

GOAL_SLOPE_RATIO = 0.02
GOAL_PER_LOOP = 32 * 1024
BUDGET = 25 * 1024 * 1024
SAMPLE_S = 5.0

# Create the loops with the variant's own SDK (run in the variant's checkout): url, count, command, keep-runs.
_CREATE = """
import sys, loopsq
from loopsq.sdk import LoopsClient
url, count, cmd, keep = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
client = LoopsClient(url)
for i in range(count):
    client.create({"name": f"fp-{i:04d}", "schedule": {"type": "interval", "everyMs": 1000},
                   "target": {"type": "command", "command": cmd, "shell": True}, "keepRuns": keep})
print(loopsq.__file__)
"""


@dataclass
class Variant:
    """One deployment measured: its checkout, its samples (t, runs, used_memory) and its figures."""

    name: str
    root: Path
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    empty: int = 0
    kinds: dict[str, tuple[int, int]] = field(default_factory=dict)
    runs_in_redis: int = 0
    loaded_from: str = ""

    def steady(self) -> list[tuple[float, int, int]]:
        """The samples of the second half of the run."""
        end = self.samples[-1][0]
        return [s for s in self.samples if s[0] >= end / 2]

    def slope(self) -> float:
        """Least-squares bytes of ``used_memory`` per run over the steady samples."""
        pts = self.steady()
        xs, ys = [float(s[1]) for s in pts], [float(s[2]) for s in pts]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        den = sum((x - mx) ** 2 for x in xs)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else float("nan")

    def rate(self) -> float:
        pts = self.steady()
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]) if len(pts) > 1 else float("nan")

    def per_loop(self, loops: int) -> float:
        last = statistics.median(s[2] for s in self.samples[-3:])
        return (last - self.empty) / loops


def page(size: int) -> Path:
    """A file of ``size`` bytes of words (the runs' output)."""
    rng = random.Random(7)
    words = ["loop", "run", "slot", "worker", "redis", "mirror", "ok", "done", "step", "lease", "timer", "queue"]
    text = ""
    while len(text) < size:
        text += f"{rng.choice(words)}-{rng.randrange(10_000)} "
        if rng.random() < 0.1:
            text += "\n"
    path = Path(tempfile.mkdtemp(prefix="loopsq-footprint-")) / "page.txt"
    path.write_text(text[: size - 1] + "\n")
    return path


def key_kind(key: str) -> str:
    kind = re.sub(r"loopsq-(fire|trigger)-[0-9a-f]{12}[-\w]*", r"loopsq-\1-<job>", key)
    kind = re.sub(r"[0-9a-f]{12}", "<id>", kind)
    kind = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", "<slot>", kind)
    kind = re.sub(r":\d+$", ":<n>", kind) if ":claim:" in kind else kind
    return re.sub(r"(worker|scheduler):[^:]+:\d+:\w+", r"\1:<proc>", kind)


def key_kinds(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Keys and bytes (MEMORY USAGE) per key kind (a SCAN: fine in a benchmark, never in loopsq)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    keys = [k.decode() if isinstance(k, bytes) else k for k in client.scan_iter(count=2000)]
    for start in range(0, len(keys), 500):
        pipe = client.pipeline(transaction=False)
        chunk = keys[start:start + 500]
        for key in chunk:
            pipe.memory_usage(key, samples=0)
        for key, used in zip(chunk, pipe.execute(), strict=True):
            entry = out[key_kind(key)]
            entry[0] += 1
            entry[1] += int(used or 0)
    return {k: (v[0], v[1]) for k, v in out.items()}


def measure(h: hx.Harness, variant: Variant, args: argparse.Namespace, cmd_file: Path) -> None:
    server = h.redis()
    client = server.client()
    data = h.dir / f"data-{variant.name}"
    ledger = h.dir / f"ledger-{variant.name}"
    ledger.touch()
    env = {"LOOPSQ_REDIS_URL": server.url, "LOOPSQ_DATA_DIR": str(data), "PYTHONPATH": str(variant.root),
           "PYTHONUNBUFFERED": "1"}
    procs = [h.spawn([hx.PYTHON, "-m", "loopsq", role], f"{variant.name}-{role}-{i}", env, cwd=variant.root)
             for i, role in enumerate(["mirror", "scheduler", *["worker"] * args.workers])]
    time.sleep(5)
    variant.empty = int(client.info("memory")["used_memory"])
    cmd = f"cat {cmd_file}; printf x >> {ledger}"
    created = subprocess.run([hx.PYTHON, "-c", _CREATE, server.url, str(args.loops), cmd, str(args.keep_runs)],
                             cwd=variant.root, env={**os.environ, **env}, capture_output=True, text=True,
                             check=True)
    variant.loaded_from = created.stdout.strip()
    assert variant.loaded_from.startswith(str(variant.root)), (variant.loaded_from, variant.root)
    t0 = time.monotonic()
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_S):
            variant.samples.append((time.monotonic() - t0, ledger.stat().st_size,
                                    int(client.info("memory")["used_memory"])))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    time.sleep(args.duration)
    stop.set()
    sampler.join()
    variant.kinds = key_kinds(client)
    variant.runs_in_redis = int(client.zcard("loopsq:runs"))
    h.stop_many(procs)
    client.close()


def kib(n: float) -> str:
    return f"{n / 1024:,.1f} KB"


def report(variants: list[Variant], args: argparse.Namespace) -> None:
    if len(variants) == 1:
        variants = [variants[0], variants[0]]  # one variant alone: its figures against themselves
    new, base = variants
    print("\nused_memory over time:")
    print(f"  {'t (s)':>6}  {'runs new':>9}  {'new':>10}  {'runs base':>9}  {'baseline':>10}")
    for a, b in zip(new.samples, base.samples, strict=False):
        print(f"  {a[0]:6.0f}  {a[1]:9d}  {a[2] / 2**20:7.2f} MB  {b[1]:9d}  {b[2] / 2**20:7.2f} MB")
    slope_new, slope_base = new.slope(), base.slope()
    per_new, per_base = new.per_loop(args.loops), base.per_loop(args.loops)
    print("\nfigures (second half of each run; the window of --keep-runs runs is full after "
          f"{args.keep_runs} s):")
    print(f"  rate reached          new {new.rate():7.1f} runs/s   baseline {base.rate():7.1f} runs/s   "
          f"(asked {args.loops} runs/s)")
    print(f"  slope                 new {slope_new:7.1f} B/run    baseline {slope_base:7.1f} B/run    "
          f"ratio {slope_new / slope_base:.2%}   (goal <= {GOAL_SLOPE_RATIO:.0%})")
    print(f"  bytes per loop        new {kib(per_new)}   baseline {kib(per_base)} after {args.duration:.0f} s "
          f"(and growing)   (goal <= {kib(GOAL_PER_LOOP)})")
    print(f"  loops in 25 MB        new {int((BUDGET - new.empty) / per_new)}   baseline "
          f"{int((BUDGET - base.empty) / per_base)} (for {args.duration:.0f} s only)")
    print(f"  empty deployment      new {kib(new.empty)}   baseline {kib(base.empty)}")
    for v in variants:
        runs = max(1, v.runs_in_redis)
        print(f"\nkey kinds, {v.name} (at the end; {v.runs_in_redis} runs in Redis, {args.loops} loops):")
        print(f"  {'kind':58} {'keys':>7} {'bytes':>11} {'B/run':>8} {'B/loop':>8}")
        for kind, (n, used) in sorted(v.kinds.items(), key=lambda kv: -kv[1][1])[:18]:
            print(f"  {kind[:58]:58} {n:7d} {used:11d} {used / runs:8.0f} {used / args.loops:8.0f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--loops", type=int, default=200)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds per variant (default 180)")
    parser.add_argument("--keep-runs", type=int, default=20)
    parser.add_argument("--output-bytes", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--baseline", default="5fc4aec", help="the commit before history windows")
    parser.add_argument("--quick", action="store_true", help="20 loops for 40 s (a smoke run, not the figures)")
    parser.add_argument("--only", choices=["new", "baseline"], help="measure one variant (a calibration run)")
    args = parser.parse_args()
    if args.quick:
        args.loops, args.duration = 20, 40.0
    h = hx.Harness("footprint", int(2 * args.duration + 600))
    base_root = h.dir / "baseline"
    subprocess.run(["git", "-C", str(hx.ROOT), "worktree", "add", "--detach", str(base_root), args.baseline],
                   check=True, capture_output=True)
    variants = [v for v in (Variant("new", hx.ROOT), Variant("baseline", base_root)) if args.only in (None, v.name)]
    cmd_file = page(args.output_bytes)
    try:
        print(f"footprint: loops={args.loops} every=1000ms output={args.output_bytes}B keep-runs={args.keep_runs} "
              f"duration={args.duration:.0f}s workers={args.workers} baseline={args.baseline} "
              f"load={hx.load_average()}")
        for variant in variants:
            measure(h, variant, args, cmd_file)
            print(f"  {variant.name}: {len(variant.samples)} samples, code from {variant.loaded_from}, "
                  f"load={hx.load_average()}")
        report(variants, args)
    finally:
        h.close()
        subprocess.run(["git", "-C", str(hx.ROOT), "worktree", "remove", "--force", str(base_root)],
                       check=False, capture_output=True)
        shutil.rmtree(cmd_file.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
