"""Live output: chunks of a running run's or step's stdout/stderr in a bounded Redis stream, so
``loopsq logs RUN [--step ID] -f`` can follow it from any host while it runs.

Bounded twice: each chunk keeps at most its last ``CHUNK_BYTES``, and the stream keeps about ``MAX_CHUNKS``;
the key expires ``KEEP_MS`` after the end. The stored run output (bounded separately) is the record; this is
only the window a follower sees. A run that prints nothing costs nothing here.
"""

from __future__ import annotations

import redis

from loopsq.keys import Keys

CHUNK_BYTES = 16 * 1024
MAX_CHUNKS = 64
KEEP_MS = 3_600_000


class LiveWriter:
    """An executor ``on_output`` callback appending to one run's (or step's) live stream."""

    def __init__(self, client: redis.Redis, keys: Keys, run_id: str, step_id: str | None = None) -> None:
        self.client = client
        self.key = keys.live(run_id, step_id)
        self.used = False

    def __call__(self, stream: str, chunk: bytes) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.key, {"s": stream, "d": chunk[-CHUNK_BYTES:]}, maxlen=MAX_CHUNKS, approximate=True)
        if not self.used:
            pipe.pexpire(self.key, KEEP_MS)
            self.used = True
        pipe.execute()

    def close(self, status: str) -> None:
        """Mark the end (followers stop there). Nothing to do when nothing was written."""
        if not self.used:
            return
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.key, {"s": "eof", "d": status}, maxlen=MAX_CHUNKS, approximate=True)
        pipe.pexpire(self.key, KEEP_MS)
        pipe.execute()
