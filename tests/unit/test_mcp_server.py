"""The MCP server's pieces without processes: the gates and their texts, the published schemas, the one-line
messages of schema errors, the error mapping of a tool call, and ``loopsq mcp list-tools``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator

from loopsq.cli import cli
from loopsq.errors import ValidationError
from loopsq.mcp import server
from loopsq.mcp.arguments import MUTATIONS_REFUSED, check_gates, check_schema
from loopsq.mcp.context import McpContext
from loopsq.mcp.mutation_tools import schedule_label
from loopsq.mcp.registry import Call, Tool

MUTATIONS = {"loop_pause": "pause-loop", "loop_resume": "resume-loop", "loop_create_command": "create-command-loop",
             "loop_create_agent": "create-agent-loop", "loop_create_workflow": "create-workflow-loop",
             "loop_trigger": "trigger-loop", "run_cancel": "cancel-run", "loop_run_now": "run-now",
             "workflow_run": "run-workflow"}
HOURLY = {"type": "interval", "everyMs": 3_600_000}


@pytest.mark.parametrize("value", ["1", "true", "yes", "on", "TRUE", " On "])
def test_the_environment_gate_opens_on_the_references_values(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("LOOPSQ_MCP_ALLOW_MUTATIONS", value)
    assert McpContext.mutations_allowed() is True
    check_gates({"confirm": "pause-loop"}, "pause-loop", McpContext.mutations_allowed())


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
        check_gates({"confirm": "pause-loop"}, "pause-loop", McpContext.mutations_allowed())
    assert refused.value.message == MUTATIONS_REFUSED == "MCP mutation tools require LOOPSQ_MCP_ALLOW_MUTATIONS=true"


def test_the_reference_variable_does_not_open_loopsqs_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPSQ_MCP_ALLOW_MUTATIONS", raising=False)
    monkeypatch.setenv("LOOPS_MCP_ALLOW_MUTATIONS", "true")
    assert McpContext.mutations_allowed() is False


@pytest.mark.parametrize("confirm", [None, "", "Pause-loop", "pause-loop ", "resume-loop", 1])
def test_the_confirm_gate_needs_the_exact_literal(confirm: Any) -> None:
    arguments = {} if confirm is None else {"confirm": confirm}
    with pytest.raises(ValidationError) as refused:
        check_gates(arguments, "pause-loop", True)
    assert refused.value.message == "confirm must be exactly 'pause-loop'"


def test_every_schema_is_valid_exact_and_gated_as_its_tool() -> None:
    assert [t.name for t in server.TOOLS if t.confirm] == list(MUTATIONS)
    for tool in server.TOOLS:
        Draft202012Validator.check_schema(tool.schema)
        closed = [tool.schema]
        while closed:
            schema = closed.pop()
            if schema.get("type") == "object" and "properties" in schema:
                assert schema["additionalProperties"] is False, (tool.name, schema)
            closed.extend(v for v in schema.get("properties", {}).values() if isinstance(v, dict))
            closed.extend(schema.get("oneOf", []))
        literal = MUTATIONS.get(tool.name)
        assert tool.confirm == literal
        if literal is not None:
            assert tool.schema["properties"]["confirm"] == {"type": "string", "const": literal,
                                                            "description": f"Must be exactly '{literal}'."}
            assert "confirm" in tool.schema["required"]
        else:
            assert "confirm" not in tool.schema["properties"]


@pytest.mark.parametrize(("tool", "arguments", "message"), [
    ("loops_list", {"limit": 501}, "limit must be an integer from 1 to 500, got 501"),
    ("loops_list", {"limit": True}, "limit must be an integer, got true"),
    ("loops_list", {"status": None}, "status must be one of active, paused, stopped, expired, all, got null"),
    ("loop_runs", {"idOrName": ""}, 'idOrName must be a non-empty string, got ""'),
    ("run_logs", {}, "runId is required"),
    ("loop_trigger", {"idOrName": "x", "idempotencyKey": "k" * 201, "confirm": "trigger-loop"},
     "idempotencyKey must be at most 200 characters, got \"" + "k" * 56 + "..."),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": {"type": "interval", "everyMs": 0.5},
                             "confirm": "create-command-loop"}, "schedule.everyMs must be an integer, got 0.5"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": {"type": "cron"},
                             "confirm": "create-command-loop"}, "schedule.expression is required"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "account": {"tool": "t"},
                             "confirm": "create-command-loop"}, "account.profile is required"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "env": {"A": 1},
                             "confirm": "create-command-loop"}, "env.A must be a string, got 1"),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "args": ["a", 2],
                             "confirm": "create-command-loop"}, "args[1] must be a string, got 2"),
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
