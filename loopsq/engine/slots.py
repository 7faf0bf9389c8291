"""A worker's run slots: how many runs one worker process holds at once, each on a thread of its own.

A run is a child process the worker supervises (output pipes, cancel, timeouts, its group's watchdog), so a slot
costs a thread, not a process. The worker's main thread takes jobs from RQ only while a slot is free
(``wait_free``), and hands each to a slot (``start``). On a stop, ``drain`` waits for the slots to empty: the
runtime cancels what is still going once the grace is over, so every run is recorded before the process exits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("loopsq.worker")

#: Slots a worker holds when neither ``--concurrency`` nor ``LOOPSQ_WORKER_CONCURRENCY`` says: runs mostly wait on
#: their child process (an agent for minutes, a command on I/O), so a few slots let short loops go on beside a
#: long run without a process each; more is a choice for machines whose runs are light (``--concurrency``).
DEFAULT_CONCURRENCY = 4
#: The most slots one worker process may hold (each is a thread, its run a child process with two pipes).
MAX_CONCURRENCY = 1000


class Slots:
    """``capacity`` slots; each runs one job on its own thread."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._cond = threading.Condition()
        self._running: dict[int, str] = {}  # slot number -> what it runs (a job id)
        self._threads: dict[int, threading.Thread] = {}

    @property
    def in_use(self) -> int:
        """Slots running something now."""
        with self._cond:
            return len(self._running)

    def jobs(self) -> list[str]:
        """What the busy slots run (job ids), oldest slot first."""
        with self._cond:
            return [self._running[n] for n in sorted(self._running)]

    def wait_free(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a free slot; True when one is free."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._running) < self.capacity, timeout)

    def start(self, name: str, fn: Callable[[int], None]) -> int:
        """Run ``fn(slot number)`` on a free slot's thread; returns the slot number. The caller has seen a free
        slot (``wait_free``): only the main thread starts jobs, so it is still free."""
        with self._cond:
            number = next(n for n in range(self.capacity + 1) if n not in self._running)
            if number >= self.capacity:
                raise RuntimeError("no free slot")
            self._running[number] = name
            thread = threading.Thread(target=self._run, args=(number, fn), name=f"loopsq-slot-{number}",
                                      daemon=True)
            self._threads[number] = thread
        thread.start()
        return number

    def _run(self, number: int, fn: Callable[[int], None]) -> None:
        try:
            fn(number)
        except BaseException:  # (a slot's job reports its own failures; this keeps the slot count true)
            log.exception("slot %d: job failed", number)
        finally:
            with self._cond:
                self._running.pop(number, None)
                self._threads.pop(number, None)
                self._cond.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every slot is free (``timeout`` seconds at most); True when they are."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._running, timeout)
