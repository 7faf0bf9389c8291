"""Benchmark of the executor: per-run overhead against a bare subprocess.run, and memory while a child floods.

Run: ``.venv/bin/python bench/executor.py [N]``. Prints the median time of N (default 200) runs of
``execute_target`` on ``true`` and of ``subprocess.run(["true"])``, measured interleaved in the same run, their
ratio (goal <= 1.5x), and the RSS growth of this process while a child writes 1 GiB to stdout (goal <= 10 MB).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loopsq.executor import RunMetadata, execute_target

ONE_GIB = 1 << 30


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/status."""
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_overhead(n: int) -> tuple[float, float]:
    """Return the median seconds of execute_target(true) and of subprocess.run(["true"]), interleaved."""
    target = {"type": "command", "command": "true", "shell": False}
    metadata = RunMetadata()

    def run_executor() -> None:
        result = execute_target(target, metadata)
        assert result.status == "succeeded", result

    def run_bare() -> None:
        subprocess.run(["true"], check=True)

    for _ in range(10):  # warm up imports, caches and the allocator
        run_executor()
        run_bare()
    executor_times: list[float] = []
    bare_times: list[float] = []
    for _ in range(n):
        executor_times.append(timed(run_executor))
        bare_times.append(timed(run_bare))
    return statistics.median(executor_times), statistics.median(bare_times)


def bench_flood() -> tuple[float, float, str]:
    """Return (RSS growth in bytes, seconds, first line of stdout) while a child writes 1 GiB."""
    execute_target({"type": "command", "command": "true"}, RunMetadata())
    baseline = rss_bytes()
    peak = baseline
    chunks = 0

    def sample(stream: str, chunk: bytes) -> None:
        nonlocal peak, chunks
        chunks += 1
        if chunks % 128 == 0:
            peak = max(peak, rss_bytes())

    start = time.perf_counter()
    result = execute_target(
        {"type": "command", "command": "head", "args": ["-c", str(ONE_GIB), "/dev/zero"]},
        RunMetadata(),
        on_output=sample,
    )
    elapsed = time.perf_counter() - start
    peak = max(peak, rss_bytes())
    return peak - baseline, elapsed, result.stdout.split("\n", 1)[0]


def main() -> None:
    """Run both benchmarks and print the figures."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    executor_s, bare_s = bench_overhead(n)
    ratio = executor_s / bare_s
    print(f"execute_target(true)     median of {n}: {executor_s * 1000:.3f} ms")
    print(f"subprocess.run(['true']) median of {n}: {bare_s * 1000:.3f} ms")
    print(f"ratio: {ratio:.2f}x (goal <= 1.5x)")
    growth, elapsed, marker = bench_flood()
    print(
        f"1 GiB flood: RSS growth {growth / 1e6:.2f} MB (goal <= 10 MB), {elapsed:.2f} s, stdout starts {marker}"
    )


if __name__ == "__main__":
    main()
