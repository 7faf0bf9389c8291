"""What a tool is: its name, description, exact input schema, gate and handler; and how a call reaches it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import mcp_types as types

from loopsq.mcp.arguments import check_schema
from loopsq.mcp.context import McpContext

#: What a mutation tool's description adds: how the server's operator lets it run (no argument does).
MUTATION_NOTE = ("Mutation: runs only when the server's environment allows it (LOOPSQ_MCP_ALLOW_MUTATIONS=true, and "
                 "this tool's name in LOOPSQ_MCP_ALLOW_TOOLS when that is set).")

Progress = Callable[[float, float | None, str | None], Awaitable[None]]


async def _no_progress(_progress: float, _total: float | None, _message: str | None) -> None:
    return None


@dataclass(frozen=True)
class Call:
    """One tool call: the deployment, the arguments as given, and a way to report progress (a no-op when the
    client sent no progress token)."""

    ctx: McpContext
    args: Mapping[str, Any]
    schema: Mapping[str, Any]
    progress: Progress = _no_progress

    def check_all(self) -> None:
        """Check every argument against the schema, those left to the domain included (see ``Tool.domain``)."""
        check_schema(self.schema, self.args)


Handler = Callable[[Call], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Tool:
    """One MCP tool.

    Attributes:
        name: The tool's name (the reference's where it has one).
        description: What it does, for the agent.
        schema: The exact input schema.
        handler: Runs the call; returns a JSON object.
        mutation: It changes something: it runs only when ``LOOPSQ_MCP_ALLOW_MUTATIONS`` allows mutations and,
            when ``LOOPSQ_MCP_ALLOW_TOOLS`` is set, it names this tool (``arguments.check_gates``).
        domain: Arguments whose values loopsq's own validation checks first, with its messages; the handler
            calls ``Call.check_all`` once that passed.
    """

    name: str
    description: str
    schema: dict[str, Any]
    handler: Handler
    mutation: bool = False
    domain: frozenset[str] = field(default_factory=frozenset)
    destructive: bool = False
    idempotent: bool = False

    @property
    def read_only(self) -> bool:
        return not self.mutation

    def to_mcp(self) -> types.Tool:
        """The tool as ``tools/list`` shows it (a mutation tool's description says what lets it run)."""
        return types.Tool(
            name=self.name,
            description=f"{self.description} {MUTATION_NOTE}" if self.mutation else self.description,
            input_schema=self.schema,
            annotations=types.ToolAnnotations(read_only_hint=self.read_only, destructive_hint=self.destructive,
                                              idempotent_hint=self.idempotent or self.read_only,
                                              open_world_hint=False),
        )


def in_thread(fn: Callable[[Call], dict[str, Any]]) -> Handler:
    """A handler running the blocking ``fn(call)`` (Redis, SQLite) in a worker thread."""

    async def handler(call: Call) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(fn, call)

    handler.__name__ = fn.__name__
    return handler
