"""Live output: chunks of a running run's or step's stdout/stderr in a bounded Redis stream, so
``loopsq logs RUN [--step ID] -f`` can follow it from any host while it runs.

Bounded twice: each chunk keeps at most its last ``CHUNK_BYTES``, and the stream keeps about ``MAX_CHUNKS``;
the key expires ``KEEP_MS`` after the end. The stored run output (bounded separately) is the record; this is
only the window a follower sees. A run that prints nothing costs nothing here.
"""

from __future__ import annotations

import contextlib
import threading
import time

import redis

from loopsq.state.keys import Keys

CHUNK_BYTES = 16 * 1024
MAX_CHUNKS = 64
KEEP_MS = 3_600_000


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
        self._last = 0.0
        self._timer: threading.Timer | None = None

    def __call__(self, stream: str, chunk: bytes) -> None:
        with self._lock:
            self._buffer[stream] = (self._buffer.get(stream, b"") + chunk)[-CHUNK_BYTES:]
            if time.monotonic() - self._last >= self.FLUSH_S:
                self._flush_locked()
            elif self._timer is None:
                self._timer = threading.Timer(self.FLUSH_S, self._flush)
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
            pipe.xadd(self.key, {"s": stream, "d": data}, maxlen=MAX_CHUNKS, approximate=True)
        if end is not None:
            pipe.xadd(self.key, {"s": "eof", "d": end}, maxlen=MAX_CHUNKS, approximate=True)
        pipe.pexpire(self.key, KEEP_MS)
        with contextlib.suppress(redis.RedisError):  # best effort: the run's recorded output is the record
            pipe.execute()
        self._buffer = {}
        self._last = time.monotonic()
        self.used = True

    def close(self, status: str) -> None:
        """Send what is buffered and mark the end (followers stop there). Nothing when nothing was written."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self.used or self._buffer:
                self._flush_locked(end=status)
