"""HEAD on every route that answers GET (RFC 9110 §9.3.2): the GET's status and headers, without its body.

FastAPI's routes take only the methods they declare, so HEAD was 405 everywhere, ``/api/health`` included (a
load balancer's probe). ``HeadAsGet`` runs a HEAD request as the GET it stands for and sends what the GET answers
but its body. A response that streams (the live output of a run) ends as soon as its headers are sent: the app is
then told the client went away, so nothing keeps running for a HEAD. ``/mcp`` is left alone (its GET opens an
event stream; its HEAD stays the transport's own answer). A path with no GET route still answers 405 (``Allow``
names HEAD wherever it names GET: ``errors.allowed_methods``).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Paths whose HEAD is passed through unchanged.
UNTOUCHED = ("/mcp",)


class HeadAsGet:
    """ASGI middleware: a HEAD request is run as GET and answered without the body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD" or str(scope["path"]).startswith(UNTOUCHED):
            await self.app(scope, receive, send)
            return
        done = False

        async def headless(message: Message) -> None:
            nonlocal done
            if done:
                return
            if message["type"] == "http.response.start":
                await send(message)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                done = True
                return
            await send(message)  # anything else before the start (none in practice) goes through

        async def gone_once_answered() -> Message:
            if done:
                return {"type": "http.disconnect"}
            return await receive()

        await self.app({**scope, "method": "GET"}, gone_once_answered, headless)
