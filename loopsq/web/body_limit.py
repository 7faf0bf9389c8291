"""The request body bound of the whole web app (``limits.MAX_BODY_BYTES``), enforced before anything parses it.

A request whose ``Content-Length`` exceeds the bound is answered 413 at once, unread. Any other body is read here,
at most one byte past the bound (a chunked body announces no length), and replayed to the app; past the bound
the answer is 413 too. Either way the app never sees the body, so nothing is parsed or written.
"""

from __future__ import annotations

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopsq.domain.limits import MAX_BODY_BYTES
from loopsq.web.errors import error_body


def too_large(limit: int, got: str) -> JSONResponse:
    """The 413 answer: the one error body, naming the bound and what was sent."""
    message = f"request body must be at most {limit} bytes, got {got}"
    return JSONResponse(error_body(413, message), status_code=413, headers={"Connection": "close"})


class BodyLimit:
    """ASGI middleware: refuse request bodies larger than ``max_bytes`` with 413 before the app reads them."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.max_bytes:
            await too_large(self.max_bytes, f"{int(declared)}")(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away: let the app see it
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await too_large(self.max_bytes, f"more than {self.max_bytes}")(scope, receive, send)
                return
            chunks.append(chunk)
            more = bool(message.get("more_body", False))
        body = b"".join(chunks)
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that hands out ``messages`` first, then waits on the real one (for the disconnect)."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
