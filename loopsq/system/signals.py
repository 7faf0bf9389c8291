"""Stop signals acted on by a thread of their own, never inside the signal handler.

Python runs a signal handler on the main thread between two bytecodes, possibly while that thread holds a lock:
the condition of the ``threading.Event`` it is waiting on, the threading module's own lock while it starts a
thread, a connection pool's. A handler that takes such a lock (``stop.set()``, ``Thread.start()``, a Redis call)
waits forever on its own thread. That is how a scheduler hung on SIGTERM (``stop.set()`` from the handler, caught
between ``Event.wait``'s entry and its release of the condition): killed after 20 s by a test, by honcho, by
systemd. A tight ``while not stop.wait(0)`` loop hangs in about half of 300 tries.

So the handler only records the signal (a byte written to a pipe: no Python lock) and a daemon thread, blocked on
the pipe's other end, does the work: logs, sets events, starts the grace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType

log = logging.getLogger(__name__)

#: What a handler may be: a callable, or one of the ``signal`` module's defaults.
Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalPipe:
    """``on_signal(signum)`` called on a thread of its own for each of ``signals`` received.

    ``install`` (main thread only) replaces the signals' handlers; ``restore`` puts the previous ones back and
    ends the thread. ``repeat``: called *in the handler* for a signal after the first (a cold stop that raises
    ``SystemExit`` on the main thread, say); it must take no lock. Without it every signal goes to the thread.
    """

    def __init__(self, on_signal: Callable[[int], None], *, name: str = "loopsq-signals",
                 repeat: Callable[[int, FrameType | None], None] | None = None) -> None:
        self._on_signal = on_signal
        self._repeat = repeat
        self._name = name
        self._received = False  # (a plain attribute: read and written by the handler without a lock)
        self._previous: list[tuple[int, Handler]] = []
        self._read_fd, self._write_fd = -1, -1
        self._thread: threading.Thread | None = None

    def install(self, signals: Iterable[int] = STOP_SIGNALS) -> SignalPipe:
        """Take ``signals`` over (from the main thread; anywhere else it does nothing, as Python allows)."""
        if threading.current_thread() is not threading.main_thread():
            return self
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._thread = threading.Thread(target=self._follow, name=self._name, daemon=True)
        self._thread.start()
        self._previous = [(sig, signal.signal(sig, self._handle)) for sig in signals]
        return self

    def restore(self) -> None:
        """Give the signals back to their previous handlers and end the thread (signals already recorded are
        still acted on first)."""
        for sig, handler in self._previous:
            signal.signal(sig, handler)
        self._previous = []
        if self._write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._write_fd)  # the thread reads end-of-file once it has acted on what came before
            self._write_fd = -1
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._received and self._repeat is not None:
            self._repeat(signum, frame)
            return
        self._received = True
        with contextlib.suppress(OSError):  # (a full pipe: the thread has plenty to act on already)
            os.write(self._write_fd, bytes((signum & 0xFF,)))

    def _follow(self) -> None:
        try:
            while True:
                data = os.read(self._read_fd, 64)
                if not data:
                    return
                for signum in data:
                    try:
                        self._on_signal(signum)
                    except Exception:  # (one failing action must not leave the next signal unheard)
                        log.exception("acting on signal %d failed", signum)
        finally:
            with contextlib.suppress(OSError):
                os.close(self._read_fd)


def dump_stacks_on_sigusr2() -> None:
    """``kill -USR2 <pid>`` prints every thread's stack to stderr (the process's log) and the process goes on: how
    a process that will not stop, or seems stuck, is diagnosed in place (README, "When a process hangs")."""
    import faulthandler
    import sys

    faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True, chain=False)


def stop_on_signals(stop: threading.Event, *, say: Callable[[], None] | None = None,
                    signals: Iterable[int] = STOP_SIGNALS) -> SignalPipe:
    """Set ``stop`` when one of ``signals`` arrives (``say()`` first, e.g. a log line), off the handler."""

    def act(_signum: int) -> None:
        if say is not None and not stop.is_set():
            say()
        stop.set()

    return SignalPipe(act).install(signals)
