"""Notification endpoints through the SDK (``LoopsClient.notifications``, ``notification_add``, ``_remove``,
``_log``) and the MCP tools (``notifications_list``, ``notification_log``, ``notification_add``,
``notification_remove``; the last two behind the mutation gate), on fakeredis (issue 31, point 4): the same
endpoints, secrets and one-line errors as ``loopsq notify`` and ``/api/notifications``; bad input writes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import redis

from loopsq.errors import NotFoundError, ValidationError
from loopsq.mcp import server
from loopsq.mcp.arguments import MUTATIONS_REFUSED
from loopsq.mcp.context import McpContext
from loopsq.sdk import LoopsClient
from loopsq.state.keys import Keys
from loopsq.state.notify import NotifyStore

HOOK = "http://127.0.0.1:9/hook"
ATTEMPT = {"at": "2026-01-01T00:00:00.000Z", "type": "failed", "id": "msg_1", "attempt": 1, "status": 500,
           "ok": False, "error": "HTTP 500"}


def state(client: redis.Redis) -> dict[str, Any]:
    return {key: client.dump(key) for key in sorted(client.keys("*"))}


@pytest.fixture
def sdk(fake_redis: redis.Redis) -> LoopsClient:
    return LoopsClient(client=fake_redis)


def test_the_sdk_adds_lists_logs_and_removes_notifications(sdk: LoopsClient, fake_redis: redis.Redis) -> None:
    made = sdk.notification_add("ops", HOOK, on=["failed", "overdue"], tags={"team": "data"},
                                alert_after_ms=7_200_000)
    assert made["secret"].startswith("whsec_")
    assert {k: v for k, v in made.items() if k not in ("secret", "createdAt")} == {
        "name": "ops", "webhook": HOOK, "on": ["failed", "overdue"], "tags": {"team": "data"},
        "alertAfterMs": 7_200_000}
    again = sdk.notification_add("ops", HOOK + "2")  # replaced: its secret kept, and not shown again
    assert "secret" not in again and again["on"] == ["failed", "recovered", "missed", "paused"]
    assert NotifyStore(fake_redis, Keys()).get("ops").secret == made["secret"]  # type: ignore[union-attr]
    assert sdk.notifications() == [{**again, "pending": 0}]
    NotifyStore(fake_redis, Keys()).log_attempt("ops", ATTEMPT)
    assert sdk.notification_log("ops") == sdk.notification_log() == [{"notification": "ops", **ATTEMPT}]
    sdk.notification_remove("ops")
    assert sdk.notifications() == []
    with pytest.raises(NotFoundError, match=r'^notification not found: ops$'):
        sdk.notification_remove("ops")


@pytest.mark.parametrize(("call", "message"), [
    (lambda c: c.notification_add("ops", "ftp://x"), 'webhook must be an http(s) URL, got "ftp://x"'),
    (lambda c: c.notification_add("Ops!", HOOK),
     'notification name must be a label ([a-z0-9][a-z0-9._:/-]{0,63}), got "Ops!"'),
    (lambda c: c.notification_add("ops", HOOK, on=["boom"]),
     'on takes failed, recovered, missed, paused, overdue, got "boom"'),
    (lambda c: c.notification_add("ops", HOOK, alert_after_ms=0),
     "alertAfterMs must be a duration greater than zero such as 2h, got 0"),
    (lambda c: c.notification_log("ops", limit=0), "limit must be an integer from 1 to 1000, got 0"),
])
def test_bad_sdk_input_is_one_message_and_writes_nothing(sdk: LoopsClient, fake_redis: redis.Redis, call: Any,
                                                          message: str) -> None:
    before = state(fake_redis)
    with pytest.raises(ValidationError) as refused:
        call(sdk)
    assert refused.value.message == message
    assert state(fake_redis) == before


# -- MCP ---------------------------------------------------------------------------------------------------------
@pytest.fixture
def ctx(fake_redis: redis.Redis, tmp_path: Path) -> Iterator[McpContext]:
    context = McpContext("redis://fake-redis.invalid:6379/0", tmp_path, client=fake_redis)
    yield context


def call(ctx: McpContext, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    async def progress(_v: float, _t: float | None, _m: str | None) -> None:
        return None

    async def main() -> tuple[bool, Any]:
        result = await server.call_tool(ctx, tool, arguments, progress)
        text = result.content[0].text  # type: ignore[union-attr]
        return bool(result.is_error), text if result.is_error else json.loads(text)

    return anyio.run(main)


def test_the_mcp_mutations_are_gated_and_the_reads_are_not(ctx: McpContext, fake_redis: redis.Redis,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOOPSQ_MCP_ALLOW_MUTATIONS", raising=False)
    assert call(ctx, "notification_add", {"name": "ops", "webhook": HOOK}) == (True, MUTATIONS_REFUSED)
    assert call(ctx, "notification_remove", {"name": "ops"}) == (True, MUTATIONS_REFUSED)
    assert fake_redis.keys("*") == []
    assert call(ctx, "notifications_list", {}) == (False, {"items": []})
    tools = {tool.name: tool for tool in server.TOOLS}
    assert [tools[n].mutation for n in ("notifications_list", "notification_log", "notification_add",
                                        "notification_remove")] == [False, False, True, True]


def test_the_mcp_tools_add_list_log_and_remove(ctx: McpContext, fake_redis: redis.Redis,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_MCP_ALLOW_MUTATIONS", "true")
    failed, made = call(ctx, "notification_add", {"name": "ops", "webhook": HOOK, "on": ["failed"],
                                                  "tags": {"team": "data"}, "alertAfterMs": 60_000})
    assert not failed and made["secret"].startswith("whsec_") and made["on"] == ["failed"]
    listed = call(ctx, "notifications_list", {})[1]["items"]
    assert listed == [{**{k: v for k, v in made.items() if k != "secret"}, "pending": 0}]
    NotifyStore(fake_redis, Keys()).log_attempt("ops", ATTEMPT)
    assert call(ctx, "notification_log", {"name": "ops", "limit": 5}) == (
        False, {"items": [{"notification": "ops", **ATTEMPT}]})
    assert call(ctx, "notification_log", {"name": "nope"}) == (True, "notification not found: nope")
    assert call(ctx, "notification_remove", {"name": "ops"}) == (False, {"removed": True, "name": "ops"})
    assert call(ctx, "notification_remove", {"name": "ops"}) == (True, "notification not found: ops")


@pytest.mark.parametrize(("arguments", "message"), [
    ({"name": "ops", "webhook": "ftp://x"}, 'webhook must be an http(s) URL, got "ftp://x"'),
    ({"name": "ops", "webhook": HOOK, "on": ["boom"]},
     'on takes failed, recovered, missed, paused, overdue, got "boom"'),
    ({"name": "ops", "webhook": HOOK, "alertAfterMs": "2h"}, 'alertAfterMs must be an integer, got "2h"'),
    ({"name": "ops"}, "webhook is required"),
    ({"name": "ops", "webhook": HOOK, "secret": "x"},
     'unknown argument "secret" (expected one of: name, webhook, on, tags, alertAfterMs)'),
])
def test_bad_mcp_input_is_one_line_and_writes_nothing(ctx: McpContext, fake_redis: redis.Redis,
                                                      monkeypatch: pytest.MonkeyPatch, arguments: dict[str, Any],
                                                      message: str) -> None:
    monkeypatch.setenv("LOOPSQ_MCP_ALLOW_MUTATIONS", "true")
    assert call(ctx, "notification_add", arguments) == (True, message)
    assert fake_redis.keys("*") == []
