"""The MCP server (Model Context Protocol): coding agents see, create and steer their loops.

``loopsq mcp`` serves it over stdio; ``loopsq web`` also serves it over streamable HTTP at ``/mcp`` behind the
API token. Built on the official SDK's low-level server (``mcp``). An interface, beside the web app and the
SDK: it imports the layers below it, never the CLI or the web app.
"""
