"""The MCP server's pieces without processes: the mutation gate and its texts (no confirm literal: OpenLoops 0.4.0),
the LOOPSQ_MCP_ALLOW_TOOLS allowlist, the published schemas (exact and bounded), the one-line messages of schema
errors, the error mapping of a tool call, ``loopsq mcp list-tools``, and the bounded stdio reader."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from loopsq.cli import cli
from loopsq.errors import ValidationError
from loopsq.mcp import server
from loopsq.mcp.arguments import MUTATIONS_REFUSED, check_gates, check_schema, parse_allowed_tools
from loopsq.mcp.context import McpContext
from loopsq.mcp.mutation_tools import schedule_label
from loopsq.mcp.registry import MUTATION_NOTE, Call, Tool
from loopsq.mcp.stdio import READ_CHUNK, BoundedLines, request_id

MUTATIONS = ("loop_pause", "loop_resume", "loop_create_command", "loop_create_agent", "loop_create_workflow",
             "loop_update", "loop_trigger", "run_cancel", "loop_run_now", "workflow_run", "notification_add",
             "notification_remove")
ALLOW_TOOLS_RULE = ("LOOPSQ_MCP_ALLOW_TOOLS must name mutation tools (loop_pause, loop_resume, loop_create_command, "
                    "loop_create_agent, loop_create_workflow, loop_update, loop_trigger, run_cancel, loop_run_now, workflow_run, "
                    "notification_add, notification_remove)")
HOURLY = {"type": "interval", "everyMs": 3_600_000}


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", " On "])
def test_the_environment_gate_opens_on_the_references_values(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("LOOPSQ_MCP_ALLOW_MUTATIONS", value)
    assert McpContext.mutations_allowed() is True
    check_gates("loop_pause", McpContext.mutations_allowed(), None)


@pytest.mark.parametrize("value", [None, "", "0", "false", "no", "off", "y", "enabled", "LOOPS_MCP_ALLOW_MUTATIONS"])
def test_the_environment_gate_stays_shut_otherwise_with_the_references_text(monkeypatch: pytest.MonkeyPatch,
                                                                           value: str | None) -> None:
    monkeypatch.delenv("LOOPS_MCP_ALLOW_MUTATIONS", raising=False)
    if value is None:
        monkeypatch.delenv("LOOPSQ_MCP_ALLOW_MUTATIONS", raising=False)
    else:
        monkeypatch.setenv("LOOPSQ_MCP_ALLOW_MUTATIONS", value)
    assert McpContext.mutations_allowed() is False
    with pytest.raises(ValidationError) as refused:
        check_gates("loop_pause", McpContext.mutations_allowed(), None)
    assert refused.value.message == MUTATIONS_REFUSED == "MCP mutation tools require LOOPSQ_MCP_ALLOW_MUTATIONS=true"


def test_the_reference_variable_does_not_open_loopsqs_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPSQ_MCP_ALLOW_MUTATIONS", raising=False)
    monkeypatch.setenv("LOOPS_MCP_ALLOW_MUTATIONS", "true")
    assert McpContext.mutations_allowed() is False


def test_no_argument_is_part_of_the_gate_and_the_allowlist_narrows_it() -> None:
    check_gates("loop_pause", True, None)
    check_gates("loop_pause", True, frozenset({"loop_pause", "loop_trigger"}))
    with pytest.raises(ValidationError) as refused:
        check_gates("run_cancel", True, frozenset({"loop_trigger", "loop_pause"}))
    assert refused.value.message == "MCP tool run_cancel is not in LOOPSQ_MCP_ALLOW_TOOLS (loop_pause, loop_trigger)"
    with pytest.raises(ValidationError) as refused:  # the environment gate comes first
        check_gates("loop_pause", False, frozenset({"loop_pause"}))
    assert refused.value.message == MUTATIONS_REFUSED


@pytest.mark.parametrize(("text", "allowed"), [
    (None, None), ("", None), (" , ", None), ("loop_pause", {"loop_pause"}),
    (" loop_create_command,loop_pause ,, loop_pause", {"loop_create_command", "loop_pause"}),
])
def test_the_allowlist_reads_comma_separated_mutation_tool_names(text: str | None, allowed: set[str] | None) -> None:
    assert parse_allowed_tools(text, server.MUTATION_TOOLS) == (None if allowed is None else frozenset(allowed))


@pytest.mark.parametrize(("text", "bad"), [
    ("create_loop,pause_loop", "create_loop"), ("loop_pause,loops_list", "loops_list"),
    ("loop_pause, Loop_Resume", "Loop_Resume"), ("loop_pause;loop_resume", "loop_pause;loop_resume"),
])
def test_a_name_that_is_no_mutation_tool_is_bad_input(text: str, bad: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_allowed_tools(text, server.MUTATION_TOOLS)
    assert refused.value.message == f"{ALLOW_TOOLS_RULE}, got '{bad}'"


@pytest.mark.parametrize("command", [["mcp"], ["web", "--port", "0"], ["up", "--no-web", "--workers", "1"]])
def test_a_bad_allowlist_stops_the_server_before_it_starts_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  command: list[str]) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", "redis://127.0.0.1:9/0")  # never reached
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LOOPSQ_API_TOKEN", "t" * 32)
    monkeypatch.setenv("LOOPSQ_MCP_ALLOW_TOOLS", "create_loop,pause_loop")
    if command[0] == "up":
        command = ["up"]  # up checks what its web app would refuse
    result = CliRunner().invoke(cli, command, catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {ALLOW_TOOLS_RULE}, got 'create_loop'\n")


def test_every_schema_is_valid_exact_bounded_and_carries_no_confirm_literal() -> None:
    assert [t.name for t in server.TOOLS if t.mutation] == list(MUTATIONS) == list(server.MUTATION_TOOLS)
    for tool in server.TOOLS:
        Draft202012Validator.check_schema(tool.schema)
        assert "confirm" not in json.dumps(tool.schema), tool.name
        mcp = tool.to_mcp()
        assert mcp.description == (f"{tool.description} {MUTATION_NOTE}" if tool.mutation else tool.description)
        nodes = [tool.schema]
        while nodes:
            schema = nodes.pop()
            kind = schema.get("type")
            kinds = kind if isinstance(kind, list) else [kind]
            if "object" in kinds and "properties" in schema and schema is not tool.schema.get("properties", {}).get(
                    "workflow"):
                assert schema["additionalProperties"] is False, (tool.name, schema)
            if "string" in kinds:
                assert isinstance(schema.get("maxLength"), int), (tool.name, schema)
            if "array" in kinds:
                assert isinstance(schema.get("maxItems"), int), (tool.name, schema)
            if "object" in kinds and schema.get("additionalProperties") not in (False, None):
                assert isinstance(schema.get("maxProperties"), int), (tool.name, schema)
            if "object" in kinds and "properties" not in schema:
                assert isinstance(schema.get("maxProperties"), int), (tool.name, schema)
            nodes.extend(v for v in schema.get("properties", {}).values() if isinstance(v, dict))
            nodes.extend(schema.get("oneOf", []))
            for key in ("items", "additionalProperties", "propertyNames"):
                if isinstance(schema.get(key), dict):
                    nodes.append(schema[key])
    # enums and consts are bounded by their values; a few of the bounds, from domain.limits:
    props = server.TOOLS_BY_NAME["loop_create_command"].schema["properties"]
    assert (props["name"]["maxLength"], props["command"]["maxLength"], props["args"]["maxItems"],
            props["args"]["items"]["maxLength"], props["env"]["maxProperties"]) == (200, 16_384, 256, 4_096, 128)
    assert server.TOOLS_BY_NAME["workflow_validate"].schema["properties"]["workflowJson"]["maxLength"] == 1_048_576


@pytest.mark.parametrize(("tool", "arguments", "message"), [
    ("loops_list", {"limit": 501}, "limit must be an integer from 1 to 500, got 501"),
    ("loops_list", {"limit": True}, "limit must be an integer, got true"),
    ("loops_list", {"status": None}, "status must be one of active, paused, stopped, expired, all, got null"),
    ("loop_runs", {"idOrName": ""}, 'idOrName must be a non-empty string, got ""'),
    ("run_logs", {}, "runId is required"),
    ("loop_trigger", {"idOrName": "x", "idempotencyKey": "k" * 201},
     "idempotencyKey must be at most 200 characters, got \"" + "k" * 64 + "… (137 more characters)\""),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": {"type": "interval", "everyMs": 0.5}},
     "schedule.everyMs must be an integer, got 0.5"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": {"type": "cron"}},
     "schedule.expression is required"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "account": {"tool": "t"}},
     "account.profile is required"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "env": {"A": 1}},
     "env.A must be a string, got 1"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "args": ["a", 2]},
     "args[1] must be a string, got 2"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "args": ["a"] * 257},
     "args must have at most 256 items, got 257"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY,
                             "env": {f"K{i}": "v" for i in range(129)}}, "env must have at most 128 entries, got 129"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "requires": ["GPU!"]},
     'requires[0] must match ^[a-z0-9][a-z0-9._:/-]{0,63}$, got "GPU!"'),
    ("workflow_validate", {"workflowJson": "x" * 1_048_577},
     'workflowJson must be at most 1048576 characters, got "' + "x" * 64 + '… (1048513 more characters)"'),
    ("workflow_validate", {"workflow": {"steps": [{}] * 101}}, "workflow.steps must have at most 100 items, got 101"),
])
def test_a_schema_error_is_one_line_naming_the_argument_and_the_value(tool: str, arguments: dict[str, Any],
                                                                      message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        check_schema(server.TOOLS_BY_NAME[tool].schema, arguments)
    assert refused.value.message == message


def test_schedule_labels_read_as_the_cadence() -> None:
    assert schedule_label({"type": "interval", "everyMs": 300_000, "anchor": "fixed_rate"}, "UTC") == "every 5m"
    assert schedule_label({"type": "cron", "expression": "0 9 * * *"}, "Europe/Paris") == "cron 0 9 * * * (Europe/Paris)"
    assert schedule_label({"type": "once", "at": "2030-01-01T00:00:00.000Z"}, "UTC") == \
        "once at 2030-01-01T00:00:00.000Z"
    assert schedule_label({"type": "dynamic", "minIntervalMs": 60_000}, "UTC") == "dynamic, at least 1m apart"


def _call(ctx: McpContext, tool: Tool, arguments: dict[str, Any]) -> tuple[bool, str]:
    async def progress(_v: float, _t: float | None, _m: str | None) -> None:
        return None

    async def main() -> tuple[bool, str]:
        result = await server.call_tool(ctx, tool.name, arguments, progress)
        return bool(result.is_error), result.content[0].text  # type: ignore[union-attr]

    return anyio.run(main)


def test_an_unexpected_failure_is_a_tool_error_that_keeps_its_details_in_the_log(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def crash(_call: Call) -> dict[str, Any]:
        raise RuntimeError("secret internals")

    broken = Tool("broken", "crashes", {"type": "object", "properties": {}, "additionalProperties": False}, crash)
    monkeypatch.setitem(server.TOOLS_BY_NAME, "broken", broken)
    ctx = McpContext("redis://127.0.0.1:1/0", tmp_path)
    try:
        assert _call(ctx, broken, {}) == (True, "internal error in broken (RuntimeError); see the server's log")
        assert "secret internals" in caplog.text
        assert _call(ctx, Tool("nope", "", {}, crash), {}) == (True, "unknown tool: nope")
    finally:
        ctx.close()


def test_list_tools_prints_the_tool_list_as_json() -> None:
    result = CliRunner().invoke(cli, ["mcp", "list-tools"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == server.tool_list()
    assert [t["name"] for t in server.tool_list()][:2] == ["loops_list", "loops_show"]


# -- the bounded stdio reader ------------------------------------------------------------------------------------
class _Replies:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, item: Any) -> None:
        self.sent.append(item.message)


def _read_all(lines: BoundedLines, chunks: list[bytes]) -> list[str]:
    async def main() -> list[str]:
        out: list[str] = []
        for chunk in [*chunks, b""]:
            await lines.take(chunk)
        out.extend([line async for line in lines])
        return out

    return anyio.run(main)


def test_the_reader_gives_lines_across_chunks_and_a_last_line_without_newline() -> None:
    lines = BoundedLines(-1, 100)
    assert _read_all(lines, [b'{"a":', b'1}\n\n{"b"', b":2}\n", b'{"c":3}']) == ['{"a":1}', '{"b":2}', '{"c":3}']


def test_an_oversized_message_is_answered_with_its_id_and_the_next_one_is_read() -> None:
    replies = _Replies()
    lines = BoundedLines(-1, 1000)
    lines.reply_to(replies)
    big = b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{"x":"' + b"y" * 5000 + b'"}}}\n'
    assert _read_all(lines, [big[:700], big[700:], b'{"jsonrpc":"2.0","id":8}\n']) == ['{"jsonrpc":"2.0","id":8}']
    [error] = replies.sent
    assert (error.id, error.error.code, error.error.message) == (
        7, -32600, f"MCP message must be at most 1000 bytes, got {len(big) - 1}")


@pytest.mark.parametrize(("head", "tail", "ident"), [
    (b'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"id":99', b"", 12),
    (b'{"id": "req-\\"1", "params": {', b"", 'req-"1'),
    (b'{"jsonrpc":"2.0","method":"tools/call","params":{"arguments":{"id":5', b'"}}},"id":3}', 3),
    (b'{"jsonrpc":"2.0","method":"tools/call","params":{"arguments":{"id":5', b'"}}}}', None),
    (b'{"id": true, "params": 1', b"", None),
])
def test_the_id_of_an_oversized_message_is_found_in_its_head_or_at_its_end(head: bytes, tail: bytes,
                                                                           ident: int | str | None) -> None:
    assert request_id(head, tail) == ident


def test_the_reader_holds_no_more_than_its_bound_of_a_50_mb_message() -> None:
    chunk = b"z" * READ_CHUNK
    replies = _Replies()
    lines = BoundedLines(-1, 1_048_576)
    lines.reply_to(replies)

    async def main() -> None:
        await lines.take(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x":"')
        for _ in range(50 * 1_048_576 // READ_CHUNK):
            await lines.take(chunk)
        await lines.take(b'"}}\n')

    tracemalloc.start()
    try:
        anyio.run(main)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1_048_576, peak
    assert [e.id for e in replies.sent] == [1]
