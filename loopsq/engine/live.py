"""Live output: chunks of a running run's or step's stdout/stderr in a bounded Redis stream, so
``loopsq logs RUN [--step ID] -f`` can follow it from any host while it runs.

Bounded twice: each chunk keeps at most its last ``CHUNK_BYTES``, and the stream keeps about ``MAX_CHUNKS``.
Short-lived too: nothing is written before the run has gone on for ``FIRST_FLUSH_S`` (a stream costs ~5 KB
of Redis however little it holds, and most runs are over sooner), and the key expires ``KEEP_MS`` after the
end, once a follower has had the time to read its tail. The stored run output (bounded separately) is the
record, which ``loopsq logs`` prints for a run that has no live stream (any more); this is only the window a
follower sees while the run goes on. A run that prints nothing, or ends within ``FIRST_FLUSH_S``, costs nothing.
What is sent is scrubbed of the secret shapes (``domain.scrub``; the executor has already scrubbed the chunks of
the target's own env values, line by line, as it read them).
"""

from __future__ import annotations

import contextlib
import threading
import time

import redis

from loopsq.domain.scrub import SHAPES
from loopsq.state.keys import Keys

CHUNK_BYTES = 16 * 1024
MAX_CHUNKS = 64
#: How long the stream stays after the run's end marker (a follower reads the tail within its 1 s block).
KEEP_MS = 10_000
#: While the run goes on, the stream outlives its last chunk by this long.
RUNNING_KEEP_MS = 3_600_000
#: Output is first sent once the run has gone on this long (what it printed before is in the first chunk).
FIRST_FLUSH_S = 0.25


class LiveWriter:
    """An executor ``on_output`` callback appending to one run's (or step's) live stream.

    Writes are batched: at most one XADD per ``FLUSH_S`` per stream (a timer sends what is buffered), so a
    child flooding stdout does not cost a Redis round trip per pipe read; between flushes only the last
    ``CHUNK_BYTES`` of each stream are kept.
    """

    FLUSH_S = 0.1

    def __init__(self, client: redis.Redis, keys: Keys, run_id: str, step_id: str | None = None) -> None:
        self.client = client
        self.key = keys.live(run_id, step_id)
        self.used = False
        self._buffer: dict[str, bytes] = {}
        self._lock = threading.Lock()
        # As if it had just flushed, FIRST_FLUSH_S - FLUSH_S ahead: the first send comes FIRST_FLUSH_S from now.
        self._last = time.monotonic() + FIRST_FLUSH_S - self.FLUSH_S
        self._timer: threading.Timer | None = None

    def __call__(self, stream: str, chunk: bytes) -> None:
        with self._lock:
            self._buffer[stream] = (self._buffer.get(stream, b"") + chunk)[-CHUNK_BYTES:]
            wait = self._last + self.FLUSH_S - time.monotonic()
            if wait <= 0:
                self._flush_locked()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._flush)
                self._timer.daemon = True
                self._timer.start()

    def _flush(self) -> None:
        with self._lock:
            self._timer = None
            self._flush_locked()

    def _flush_locked(self, end: str | None = None) -> None:
        if not self._buffer and end is None:
            return
        pipe = self.client.pipeline(transaction=False)
        for stream, data in self._buffer.items():
            pipe.xadd(self.key, {"s": stream, "d": SHAPES.data(data)}, maxlen=MAX_CHUNKS, approximate=True)
        if end is not None:
            pipe.xadd(self.key, {"s": "eof", "d": end}, maxlen=MAX_CHUNKS, approximate=True)
        pipe.pexpire(self.key, KEEP_MS if end is not None else RUNNING_KEEP_MS)
        with contextlib.suppress(redis.RedisError):  # best effort: the run's recorded output is the record
            pipe.execute()
        self._buffer = {}
        self._last = time.monotonic()
        self.used = True

    def close(self, status: str) -> None:
        """Send what is buffered and mark the end (followers stop there), if anything was sent before; a run that
        ended before its first send leaves no stream (its recorded output is what ``logs`` shows)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self.used:
                self._flush_locked(end=status)
            self._buffer = {}
