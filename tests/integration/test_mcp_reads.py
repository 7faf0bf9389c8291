"""The MCP server's listing, resources, read-only tools and redaction, over stdio (``loopsq mcp``) and over
streamable HTTP (``loopsq web`` at ``/mcp``), with the SDK's own client, on a real Redis with real runs that a
worker process executed; and the HTTP transport's token check (issue 17, points 1-3 and 6)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from loopsq import __version__
from loopsq.domain import timeutil
from loopsq.mcp.registry import MUTATION_NOTE
from loopsq.sdk import LoopsClient
from loopsq.state.workflows import WorkflowStore
from loopsq.web.auth import COOKIE_NAME
from tests.integration.mcp_harness import TOKEN, TRANSPORTS, Deployment, error, ok, open_deployment
from tests.integration.processes import Cluster
from tests.redis_server import RedisServer, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

READ_TOOLS = ["loops_list", "loops_show", "loop_runs", "loops_doctor", "workflows_list", "workflow_read",
              "workflow_validate", "workflow_run_inspect", "run_logs", "notifications_list", "notification_log"]
MUTATION_TOOLS = ["loop_pause", "loop_resume", "loop_create_command", "loop_create_agent", "loop_create_workflow",
                  "loop_update", "loop_trigger", "run_cancel", "loop_run_now", "workflow_run", "notification_add",
                  "notification_remove"]
PROMPT = ("Review every open pull request, list the failing checks of each one, and propose a fix for every "
          "failure you find.")
SECRET = "s3cret-value-42"
PIPELINE: dict[str, Any] = {"name": "pipeline", "steps": [
    {"id": "build", "target": {"type": "command", "command": "echo built", "shell": True}},
    {"id": "test", "target": {"type": "command", "command": "echo tested; echo warned >&2", "shell": True,
                              "env": {"TOKEN": SECRET}}, "dependsOn": ["build"]},
]}
REVIEW: dict[str, Any] = {"name": "review", "steps": [
    {"id": "review", "target": {"type": "agent", "provider": "claude", "prompt": PROMPT}}]}
HOURLY = {"type": "interval", "everyMs": 3_600_000}


def setup(cluster: Cluster) -> None:
    """Two loops (one run by the worker), two workflow specs (one run by the worker)."""
    client = LoopsClient(cluster.url)
    try:
        client.create({"name": "echo-loop", "timezone": "UTC", "schedule": HOURLY,
                       "target": {"type": "command", "command": 'echo "out $LOOPS_RUN_ID"; echo "err line" >&2',
                                  "shell": True, "env": {"API_KEY": SECRET}}})
        client.create({"name": "agent-loop", "timezone": "UTC", "schedule": HOURLY,
                       "target": {"type": "agent", "provider": "claude", "prompt": PROMPT}})
        WorkflowStore(client.client).create(PIPELINE, timeutil.now())
        WorkflowStore(client.client).create(REVIEW, timeutil.now())
    finally:
        client.close()
    cluster.cli("run-now", "echo-loop")
    cluster.cli("workflows", "run", "pipeline")


@pytest.fixture(scope="module")
def deployment(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from open_deployment(redis_server.url, tmp_path_factory.mktemp("mcp-reads"), setup)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_tools_and_resources_are_listed_with_exact_schemas(deployment: Deployment, transport: str) -> None:
    listed_by_cli = json.loads(deployment.cluster.cli("mcp", "list-tools").stdout)

    async def scenario(client: Client) -> dict[str, Any]:
        tools = (await client.list_tools()).tools
        resources = (await client.list_resources()).resources
        templates = (await client.list_resource_templates()).resource_templates
        contents = {uri: json.loads((await client.read_resource(uri)).contents[0].text)  # type: ignore[union-attr]
                    for uri in ("loopsq://runtime", "loopsq://tools", "loopsq://loops/echo-loop")}
        with pytest.raises(MCPError) as missing:
            await client.read_resource("loopsq://loops/nope")
        shown = ok(await client.call_tool("loops_show", {"idOrName": "echo-loop"}))
        return {"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools],
                "resources": [str(r.uri) for r in resources], "templates": [t.uri_template for t in templates],
                "contents": contents, "missing": missing.value.error.message, "shown": shown,
                "server": client.server_info}

    seen = deployment.run(transport, scenario)
    assert [t["name"] for t in seen["tools"]] == READ_TOOLS + list(MUTATION_TOOLS)
    assert seen["tools"] == listed_by_cli == seen["contents"]["loopsq://tools"]
    for tool in seen["tools"]:
        schema = tool["inputSchema"]
        assert (schema["type"], schema["additionalProperties"]) == ("object", False), tool["name"]
        mutation = tool["name"] in MUTATION_TOOLS
        assert tool["annotations"]["readOnlyHint"] is not mutation
        assert "confirm" not in schema["properties"] and "confirm" not in schema.get("required", [])
        assert tool["description"].endswith(MUTATION_NOTE) is mutation
    create = next(t for t in seen["tools"] if t["name"] == "loop_create_command")
    branches = create["inputSchema"]["properties"]["schedule"]["oneOf"]  # a tagged union on "type"
    assert [b["properties"]["type"]["const"] for b in branches] == ["once", "interval", "cron", "dynamic"]
    assert seen["resources"] == ["loopsq://runtime", "loopsq://tools"]
    assert seen["templates"] == ["loopsq://loops/{idOrName}"]
    runtime = seen["contents"]["loopsq://runtime"]
    assert runtime["version"] == __version__ and runtime["redisUrl"] == deployment.cluster.url
    assert (runtime["mutationsAllowed"], runtime["allowedTools"]) == (True, None)
    assert runtime["dataDir"].endswith("mcp-data" if transport == "stdio" else "web-data")
    assert seen["contents"]["loopsq://loops/echo-loop"] == seen["shown"]
    assert seen["missing"] == "loop not found: nope"
    assert (seen["server"].name, seen["server"].version) == ("loopsq", __version__)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_read_tool_answers_from_real_runs(deployment: Deployment, transport: str, tmp_path: Path) -> None:
    async def scenario(client: Client) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, tool, args in [
            ("loops_list", "loops_list", {}), ("paused", "loops_list", {"status": "paused"}),
            ("archived", "loops_list", {"archivedOnly": True}), ("one", "loops_list", {"limit": 1}),
            ("loops_show", "loops_show", {"idOrName": "echo-loop", "includeLatestRun": True, "showOutput": True}),
            ("loop_runs", "loop_runs", {"idOrName": "echo-loop", "showOutput": True}),
            ("succeeded", "loop_runs", {"status": "succeeded"}),
            ("loops_doctor", "loops_doctor", {}),
            ("workflows_list", "workflows_list", {}), ("page", "workflows_list", {"limit": 1, "offset": 1}),
            ("workflow_read", "workflow_read", {"idOrName": "pipeline", "includeEvents": True, "showOutput": True}),
            ("validate", "workflow_validate", {"workflow": PIPELINE, "name": "renamed"}),
            ("validate_json", "workflow_validate", {"workflowJson": json.dumps(PIPELINE), "preflight": True}),
        ]:
            out[key] = ok(await client.call_tool(tool, args))
        run = out["loop_runs"]["items"][0]
        wf_run = out["workflow_read"]["runs"][0]["workflowRun"]
        out["inspect"] = ok(await client.call_tool("workflow_run_inspect", {"runId": wf_run["id"]}))
        out["logs"] = ok(await client.call_tool("run_logs", {"runId": run["id"], "maxChars": 5}))
        out["step_logs"] = ok(await client.call_tool("run_logs", {"runId": wf_run["id"], "stepId": "test"}))
        out["both"] = error(await client.call_tool("workflow_validate", {"workflow": PIPELINE,
                                                                         "workflowJson": "{}"}))
        out["neither"] = error(await client.call_tool("workflow_validate", {}))
        return out

    cli_list = json.loads(deployment.cluster.cli("list", "--json").stdout)
    out = deployment.run(transport, scenario)
    assert out["loops_list"]["items"] == cli_list
    assert [loop["name"] for loop in cli_list] == ["echo-loop", "agent-loop"]
    assert out["paused"] == {"items": []} and out["archived"] == {"items": []}
    assert out["one"]["items"] == cli_list[:1]

    latest = out["loops_show"]["latestRun"]
    assert (latest["status"], latest["source"], latest["exitCode"]) == ("succeeded", "ad_hoc", 0)
    assert latest["stdout"] == f"out {latest['id']}\n" and latest["stderr"] == "err line\n"
    assert out["loop_runs"]["items"] == [latest]
    assert [r["id"] for r in out["succeeded"]["items"]] == [latest["id"]]

    checks = {c["id"]: c for c in out["loops_doctor"]["checks"]}
    assert checks["redis"]["status"] == "ok" and checks["worker"]["status"] == "ok"
    assert checks["scheduler"] == {"id": "scheduler", "status": "warn",
                                   "message": "no scheduler is running; start `loopsq scheduler`"}
    assert out["loops_doctor"]["ok"] is all(c["status"] != "fail" for c in checks.values())

    assert sorted(w["name"] for w in out["workflows_list"]["items"]) == ["pipeline", "review"]
    assert out["page"]["offset"] == 1 and len(out["page"]["items"]) == 1 and out["page"]["nextOffset"] is None

    detail = out["workflow_read"]["runs"][0]
    assert out["workflow_read"]["workflow"]["name"] == "pipeline"
    assert detail["workflowRun"]["status"] == "succeeded"
    assert [(s["stepId"], s["status"], s["stdout"]) for s in detail["steps"]] == [
        ("build", "succeeded", "built\n"), ("test", "succeeded", "tested\n")]
    assert detail["events"][0]["eventType"] == "created"
    assert out["inspect"]["workflowRun"] == detail["workflowRun"]
    assert [e["sequence"] for e in out["inspect"]["events"]] == list(range(1, len(detail["events"]) + 1))

    assert out["validate"]["valid"] is True
    assert (out["validate"]["workflow"]["name"], out["validate"]["workflow"]["id"]) == ("renamed", "validation")
    assert [p["stepId"] for p in out["validate_json"]["preflight"]] == ["build", "test"]
    assert out["both"] == "use workflow or workflowJson, not both"
    assert out["neither"] == "workflow or workflowJson is required"

    assert out["logs"] == {"runId": latest["id"], "kind": "loopRun", "status": "succeeded", "source": "record",
                           "stdout": latest["stdout"][-5:], "stderr": "line\n",
                           "omittedChars": {"stdout": len(latest["stdout"]) - 5, "stderr": 4}}
    assert out["step_logs"]["steps"] == [{"stepId": "test", "status": "succeeded", "source": "record",
                                          "stdout": "tested\n", "stderr": "warned\n",
                                          "omittedChars": {"stdout": 0, "stderr": 0}}]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_prompts_env_and_output_are_redacted_as_the_cli_redacts_them(deployment: Deployment, transport: str
                                                                     ) -> None:
    cli_show = json.loads(deployment.cluster.cli("show", "agent-loop", "--json").stdout)
    # What `show` adds beside the loop itself (the MCP tool does not print the command line and its digest yet).
    for extra in ("historyWindow", "lastRun", "commandLine", "commandEnvKeys", "commandDigest"):
        cli_show.pop(extra, None)
    cli_runs = json.loads(deployment.cluster.cli("runs", "echo-loop", "--json").stdout)

    async def scenario(client: Client) -> dict[str, Any]:
        return {
            "agent": ok(await client.call_tool("loops_show", {"idOrName": "agent-loop"})),
            "command": ok(await client.call_tool("loops_show", {"idOrName": "echo-loop", "includeLatestRun": True})),
            "list": ok(await client.call_tool("loops_list", {})),
            "runs": ok(await client.call_tool("loop_runs", {"idOrName": "echo-loop"})),
            "specs": ok(await client.call_tool("workflows_list", {})),
            "read": ok(await client.call_tool("workflow_read", {"idOrName": "pipeline", "includeRuns": True})),
            "resource": (await client.read_resource("loopsq://loops/agent-loop")).contents[0].text,  # type: ignore[union-attr]
        }

    out = deployment.run(transport, scenario)
    prompt = out["agent"]["target"]["prompt"]
    assert prompt == PROMPT[:80] + f"... [redacted {len(PROMPT) - 80} chars]"
    assert out["agent"] == cli_show and json.loads(out["resource"]) == cli_show
    assert out["command"]["target"]["env"] == "[redacted]"
    run = out["command"]["latestRun"]
    stdout = "out " + run["id"] + "\n"
    assert run["stdout"] == f"[redacted {len(stdout)} chars]" and run["stderr"] == "[redacted 9 chars]"
    assert out["runs"]["items"] == cli_runs
    listed = {loop["name"]: loop["target"] for loop in out["list"]["items"]}
    assert listed["agent-loop"]["prompt"] == prompt and listed["echo-loop"]["env"] == "[redacted]"
    steps = {s["name"]: s["steps"] for s in out["specs"]["items"]}
    assert steps["review"][0]["target"]["prompt"] == prompt
    assert steps["pipeline"][1]["target"]["env"] == "[redacted]"
    assert [s["stdout"] for s in out["read"]["runs"][0]["steps"]] == ["[redacted 6 chars]", "[redacted 7 chars]"]
    everything = json.dumps(out)
    assert SECRET not in everything and PROMPT not in everything


def test_a_password_in_the_redis_url_is_masked_in_the_runtime_and_in_errors(deployment: Deployment) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"  # nothing listens there: every call fails
    params = deployment.stdio_params(redis_url=url)

    async def scenario(client: Client) -> tuple[dict[str, Any], str]:
        runtime = json.loads((await client.read_resource("loopsq://runtime")).contents[0].text)  # type: ignore[union-attr]
        return runtime, error(await client.call_tool("loops_list", {}))

    runtime, message = deployment.run("stdio", scenario, params=params)
    masked = url.replace("hunter2", "***")
    assert runtime["redisUrl"] == masked
    assert message.startswith(f"cannot reach Redis at {masked}: ") and "hunter2" not in message, message
    cli = deployment.cluster.cli("--redis-url", url, "list", check=False)
    assert (cli.returncode, cli.stderr) == (3, f"error: {message}\n")


def leaves(group: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(group, BaseExceptionGroup):
        return [leaf for inner in group.exceptions for leaf in leaves(inner)]
    return [group]


INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                         "clientInfo": {"name": "t", "version": "1"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token-0123456789", f"Bearer {TOKEN}x", "Basic abc"])
def test_the_http_transport_refuses_a_missing_or_wrong_token(deployment: Deployment, authorization: str | None
                                                             ) -> None:
    before = deployment.state()
    headers = {**MCP_HEADERS, **({"Authorization": authorization} if authorization else {})}
    response = httpx.post(f"{deployment.web}/mcp", json=INITIALIZE, headers=headers, timeout=10)
    message = ("missing API token: send the header 'Authorization: Bearer <LOOPSQ_API_TOKEN>'" if authorization is None
               else "malformed Authorization header: expected 'Bearer <token>'" if authorization == "Basic abc"
               else "invalid API token")
    assert (response.status_code, response.json()) == (
        401, {"error": {"status": 401, "code": "unauthorized", "message": message}})
    # The dashboard's session cookie opens pages, never the MCP endpoint.
    login = httpx.post(f"{deployment.web}/login", data={"token": TOKEN, "next": "/"}, timeout=10)
    session = login.cookies.get(COOKIE_NAME) or login.history[0].cookies.get(COOKIE_NAME) if login.history else \
        login.cookies.get(COOKIE_NAME)
    assert session, (login.status_code, login.headers)
    assert httpx.get(f"{deployment.web}/", cookies={COOKIE_NAME: session}, timeout=10).status_code == 200
    cookie = {"Cookie": f"{COOKIE_NAME}={session}"}
    assert httpx.post(f"{deployment.web}/mcp", json=INITIALIZE, headers={**MCP_HEADERS, **cookie},
                      timeout=10).status_code == 401
    with pytest.raises(ExceptionGroup) as refused:  # the SDK's client: its task group fails on the 401
        deployment.run("http", lambda client: client.list_tools(), token=authorization and "wrong-token-0123456789")
    assert any(isinstance(leaf, MCPError) for leaf in leaves(refused.value)), refused.value
    assert deployment.state() == before
    good = httpx.post(f"{deployment.web}/mcp", json=INITIALIZE, headers={**MCP_HEADERS, "Authorization":
                                                                         f"Bearer {TOKEN}"}, timeout=10)
    assert good.status_code == 200 and '"serverInfo"' in good.text



def test_the_readmes_mcp_configuration_snippet_starts_a_working_server(deployment: Deployment) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("## MCP server"):]
    snippet = json.loads(section[section.index("```json") + len("```json"):section.index("```\n", section.index(
        "```json") + 7)])
    entry = snippet["mcpServers"]["loopsq"]
    assert (entry["command"], entry["args"]) == ("loopsq", ["mcp"])
    assert entry["env"]["LOOPSQ_REDIS_URL"].startswith("redis://")
    env = {**deployment.cluster.env, **entry["env"], "LOOPSQ_REDIS_URL": deployment.cluster.url,
           "LOOPSQ_DATA_DIR": str(deployment.cluster.tmp / "snippet-data")}
    params = StdioServerParameters(command=str(Path(sys.executable).with_name(entry["command"])),
                                   args=entry["args"], env=env, cwd=str(deployment.cluster.tmp))

    async def scenario(client: Client) -> tuple[int, list[str]]:
        listed = ok(await client.call_tool("loops_list", {}))
        return len((await client.list_tools()).tools), [loop["name"] for loop in listed["items"]]

    assert deployment.run("stdio", scenario, params=params) == (len(READ_TOOLS) + len(MUTATION_TOOLS),
                                                               ["echo-loop", "agent-loop"])


def test_loops_list_shows_archived_loops_only_when_asked(deployment: Deployment) -> None:
    async def scenario(client: Client) -> dict[str, list[str]]:
        lists = {}
        for key, args in (("default", {}), ("only", {"archivedOnly": True}), ("all", {"includeArchived": True})):
            lists[key] = [loop["name"] for loop in ok(await client.call_tool("loops_list", args))["items"]]
        return lists

    deployment.cluster.cli("archive", "agent-loop")
    try:
        lists = deployment.run("stdio", scenario)
    finally:
        deployment.cluster.cli("unarchive", "agent-loop")
    assert lists == {"default": ["echo-loop"], "only": ["agent-loop"], "all": ["echo-loop", "agent-loop"]}


INITIALIZE = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}


def test_every_malformed_stdio_line_gets_a_json_rpc_error_and_the_session_goes_on(deployment: Deployment) -> None:
    # Raw lines, no SDK client: the SDK's server dropped all of these but the last unanswered.
    bad = ['{"jsonrpc": "2.0", "id": 1, "method": "ping"', '{"jsonrpc": "2.0", "id": 2}',
           '{"jsonrpc": "2.0", "id": 3, "method": 5}', '[{"jsonrpc": "2.0", "id": 4, "method": "ping"}]',
           '{"jsonrpc": "2.0", "id": 5, "method": "ping", "params": [1]}', '{"id": 6, "method": "ping"}',
           '{"jsonrpc": "2.0", "id": null, "method": "ping"}', '{"jsonrpc": "2.0", "id": true, "method": "ping"}',
           '"ping"', '{"jsonrpc": "2.0", "id": 7, "method": "ping"}']
    lines = [json.dumps(INITIALIZE), '{"jsonrpc": "2.0", "method": "notifications/initialized"}', *bad]
    params = deployment.stdio_params()
    # stdin stays open until every reply is read: at the end of its input the server drops requests still in flight.
    proc = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=params.env, cwd=params.cwd)
    killer = threading.Timer(60, proc.kill)  # a missing reply fails the test instead of hanging it
    killer.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n".join(lines) + "\n")
        proc.stdin.flush()
        replies = [json.loads(proc.stdout.readline() or "null") for _ in range(1 + len(bad))]
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        killer.cancel()
        proc.kill()
    assert replies[0]["id"] == 0 and "result" in replies[0]

    def refused(code: int, ident: int | None, message: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": message}}

    assert replies[1:] == [
        refused(-32700, None, "invalid JSON: Expecting ',' delimiter: line 1 column 45 (char 44)"),
        refused(-32600, 2, 'invalid JSON-RPC message: missing "method"'),
        refused(-32600, 3, 'invalid JSON-RPC message: "method" must be a string, got 5'),
        refused(-32600, None, "invalid JSON-RPC message: batches are not supported: send one message a line"),
        refused(-32600, 5, 'invalid JSON-RPC message: "params" must be an object, got [1]'),
        refused(-32600, 6, 'invalid JSON-RPC message: missing "jsonrpc": "2.0"'),
        refused(-32600, None, 'invalid JSON-RPC message: "id" must be a string or an integer, got null'),
        refused(-32600, None, 'invalid JSON-RPC message: "id" must be a string or an integer, got true'),
        refused(-32600, None, 'invalid JSON-RPC message: a message must be a JSON object, got "ping"'),
        {"jsonrpc": "2.0", "id": 7, "result": {}},
    ]


@pytest.mark.parametrize(("transport", "length"), [("stdio", 100_000), ("http", 10_000)])
def test_not_found_errors_quote_a_short_prefix_of_a_long_name(deployment: Deployment, transport: str,
                                                              length: int) -> None:
    # Over HTTP the SDK's client also sends the resource's URI in a header, which the server's HTTP parser bounds
    # (a 100 KB one is refused as an invalid HTTP request): 10 KB there.
    name = "x" * length

    async def scenario(client: Client) -> tuple[str, Any, str]:
        with pytest.raises(MCPError) as missing:
            await client.read_resource(f"loopsq://loops/{name}")
        shown = error(await client.call_tool("loops_show", {"idOrName": name[:200]}))
        return missing.value.error.message, missing.value.error.data, shown

    message, data, shown = deployment.run(transport, scenario)
    assert message == f"loop not found: {'x' * 64}… ({length - 64} more characters)"
    assert data == {"uri": f"loopsq://loops/{'x' * 49}… ({length + 15 - 64} more characters)"}
    assert shown == f"loop not found: {'x' * 64}… (136 more characters)"
