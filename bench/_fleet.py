"""Shared plumbing of the fleet benchmarks (``capacity.py``, ``starvation.py``): loops made due at a chosen
instant (with a requirement set, until ``--requires`` reaches the CLI), the memory of a worker's own processes
(its targets left out), Redis commands per second over a window, and a check that child processes import this
checkout's code.

Nothing here measures by itself.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _harness as hx
import psutil
import redis

#: Children of a worker that are its own (its watchdog helper, ``python -S -c``), not a run's target.
HELPER_NAMES = ("python",)


def check_children_import_this_tree() -> str:
    """The ``loopsq`` and ``_harness`` a child process started as the harness starts them imports; raises when
    it is not this checkout's (a shared venv's editable install would otherwise win silently)."""
    code = "import loopsq, _harness; print(loopsq.__file__); print(_harness.__file__)"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(hx.ROOT), str(hx.BENCH), env.get("PYTHONPATH", "")])
    out = subprocess.run([hx.PYTHON, "-c", code], env=env, cwd=str(hx.ROOT), capture_output=True, text=True,
                         check=True).stdout.split()
    if not all(path.startswith(str(hx.ROOT) + os.sep) for path in out):
        raise RuntimeError(f"child processes import {out}, not this checkout ({hx.ROOT})")
    return out[0]


def due_loops(client: Any, names: Sequence[str], every_ms: int, first_s: Sequence[float], target: dict[str, Any],
              requires: Sequence[str] | None = None, extra: dict[str, Any] | None = None) -> list[str]:
    """Create one loop per name, ``every_ms`` apart, whose first slot is ``first_s[i]`` (epoch seconds), and arm
    its timer there on its requirement set's queue. ``requires`` goes into the stored loop (``new_loop`` keeps
    no ``requires`` yet). Returns the loop ids."""
    from loopsq.domain.loop_spec import new_loop
    from loopsq.engine import routing, timers
    from loopsq.state.keys import Keys
    from loopsq.state.loops import LoopStore

    keys = Keys()
    store, raw = LoopStore(client, keys), timers.raw_from(client)
    ids = []
    for name, first in zip(names, first_s, strict=True):
        first_ms = round(first * 1000)
        now = datetime.fromtimestamp((first_ms - every_ms) / 1000, UTC)
        body = {"name": name, "schedule": {"type": "interval", "everyMs": every_ms}, "target": target,
                "timezone": "UTC", **(extra or {})}
        loop = new_loop(body, now)
        if requires:
            loop = dataclasses.replace(loop, extra={**loop.extra, "requires": sorted(requires)})
        loop = store.create(loop)
        timers.arm(raw, keys, loop.id, datetime.fromtimestamp(first_ms / 1000, UTC),
                   queue_name=routing.loop_queue(loop, keys))
        ids.append(loop.id)
    return ids


@dataclass(frozen=True)
class Memory:
    """Memory of a set of processes, summed: RSS (shared pages counted in every process that maps them), PSS
    (shared pages split between their sharers) and USS (pages only that process has), in bytes."""

    processes: int
    rss: int
    pss: int
    uss: int


def own_processes(pids: Iterable[int]) -> list[psutil.Process]:
    """The given processes and their descendants named like a Python process (a worker's watchdog helper); its
    runs' targets (``bash``, ``sleep``, …) are left out."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            out.append(proc)
            out += [c for c in proc.children(recursive=True) if c.name().startswith(HELPER_NAMES)]
        except psutil.NoSuchProcess:
            continue
    return out


def memory_of(procs: Sequence[psutil.Process]) -> Memory:
    """Summed ``memory_full_info`` (``/proc/<pid>/smaps_rollup``) of live processes."""
    rss = pss = uss = count = 0
    for proc in procs:
        try:
            info = proc.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        rss, pss, uss, count = rss + info.rss, pss + info.pss, uss + info.uss, count + 1
    return Memory(count, rss, pss, uss)


def median_memory(samples: Sequence[Memory]) -> Memory:
    """Field by field, the median of several samples."""
    return Memory(*(int(statistics.median(getattr(s, f.name) for s in samples))
                    for f in dataclasses.fields(Memory)))


def cpu_seconds(procs: Sequence[psutil.Process]) -> float:
    """User + system CPU the live processes have used so far (all their threads; not their children's)."""
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def commandstats(conn: redis.Redis) -> dict[str, int]:
    """Calls per command so far, server side (``INFO commandstats``)."""
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in conn.info("commandstats").items()}


def commands_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Calls per command from one ``commandstats`` to a later one, most first (INFO left out: only the benchmark
    sends it)."""
    diff = {k: n - before.get(k, 0) for k, n in after.items()}
    diff.pop("info", None)  # (the benchmark's own)
    return dict(sorted(((k, n) for k, n in diff.items() if n > 0), key=lambda kv: -kv[1]))


class CommandRate:
    """Redis commands per second between ``start()`` and ``end()`` (``INFO stats`` ``total_commands_processed``,
    less the INFO calls themselves)."""

    def __init__(self, conn: redis.Redis) -> None:
        self.conn = conn
        self.first: tuple[float, int] | None = None

    def _sample(self) -> tuple[float, int]:
        return time.time(), int(self.conn.info("stats")["total_commands_processed"])

    def start(self) -> None:
        self.first = self._sample()

    def over(self, seconds: float) -> float:
        """Commands per second over the next ``seconds`` (slept here)."""
        self.start()
        time.sleep(seconds)
        return self.end()

    def end(self) -> float:
        assert self.first is not None
        t1, c1 = self._sample()
        t0, c0 = self.first
        return (c1 - c0 - 1) / max(t1 - t0, 1e-9)


def targets_of(pids: Iterable[int]) -> dict[int, str]:
    """Process groups led by descendants of ``pids`` that are not Python (a worker's runs), as the harness's
    ``extra_groups`` wants them: pgid -> a word of the command line."""
    out = {}
    for pid in pids:
        try:
            for child in psutil.Process(pid).children(recursive=True):
                if not child.name().startswith(HELPER_NAMES) and os.getpgid(child.pid) == child.pid:
                    out[child.pid] = child.name()
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return out


def ledger_starts(ledger: Path) -> dict[tuple[str, str], float]:
    """(loop id, slot ISO) -> the first start time the ledger recorded for it (``LEDGER_SCRIPT``'s format)."""
    out: dict[tuple[str, str], float] = {}
    for parts in hx.read_ledger(ledger):
        if len(parts) >= 3:
            out.setdefault((parts[2], parts[1]), float(parts[0].replace(",", ".")))
    return out
