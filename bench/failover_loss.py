"""What an asynchronous Sentinel failover loses: acknowledged writes that are gone once the group has settled.

Run: ``.venv/bin/python bench/failover_loss.py [--failovers N] [--writers W]``.

A master, a replica and three sentinels on loopback (``tests.redis_server.SentinelGroup``). W writer threads,
each with its own ``redis+sentinel://`` client of loopsq (``loopsq.state.connection.connect``), SET a unique key
over and over and record every write the server acknowledged; one writer in two also runs ``WAIT 1 <ms>`` on the
same connection right after (a pipeline: SET then WAIT) and counts the write as confirmed only when a replica
acknowledged it. Each failover is ``SENTINEL FAILOVER`` in the middle of the writes; once the former master
replicates the new one, the writers pause and every acknowledged key is looked up on the new master.

Prints, per failover and in total: writes acknowledged, writes lost among them (without WAIT; with WAIT among
the confirmed ones, goal 0), the longest span of lost writes (ms), and how long writers saw errors. WAIT's own
cost is measured by ``bench/run_overhead.py --claim-wait``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from loopsq.state.connection import connect  # noqa: E402
from tests.redis_server import SentinelGroup  # noqa: E402

WAIT_MS = 1000


@dataclass
class Writer:
    """One writer thread's record: (key, monotonic time) of every acknowledged and every confirmed write."""

    name: str
    wait: bool
    acked: list[tuple[str, float]] = field(default_factory=list)
    confirmed: list[tuple[str, float]] = field(default_factory=list)
    unconfirmed: int = 0
    errors: list[float] = field(default_factory=list)


def write_loop(writer: Writer, url: str, stop: threading.Event, pause: threading.Event) -> None:
    client = connect(url, timeout=2.0)
    n = 0
    while not stop.is_set():
        if pause.is_set():
            time.sleep(0.01)
            continue
        key = f"w:{writer.name}:{n}"
        n += 1
        try:
            if writer.wait:
                pipe = client.pipeline(transaction=False)
                pipe.set(key, "1")
                pipe.execute_command("WAIT", 1, WAIT_MS)
                _ok, replicas = pipe.execute()
                now = time.monotonic()
                writer.acked.append((key, now))
                if int(replicas) >= 1:
                    writer.confirmed.append((key, now))
                else:
                    writer.unconfirmed += 1
            else:
                client.set(key, "1")
                writer.acked.append((key, time.monotonic()))
        except redis.RedisError:
            writer.errors.append(time.monotonic())
            time.sleep(0.05)
        time.sleep(0.002)


def lost(client: redis.Redis, writes: list[tuple[str, float]]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    for i in range(0, len(writes), 500):
        chunk = writes[i:i + 500]
        present = client.exists(*[k for k, _ in chunk]) if chunk else 0
        if present != len(chunk):
            values = client.mget([k for k, _ in chunk])
            out += [w for w, v in zip(chunk, values, strict=True) if v is None]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--writers", type=int, default=4)
    args = parser.parse_args()
    group = SentinelGroup().start()
    stop, pause = threading.Event(), threading.Event()
    writers = [Writer(f"{i}", wait=i % 2 == 1) for i in range(args.writers)]
    threads = [threading.Thread(target=write_loop, args=(w, group.url, stop, pause), daemon=True) for w in writers]
    totals = {"acked": 0, "lost": 0, "confirmed": 0, "confirmed_lost": 0}
    spans: list[float] = []
    try:
        for t in threads:
            t.start()
        for i in range(args.failovers):
            for w in writers:
                w.acked.clear()
                w.confirmed.clear()
                w.unconfirmed = 0
                w.errors.clear()
            time.sleep(2.0)
            started = time.monotonic()
            old, new = group.failover(settled=False)
            group.wait_settled()
            time.sleep(1.0)
            pause.set()
            time.sleep(0.3)
            master = group.server(group.master_port()).client()
            plain = [x for w in writers if not w.wait for x in w.acked]
            confirmed = [x for w in writers if w.wait for x in w.confirmed]
            gone = lost(master, plain)
            gone_confirmed = lost(master, confirmed)
            span = (max(t for _, t in gone) - min(t for _, t in gone)) * 1000 if gone else 0.0
            errors = [t for w in writers for t in w.errors]
            error_span = (max(errors) - min(errors)) * 1000 if errors else 0.0
            unconfirmed = sum(w.unconfirmed for w in writers if w.wait)
            print(f"failover {i + 1}: {old} -> {new}, settled after {time.monotonic() - started:.1f}s; "
                  f"plain writes acknowledged={len(plain)} lost={len(gone)} (over {span:.0f} ms); "
                  f"WAIT writes confirmed={len(confirmed)} lost={len(gone_confirmed)} (goal 0), "
                  f"unconfirmed={unconfirmed}; writer errors for {error_span:.0f} ms", flush=True)
            totals["acked"] += len(plain)
            totals["lost"] += len(gone)
            totals["confirmed"] += len(confirmed)
            totals["confirmed_lost"] += len(gone_confirmed)
            spans.append(span)
            pause.clear()
        print(f"total: plain acknowledged={totals['acked']} lost={totals['lost']}; "
              f"median lost span {statistics.median(spans):.0f} ms; WAIT confirmed={totals['confirmed']} "
              f"lost={totals['confirmed_lost']} (goal 0)")
        return 0 if totals["confirmed_lost"] == 0 else 1
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
        group.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
