"""The resources: ``loopsq://runtime`` (version, Redis URL masked, data dir), ``loopsq://tools`` (the tool list,
as the reference's ``loops://tools``) and the template ``loopsq://loops/{idOrName}`` (one loop, redacted)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import mcp_types as types

from loopsq import __version__
from loopsq.domain.redaction import public_loop
from loopsq.domain.text import shown
from loopsq.errors import NotFoundError
from loopsq.mcp.context import McpContext
from loopsq.mirror import queries
from loopsq.state.connection import mask_url

RUNTIME_URI = "loopsq://runtime"
TOOLS_URI = "loopsq://tools"
LOOP_PREFIX = "loopsq://loops/"
LOOP_TEMPLATE = LOOP_PREFIX + "{idOrName}"
JSON = "application/json"

RESOURCES = [
    types.Resource(uri=RUNTIME_URI, name="runtime", mime_type=JSON,
                   description="loopsq's version, the Redis URL (password masked), the data directory, and whether "
                               "mutation tools are allowed."),
    types.Resource(uri=TOOLS_URI, name="tools", mime_type=JSON, description="The tool list, as tools/list gives it."),
]
TEMPLATES = [
    types.ResourceTemplate(uri_template=LOOP_TEMPLATE, name="loop", mime_type=JSON,
                           description="One loop by id or name (command env and agent prompts redacted)."),
]


def runtime(ctx: McpContext) -> dict[str, Any]:
    """What ``loopsq://runtime`` shows."""
    return {"name": "loopsq", "version": __version__, "redisUrl": mask_url(ctx.redis_url),
            "dataDir": str(ctx.data_dir), "mutationsAllowed": ctx.mutations_allowed(),
            "allowedTools": None if ctx.allowed_tools is None else sorted(ctx.allowed_tools)}


def read(ctx: McpContext, uri: str, tool_list: Callable[[], list[dict[str, Any]]]) -> str:
    """The JSON text of the resource at ``uri`` (blocking: the loop resource reads the mirror).

    Raises:
        NotFoundError: ``resource not found: <uri>`` or ``loop not found: <idOrName>``.
    """
    if uri == RUNTIME_URI:
        payload: Any = runtime(ctx)
    elif uri == TOOLS_URI:
        payload = tool_list()
    elif uri.startswith(LOOP_PREFIX) and len(uri) > len(LOOP_PREFIX):
        ref = unquote(uri[len(LOOP_PREFIX):])
        with ctx.mirror() as conn:
            loop = queries.find_loop(conn, ref)
        if loop is None:
            raise NotFoundError(f"loop not found: {shown(ref)}")
        payload = public_loop(loop)
    else:
        raise NotFoundError(f"resource not found: {shown(uri)}")
    return json.dumps(payload, indent=2, ensure_ascii=False)
