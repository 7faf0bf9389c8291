"""Deep pages of a long run history: keyset (``mirror/pages.py``, the dashboard's "Older runs" and the API's
``cursor``) against the offset way (``GET /api/runs?offset=``: the first offset+limit rows, then a slice).

One SQLite mirror with ``--runs`` loop runs of ``--loops`` loops (written straight into ``loop_runs``: this
measures the reads, not the mirroring). For each depth it times a 50-row page both ways, unfiltered and of
one loop, and prints the medians and the ratio offset/keyset measured in the same run on the same file. Both
use the same indexes; the keyset page costs the same at any depth, the offset one grows with it.

    flock /work/bench.lock .venv/bin/python bench/keyset_pages.py [--runs 200000] [--repeat 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from loopsq.mirror import pages, queries  # noqa: E402
from loopsq.mirror.schema import open_db  # noqa: E402

PAGE = 50


def fill(path: Path, runs: int, loops: int) -> None:
    conn = open_db(path)
    rows = []
    for i in range(runs):
        stamp = f"2026-{1 + i // 2_000_000:02d}-01T00:00:00.000Z"[:11] + f"{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}.{i % 1000:03d}Z"
        rows.append((f"r{i:08d}", f"l{i % loops}", f"loop{i % loops}", f"{stamp}#{i}", 1,
                     "failed" if i % 7 == 0 else "succeeded", stamp, stamp, stamp, stamp, "x" * 100))
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO loop_runs (id, loop_id, loop_name, scheduled_for, attempt, status, started_at, "
                     "finished_at, created_at, updated_at, stdout) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def cursor_at(conn: object, depth: int, **where: str) -> str | None:
    """The cursor of the page that starts at row ``depth`` (walked once, outside the timing)."""
    rows = queries.list_runs(conn, limit=depth, **where)  # type: ignore[arg-type]
    return pages.encode_cursor((str(rows[-1]["createdAt"]), str(rows[-1]["id"]))) if rows else None


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--loops", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "loops.db"
        fill(path, args.runs, args.loops)
        conn = open_db(path)
        print(f"keyset vs offset pages of {PAGE} runs; {args.runs} runs of {args.loops} loops; "
              f"median of {args.repeat}")
        print(f"{'filter':<10} {'depth':>8} {'offset ms':>10} {'keyset ms':>10} {'ratio':>7}")
        loop_runs = args.runs // args.loops
        for label, where, total in (("all", {}, args.runs), ("one loop", {"loop_id": "l3"}, loop_runs)):
            for depth in (0, total // 100, total // 10, total // 2, total - PAGE - 1):
                cursor = cursor_at(conn, depth, **where) if depth else None

                def by_offset(d: int = depth, w: dict[str, str] = where) -> object:
                    return queries.list_runs(conn, limit=d + PAGE + 1, **w)[d:d + PAGE]

                def by_keyset(c: str | None = cursor, w: dict[str, str] = where) -> object:
                    return pages.runs_page(conn, cursor=c, limit=PAGE, **w).items

                assert [r["id"] for r in by_offset()] == [r["id"] for r in by_keyset()]  # type: ignore[attr-defined]
                slow, fast = median_ms(by_offset, args.repeat), median_ms(by_keyset, args.repeat)
                print(f"{label:<10} {depth:>8} {slow:>10.2f} {fast:>10.2f} {slow / fast:>6.1f}x")
        conn.close()


if __name__ == "__main__":
    main(sys.argv[1:])
