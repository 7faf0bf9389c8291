"""Bounded output capture: keep the last N bytes of a stream, count what was dropped, decode at the end.

Memory stays bounded however much a child writes: chunks are kept in a deque trimmed to the limit as they
arrive. The stored text is byte-exact (the reference sliced by characters and recomputed a non-cumulative marker).
"""

from __future__ import annotations

from collections import deque

DEFAULT_MAX_OUTPUT_BYTES = 262_144

# UTF-8 continuation bytes are 0b10xxxxxx; a character has at most three of them.
_MAX_CONTINUATION = 3


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


class BoundedOutput:
    """The tail of one output stream, at most ``max_bytes`` bytes, plus the count of bytes dropped before it."""

    __slots__ = ("_chunks", "_size", "dropped", "max_bytes", "total")

    def __init__(self, max_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> None:
        """Create an empty capture keeping at most ``max_bytes`` bytes (negative means zero)."""
        self.max_bytes = max(0, max_bytes)
        self.dropped = 0
        self.total = 0
        self._chunks: deque[bytes] = deque()
        self._size = 0

    def feed(self, chunk: bytes) -> None:
        """Append ``chunk`` and drop the oldest bytes beyond the limit."""
        if not chunk:
            return
        self.total += len(chunk)
        self._chunks.append(chunk)
        self._size += len(chunk)
        excess = self._size - self.max_bytes
        while excess > 0:
            head = self._chunks[0]
            if len(head) <= excess:
                self._chunks.popleft()
                cut = len(head)
            else:
                self._chunks[0] = head[excess:]
                cut = excess
            self._size -= cut
            self.dropped += cut
            excess -= cut

    def tail_bytes(self) -> tuple[bytes, int]:
        """Return the kept bytes and the total dropped, after aligning the tail to a UTF-8 character start.

        When bytes were dropped, up to three leading continuation bytes (the rest of a character cut in two) are
        dropped too and counted, so the text never starts with a replacement character.
        """
        data = b"".join(self._chunks)
        dropped = self.dropped
        if dropped:
            skip = 0
            while skip < min(_MAX_CONTINUATION, len(data)) and _is_continuation(data[skip]):
                skip += 1
            data = data[skip:]
            dropped += skip
        return data, dropped

    def text(self) -> str:
        """Return the captured text: ``[truncated <N> bytes]\\n`` + the tail when anything was dropped.

        ``N`` is cumulative over the whole stream. Invalid UTF-8 is decoded with replacement characters.
        """
        data, dropped = self.tail_bytes()
        body = data.decode("utf-8", errors="replace")
        if dropped:
            return f"[truncated {dropped} bytes]\n{body}"
        return body
