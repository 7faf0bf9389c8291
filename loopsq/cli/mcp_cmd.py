"""``loopsq mcp``: serve the MCP server over stdio (for a coding agent's MCP configuration); ``loopsq mcp
list-tools`` prints the tool list as JSON."""

from __future__ import annotations

import json
import logging

import click

from loopsq.cli.app import get_app


@click.group("mcp", invoke_without_command=True)
@click.pass_context
def mcp(ctx: click.Context) -> None:
    """Serve the MCP server on stdin/stdout (mutations need LOOPSQ_MCP_ALLOW_MUTATIONS=true; LOOPSQ_MCP_ALLOW_TOOLS
    may name the only mutation tools allowed)."""
    if ctx.invoked_subcommand is not None:
        return
    from loopsq.mcp.context import McpContext
    from loopsq.mcp.server import allowed_tools_from_env, serve_stdio

    allowed_tools = allowed_tools_from_env()  # a bad name stops it here, exit 2
    # stdout carries the protocol: every log line goes to stderr.
    logging.basicConfig(level=logging.WARNING, format="[loopsq-mcp] %(levelname)s %(name)s: %(message)s")
    app = get_app()
    mcp_ctx = McpContext(app.redis_url, app.data_dir, app.keys, allowed_tools=allowed_tools)
    try:
        serve_stdio(mcp_ctx)
    finally:
        mcp_ctx.close()


@mcp.command("list-tools")
def list_tools() -> None:
    """Print the MCP tools (name, description, input schema, annotations) as JSON."""
    from loopsq.mcp.server import tool_list

    click.echo(json.dumps(tool_list(), indent=2, ensure_ascii=False))
