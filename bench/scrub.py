"""How fast secret scrubbing is (``loopsq.domain.scrub``): milliseconds per megabyte of ordinary output and of the
worst input for each pattern, as text and as bytes, and through the stream scrubber in 64 KiB chunks (what the
executor does with a child's output); the ratio to ``str.replace`` of one literal over the same text is the baseline
measured in the same run. Text that holds no marker of any shape skips the regex (a few substring scans); the other
rows are the regex's own cost.

Run: ``.venv/bin/python bench/scrub.py [--repeat N]``. No Redis, no processes. Every figure is a median of N runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loopsq.domain.scrub import SHAPES, Scrubber, StreamScrubber

MB = 1_048_576
CHUNK = 65_536
LINE = "2026-12-03T12:00:00.000Z INFO worker: run 0a1b2c3d4e5f succeeded in 12 ms (task{} ok)\n"
INPUTS = {
    "ordinary log lines": (LINE.format(" runner") * (MB // 80))[:MB],
    # "task-runner" holds "sk-": the pre-scans cannot rule the text out, so the regex runs
    "log lines, a near miss": (LINE.format("-runner") * (MB // 80))[:MB],
    "sk- repeated": "sk-" * (MB // 3),
    "sk- almost keys": (" sk-" + "a" * 25) * (MB // 29),
    "AKIA repeated": "AKIA" * (MB // 4),
    "BEGIN headers": "-----BEGIN PRIVATE KEY-----\n" * (MB // 28),
    "one key block of 1 MB": "-----BEGIN RSA PRIVATE KEY-----" + "\nQUJD" * (MB // 5),
    "Bearer repeated": "Bearer " * (MB // 7),
    "token characters": "a" * MB,
    "line breaks": "\n" * MB,
}


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def streamed(data: bytes, scrubber: Scrubber) -> bytes:
    stream = StreamScrubber(scrubber)
    out = [stream.feed(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]
    return b"".join(out) + stream.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure (default 5)")
    args = parser.parse_args()
    with_env = Scrubber([f"env-secret-value-{i:02d}" for i in range(20)])
    print(f"{'input (1 MiB)':24} {'text ms':>8} {'bytes ms':>9} {'stream ms':>10} {'+20 env ms':>11} {'x replace':>10}")
    for name, text in INPUTS.items():
        data = text.encode()
        baseline = median_ms(lambda text=text: text.replace("never-present-literal", "x"), args.repeat)  # type: ignore[misc]
        as_text = median_ms(lambda text=text: SHAPES.text(text), args.repeat)  # type: ignore[misc]
        as_bytes = median_ms(lambda data=data: SHAPES.data(data), args.repeat)  # type: ignore[misc]
        as_stream = median_ms(lambda data=data: streamed(data, SHAPES), args.repeat)  # type: ignore[misc]
        env = median_ms(lambda text=text: with_env.text(text), args.repeat)  # type: ignore[misc]
        print(f"{name:24} {as_text:8.1f} {as_bytes:9.1f} {as_stream:10.1f} {env:11.1f} "
              f"{as_text / max(baseline, 1e-3):10.0f}")


if __name__ == "__main__":
    main()
