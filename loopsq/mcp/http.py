"""The streamable-HTTP transport that ``loopsq web`` serves at ``/mcp``, behind the web app's bearer token.

Stateless: every request gets a fresh transport, so several web processes behind one address serve any
request (a tool's progress notifications travel on that request's own response stream). The SDK's Host/Origin
checks (DNS-rebinding protection) are off: the token, which a foreign page cannot send, is what guards it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.types import Receive, Scope, Send

from loopsq.mcp.context import McpContext
from loopsq.mcp.server import build_server

PATH = "/mcp"


class HttpTransport:
    """An ASGI app answering MCP requests, and the session manager it needs: ``run()`` it in the web app's
    lifespan (a new manager per run, as a manager runs only once)."""

    def __init__(self, ctx: McpContext) -> None:
        # The SDK logs every stateless request at INFO ("Terminating session: None"); the web log keeps its own.
        logging.getLogger("mcp").setLevel(logging.WARNING)
        self.ctx = ctx
        self.server = build_server(ctx)
        self.manager = self._new_manager()

    def _new_manager(self) -> StreamableHTTPSessionManager:
        return StreamableHTTPSessionManager(app=self.server, stateless=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point of ``/mcp`` (an instance, not a function: Starlette routes it as an ASGI app)."""
        await self.manager.handle_request(scope, receive, send)

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Run a session manager for as long as the web app runs."""
        self.manager = self._new_manager()
        try:
            async with self.manager.run():
                yield
        finally:
            self.ctx.close()
