"""The stdio transport's input, bounded: JSON-RPC messages (one a line) read from stdin in chunks, so that a
message longer than the bound is read past, never held whole, and answered with a JSON-RPC error naming the bound.

The SDK's own reader holds a whole line, however long, then parses it into several more copies: a 200 MB argument
took the server to 870 MB. Here at most the bound (plus a chunk) is held; the SDK's transport gets the lines.

While serving, fd 0 points at /dev/null and the protocol is read from a private duplicate, so that no handler or
child process can read the client's bytes (as the SDK's reader does); fd 0 is restored at the end.

Every line is then checked (``JsonRpcLines``) before the SDK sees it: the SDK's reader hands a line it cannot
validate to the session as an exception, which logs it at debug level and answers nothing, and it takes a request
whose id is null or not a string or integer for a notification, also unanswered; a client waiting for that reply
would hang. Here invalid JSON is answered with ``-32700`` (id null) and an invalid message with ``-32600`` (its
id when it has a usable one, else null); a malformed response (no ``method``, with ``result`` or ``error``) is
only logged, as JSON-RPC answers no response.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import anyio.to_thread
import mcp_types as types
from mcp.shared.message import SessionMessage

from loopsq.domain.text import quoted

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


BATCH = "batches are not supported: send one message a line"


def _usable_id(value: Any) -> int | str | None:
    ident = value.get("id") if isinstance(value, dict) else None
    return ident if isinstance(ident, int | str) and not isinstance(ident, bool) else None


def _why_invalid(value: Any) -> str | None:
    """What is wrong with the JSON value of a message the SDK refused; None for a malformed response (which JSON-RPC
    never answers)."""
    if isinstance(value, list):
        return BATCH
    if not isinstance(value, dict):
        return f"a message must be a JSON object, got {quoted(value)}"
    if value.get("jsonrpc") != "2.0":
        return f'"jsonrpc" must be "2.0", got {quoted(value["jsonrpc"])}' if "jsonrpc" in value \
            else 'missing "jsonrpc": "2.0"'
    if "id" in value and _usable_id(value) is None:
        return f'"id" must be a string or an integer, got {quoted(value["id"])}'
    if "method" not in value:
        return None if "result" in value or "error" in value else 'missing "method"'
    if not isinstance(value["method"], str):
        return f'"method" must be a string, got {quoted(value["method"])}'
    if "params" in value and not isinstance(value["params"], dict):
        return f'"params" must be an object, got {quoted(value["params"])}'
    return "not a JSON-RPC request or notification"


def check_line(line: str) -> types.JSONRPCError | None:
    """The error reply a line deserves (see the module's docstring), or None when the SDK may have it."""
    try:
        message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError:  # pydantic's ValidationError, or invalid JSON
        pass
    else:
        if not isinstance(message, types.JSONRPCNotification) or '"id"' not in line:
            return None
        value = json.loads(line)  # a notification with an "id" key: a request whose id the SDK dropped
        if not isinstance(value, dict) or "id" not in value:
            return None
        return _error(types.INVALID_REQUEST, None, f"invalid JSON-RPC message: {_why_invalid(value)}")
    try:
        value = json.loads(line)
    except ValueError as exc:
        return _error(types.PARSE_ERROR, None, f"invalid JSON: {exc}")
    why = _why_invalid(value)
    if why is None:
        log.warning("dropped a malformed JSON-RPC response (id %r)", _usable_id(value))
        return None
    return _error(types.INVALID_REQUEST, _usable_id(value), f"invalid JSON-RPC message: {why}")


def _error(code: int, ident: int | str | None, message: str) -> types.JSONRPCError:
    return types.JSONRPCError(jsonrpc="2.0", id=ident, error=types.ErrorData(code=code, message=message))


class JsonRpcLines:
    """``lines`` without the ones that are no JSON-RPC message the SDK answers: each of those is answered here with
    a JSON-RPC error (``check_line``) through ``reply_to``'s stream."""

    def __init__(self, lines: BoundedLines) -> None:
        self.lines = lines
        self._replies: Replies | None = None

    def reply_to(self, stream: Replies) -> None:
        """Send the error replies (this reader's and ``lines``') to ``stream``."""
        self._replies = stream
        self.lines.reply_to(stream)

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self.lines.__anext__()
            error = check_line(line)
            if error is None:
                return line
            log.warning("refused an MCP message: %s (JSON-RPC id %r)", error.error.message, error.id)
            if self._replies is not None:
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
