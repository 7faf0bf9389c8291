"""The stdio transport's input, bounded: JSON-RPC messages (one a line) read from stdin in chunks, so that a
message longer than the bound is read past, never held whole, and answered with a JSON-RPC error naming the bound.

The SDK's own reader holds a whole line, however long, then parses it into several more copies: a 200 MB argument
took the server to 870 MB. Here at most the bound (plus a chunk) is held; the SDK's transport gets the lines.

While serving, fd 0 points at /dev/null and the protocol is read from a private duplicate, so that no handler or
child process can read the client's bytes (as the SDK's reader does); fd 0 is restored at the end.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator
from typing import Any, Protocol

import anyio.to_thread
import mcp_types as types
from mcp.shared.message import SessionMessage

log = logging.getLogger(__name__)

READ_CHUNK = 65_536
#: What an oversized message keeps of its start and of its end: enough to find its JSON-RPC id.
HEAD_BYTES = 4_096
TAIL_BYTES = 512
_ID = rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,256}")'
_TAIL_ID = re.compile(_ID + rb"\s*}\s*$")


class Replies(Protocol):
    """Where an error reply goes (the transport's write stream)."""

    async def send(self, item: SessionMessage, /) -> None: ...


def too_large(limit: int, size: int) -> str:
    """The refusal of an oversized message (the words of the HTTP transport's 413)."""
    return f"MCP message must be at most {limit} bytes, got {size}"


def request_id(head: bytes, tail: bytes) -> int | str | None:
    """The JSON-RPC id of a message known only by its start and its end: the top-level ``"id"`` before
    ``"params"`` (where clients put it), else one closing the message; None when neither holds one."""
    cut = head.find(b'"params"')
    found = re.search(_ID, head if cut < 0 else head[:cut]) or _TAIL_ID.search(tail)
    if found is None:
        return None
    try:
        value: Any = json.loads(found.group(1))
    except ValueError:
        return None
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


class _Oversized:
    """A line past the bound: its size, its first ``HEAD_BYTES`` and its last ``TAIL_BYTES``."""

    def __init__(self, start: bytes) -> None:
        self.size = 0
        self.head = b""
        self.tail = b""
        self.add(start)

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if len(self.head) < HEAD_BYTES:
            self.head += piece[: HEAD_BYTES - len(self.head)]
        self.tail = (self.tail + piece[-TAIL_BYTES:])[-TAIL_BYTES:]


class BoundedLines:
    """The lines of ``fd`` (without their newline, decoded as UTF-8 with replacement), as ``async for`` gives
    them; a line longer than ``max_bytes`` is answered through ``reply_to``'s stream and skipped."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        self.fd = fd
        self.max_bytes = max_bytes
        self.eof = False
        self._line = bytearray()
        self._oversized: _Oversized | None = None
        self._ready: list[bytes] = []
        self._replies: Replies | None = None

    def reply_to(self, stream: Replies) -> None:
        """Send the refusals of oversized messages to ``stream`` (the server's write stream)."""
        self._replies = stream

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        while not self._ready:
            if self.eof:
                raise StopAsyncIteration
            chunk = await anyio.to_thread.run_sync(os.read, self.fd, READ_CHUNK, abandon_on_cancel=True)
            await self.take(chunk)
        return self._ready.pop(0).decode("utf-8", "replace")

    async def take(self, chunk: bytes) -> None:
        """Split ``chunk`` into lines (an empty chunk is the end of the input)."""
        if not chunk:
            self.eof = True
            if self._oversized is not None:
                await self._refuse(self._oversized)
            elif self._line.strip():
                self._ready.append(bytes(self._line))
            self._line.clear()
            self._oversized = None
            return
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if self._oversized is not None:
                self._oversized.add(piece)
            elif len(self._line) + len(piece) > self.max_bytes:
                self._oversized = _Oversized(bytes(self._line))
                self._oversized.add(piece)
                self._line.clear()
            else:
                self._line += piece
            if end < 0:
                return
            if self._oversized is not None:
                await self._refuse(self._oversized)
                self._oversized = None
            elif self._line.strip():
                self._ready.append(bytes(self._line))
            self._line.clear()
            start = end + 1

    async def _refuse(self, message: _Oversized) -> None:
        text = too_large(self.max_bytes, message.size)
        ident = request_id(message.head, message.tail)
        log.warning("refused an MCP message: %s (JSON-RPC id %r)", text, ident)
        if self._replies is None:
            return
        error = types.JSONRPCError(jsonrpc="2.0", id=ident,
                                   error=types.ErrorData(code=types.INVALID_REQUEST, message=text))
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await self._replies.send(SessionMessage(error))


@contextlib.contextmanager
def bounded_stdin(max_bytes: int) -> Iterator[BoundedLines]:
    """The protocol's input: stdin's lines, bounded; fd 0 points at /dev/null meanwhile (restored at the end)."""
    private = os.dup(0)
    os.set_inheritable(private, False)
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(devnull, 0)
    finally:
        os.close(devnull)
    lines = BoundedLines(private, max_bytes)
    try:
        yield lines
    finally:
        os.dup2(private, 0)
        if lines.eof:  # else a reader thread may still be blocked on it: never close an fd under a reader
            os.close(private)
