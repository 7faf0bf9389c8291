"""The MCP server: the SDK's low-level ``Server`` named ``loopsq`` with loopsq's tools and resources, and the
stdio transport (``loopsq mcp``).

A tool call goes: the mutation gate (mutation tools: the server's environment, no argument), the input schema
(arguments the domain checks come later, with its messages), the handler. Every refusal or failure is a tool error whose text is the one-line message
loopsq's CLI prints after ``error: `` (Redis outages with the URL masked); nothing is written on bad input.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
import redis
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from loopsq import __version__
from loopsq.domain.limits import MAX_BODY_BYTES
from loopsq.domain.text import shown
from loopsq.errors import LoopsqError
from loopsq.mcp import mutation_tools, notify_tools, output, read_tools, resources, run_tools
from loopsq.mcp.arguments import check_gates, check_schema, parse_allowed_tools, without_ignored
from loopsq.mcp.context import ALLOW_TOOLS_ENV, McpContext
from loopsq.mcp.registry import Call, Progress, Tool
from loopsq.mcp.stdio import JsonRpcLines, bounded_stdin
from loopsq.state.connection import unavailable
from loopsq.system import config

log = logging.getLogger(__name__)

SERVER_NAME = "loopsq"
INSTRUCTIONS = (
    "loopsq runs loops (recurring commands, coding agents and workflows) on Redis workers. Read tools are always "
    "available; mutation tools run only when the server's environment allows them (LOOPSQ_MCP_ALLOW_MUTATIONS=true, "
    "and, when LOOPSQ_MCP_ALLOW_TOOLS is set, only the tools it names): no argument can allow one."
)

TOOLS: tuple[Tool, ...] = (*read_tools.TOOLS, *output.TOOLS, *notify_tools.READ_TOOLS, *mutation_tools.TOOLS,
                           *run_tools.TOOLS, *notify_tools.MUTATION_TOOLS)
TOOLS_BY_NAME = {tool.name: tool for tool in TOOLS}
#: The names ``LOOPSQ_MCP_ALLOW_TOOLS`` may hold.
MUTATION_TOOLS = tuple(tool.name for tool in TOOLS if tool.mutation)


def allowed_tools_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """The mutation tools ``LOOPSQ_MCP_ALLOW_TOOLS`` lets run (None when unset: every one), checked at start.

    Raises:
        ValidationError: a name that is not a mutation tool's (bad input: the process does not start).
    """
    env = os.environ if environ is None else environ
    return parse_allowed_tools(env.get(ALLOW_TOOLS_ENV), MUTATION_TOOLS)


def tool_list() -> list[dict[str, Any]]:
    """The tools as ``tools/list`` shows them, as JSON (``loopsq mcp list-tools``, ``loopsq://tools``)."""
    return [tool.to_mcp().model_dump(mode="json", by_alias=True, exclude_none=True) for tool in TOOLS]


def error_result(message: str) -> types.CallToolResult:
    """A tool error carrying one line."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def ok_result(payload: dict[str, Any]) -> types.CallToolResult:
    """A tool result: the JSON as text, and as structured content."""
    text = json.dumps(payload, indent=2, ensure_ascii=False)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=payload)


def failure_message(ctx: McpContext, exc: Exception) -> str | None:
    """The one line for an error loopsq expects (as the CLI maps it); None for anything else."""
    if isinstance(exc, LoopsqError):
        return exc.message
    if isinstance(exc, redis.RedisError):
        return unavailable(ctx.redis_url, exc).message
    if isinstance(exc, sqlite3.Error):
        return f"mirror database {config.mirror_path(ctx.data_dir)}: {exc}"
    return None


async def call_tool(ctx: McpContext, name: str, arguments: dict[str, Any], progress: Progress) -> types.CallToolResult:
    """Run one tool call through the gates, the schema and the handler; every failure is a tool error."""
    tool = TOOLS_BY_NAME.get(name)
    if tool is None:
        return error_result(f"unknown tool: {name}")
    try:
        if tool.mutation:
            check_gates(name, ctx.mutations_allowed(), ctx.allowed_tools)
            arguments = without_ignored(arguments)
        check_schema(tool.schema, arguments, skip=tool.domain)
        payload = await tool.handler(Call(ctx, arguments, tool.schema, progress))
    except Exception as exc:
        message = failure_message(ctx, exc)
        if message is None:
            log.exception("tool %s failed", name)
            message = f"internal error in {name} ({type(exc).__name__}); see the server's log"
        return error_result(message)
    return ok_result(payload)


def build_server(ctx: McpContext) -> Server[Any]:
    """The MCP server for one deployment."""

    async def on_list_tools(_rctx: Any, _params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.to_mcp() for tool in TOOLS])

    async def on_call_tool(rctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        async def progress(value: float, total: float | None, message: str | None) -> None:
            await rctx.session.report_progress(value, total, message)

        return await call_tool(ctx, params.name, dict(params.arguments or {}), progress)

    async def on_list_resources(_rctx: Any, _params: types.PaginatedRequestParams | None
                                ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=resources.RESOURCES)

    async def on_list_templates(_rctx: Any, _params: types.PaginatedRequestParams | None
                                ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=resources.TEMPLATES)

    async def on_read_resource(_rctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        uri = str(params.uri)
        try:
            text = await anyio.to_thread.run_sync(resources.read, ctx, uri, tool_list)
        except Exception as exc:
            message = failure_message(ctx, exc)
            if message is None:
                log.exception("reading %s failed", shown(uri))
                raise MCPError(types.INTERNAL_ERROR,
                               f"internal error reading {shown(uri)}; see the server's log") from exc
            raise MCPError(types.INVALID_PARAMS, message, {"uri": shown(uri)}) from exc
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, text=text,
                                                                             mime_type=resources.JSON)])

    return Server(SERVER_NAME, version=__version__, instructions=INSTRUCTIONS,
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool, on_list_resources=on_list_resources,
                  on_list_resource_templates=on_list_templates, on_read_resource=on_read_resource)


def serve_stdio(ctx: McpContext, max_message_bytes: int = MAX_BODY_BYTES) -> None:
    """Serve ``ctx``'s deployment on stdin/stdout until the client closes the connection.

    A message (one line) longer than ``max_message_bytes`` is never held whole: it is read past and answered with
    a JSON-RPC error (``loopsq.mcp.stdio``), as the HTTP transport answers 413 (``web.body_limit``). A line of
    invalid JSON, or of JSON that is no valid JSON-RPC message, is answered with a JSON-RPC error too (-32700,
    -32600), where the SDK would drop it unanswered.
    """
    server = build_server(ctx)

    async def main() -> None:
        with bounded_stdin(max_message_bytes) as raw:
            lines = JsonRpcLines(raw)
            async with stdio_server(stdin=lines) as (read_stream, write_stream):  # type: ignore[arg-type]
                lines.reply_to(write_stream)
                await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(main)
