"""The MCP server's mutation tools, over stdio and streamable HTTP with the SDK's own client, against a real Redis
and a worker process: the environment gate refusing with the reference's text, each mutation working once it
passes with no confirm literal (OpenLoops 0.4.0), the LOOPSQ_MCP_ALLOW_TOOLS allowlist, ``loop_run_now``/
``workflow_run`` waiting with progress notifications, cancels reaching a running process, bad input refused with
the CLI's (or the API's) one line while nothing is written (issue 17, points 4-6), and an oversized argument
refused before it is read whole, the server's memory staying bounded."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from loopsq.domain import timeutil
from loopsq.mcp.arguments import MUTATIONS_REFUSED
from loopsq.sdk import LoopsClient
from loopsq.state.loops import LoopStore
from loopsq.state.runs import RunStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from tests.integration.mcp_harness import TOKEN, TRANSPORTS, Deployment, error, ok, open_deployment, wait_for
from tests.integration.processes import Cluster
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HOURLY = {"type": "interval", "everyMs": 3_600_000}
PROMPT = ("Fix the flaky integration test in the payments service, then open a pull request that explains the "
          "root cause.")
SECRET = "s3cret-token-99"
PIPELINE: dict[str, Any] = {"name": "pipeline", "steps": [
    {"id": "build", "target": {"type": "command", "command": "echo built", "shell": True}},
    {"id": "test", "target": {"type": "command", "command": "echo tested", "shell": True}, "dependsOn": ["build"]},
]}
SLOW: dict[str, Any] = {"name": "slow", "steps": [
    {"id": "hold", "target": {"type": "command", "command": "echo holding; sleep 60", "shell": True}}]}
MUTATIONS = ("loop_pause", "loop_resume", "loop_create_command", "loop_create_agent", "loop_create_workflow",
             "loop_update", "loop_trigger", "run_cancel", "loop_run_now", "workflow_run", "notification_add",
             "notification_remove")


def setup(cluster: Cluster) -> None:
    client = LoopsClient(cluster.url)
    try:
        for transport in TRANSPORTS:
            for name, command in (("steady", "echo steady"), ("progress", "echo started; sleep 1.5; echo finished"),
                                  ("sleeper", "echo going; sleep 60"), ("triggered", "echo triggered")):
                client.create({"name": f"{name}-{transport}", "timezone": "UTC", "schedule": HOURLY,
                               "target": {"type": "command", "command": command, "shell": True}})
        WorkflowStore(client.client).create(PIPELINE, timeutil.now())
        WorkflowStore(client.client).create(SLOW, timeutil.now())
    finally:
        client.close()


@pytest.fixture(scope="module")
def deployment(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    yield from open_deployment(redis_server.url, tmp_path_factory.mktemp("mcp-mutations"), setup)


def valid_calls(transport: str) -> dict[str, dict[str, Any]]:
    """A call of each mutation tool that would succeed."""
    return {
        "loop_pause": {"idOrName": f"steady-{transport}"},
        "loop_resume": {"idOrName": f"steady-{transport}"},
        "loop_create_command": {"name": f"gated-{transport}", "command": "echo", "schedule": HOURLY},
        "loop_create_agent": {"name": f"gated-agent-{transport}", "provider": "claude", "prompt": "hello",
                              "schedule": HOURLY},
        "loop_create_workflow": {"name": f"gated-wf-{transport}", "workflow": "pipeline", "schedule": HOURLY},
        "loop_update": {"idOrName": f"steady-{transport}", "changes": {"maxAttempts": 2}},
        "loop_trigger": {"idOrName": f"steady-{transport}", "idempotencyKey": "gate"},
        "run_cancel": {"runId": "0123456789ab"},
        "loop_run_now": {"idOrName": f"steady-{transport}"},
        "workflow_run": {"idOrName": "pipeline"},
        "notification_add": {"name": f"gated-{transport}", "webhook": "http://127.0.0.1:9/hook"},
        "notification_remove": {"name": f"gated-{transport}"},
    }


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_every_mutation_tool_is_refused_unless_the_environment_allows_mutations(deployment: Deployment,
                                                                                transport: str) -> None:
    before = deployment.state()

    async def scenario(client: Client) -> dict[str, str]:
        out = {tool: error(await client.call_tool(tool, args)) for tool, args in valid_calls(transport).items()}
        # an older client's confirm literal opens nothing
        out["with confirm"] = error(await client.call_tool("loop_pause", {"idOrName": f"steady-{transport}",
                                                                          "confirm": "pause-loop"}))
        return out

    assert MUTATIONS_REFUSED == "MCP mutation tools require LOOPSQ_MCP_ALLOW_MUTATIONS=true"
    assert deployment.run(transport, scenario, allow=False) == dict.fromkeys([*MUTATIONS, "with confirm"],
                                                                             MUTATIONS_REFUSED)
    if transport == "stdio":  # a value outside 1|true|yes|on refuses too
        for value in ("false",):
            params = deployment.stdio_params(allow=False, env={"LOOPSQ_MCP_ALLOW_MUTATIONS": value})
            assert set(deployment.run("stdio", scenario, params=params).values()) == {MUTATIONS_REFUSED}
    assert deployment.state() == before


def test_the_allowlist_lets_only_the_tools_it_names_run(deployment: Deployment) -> None:
    params = deployment.stdio_params(env={"LOOPSQ_MCP_ALLOW_TOOLS": "loop_pause,loop_resume"})
    calls = valid_calls("stdio")
    others = [tool for tool in MUTATIONS if tool not in ("loop_pause", "loop_resume")]

    async def refusals(client: Client) -> tuple[dict[str, Any], dict[str, str]]:
        runtime = json.loads((await client.read_resource("loopsq://runtime")).contents[0].text)  # type: ignore[union-attr]
        return runtime, {tool: error(await client.call_tool(tool, calls[tool])) for tool in others}

    async def allowed(client: Client) -> list[str]:
        return [ok(await client.call_tool(tool, calls[tool]))["status"] for tool in ("loop_pause", "loop_resume")]

    before = deployment.state()
    runtime, refused = deployment.run("stdio", refusals, params=params)
    assert deployment.state() == before
    assert (runtime["mutationsAllowed"], runtime["allowedTools"]) == (True, ["loop_pause", "loop_resume"])
    assert refused == {tool: f"MCP tool {tool} is not in LOOPSQ_MCP_ALLOW_TOOLS (loop_pause, loop_resume)"
                       for tool in others}
    assert deployment.run("stdio", allowed, params=params) == ["paused", "active"]


def test_a_bad_allowlist_stops_loopsq_mcp_before_it_serves_exit_2(deployment: Deployment) -> None:
    params = deployment.stdio_params(env={"LOOPSQ_MCP_ALLOW_TOOLS": "create_loop,pause_loop"})
    done = subprocess.run([params.command, *params.args], env=params.env, cwd=params.cwd, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == ("error: LOOPSQ_MCP_ALLOW_TOOLS must name mutation tools (loop_pause, loop_resume, "
                           "loop_create_command, loop_create_agent, loop_create_workflow, loop_update, loop_trigger, run_cancel, "
                           "loop_run_now, workflow_run, notification_add, notification_remove), got 'create_loop'\n")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_lifecycle_creates_and_trigger_work_without_any_confirm_once_mutations_are_allowed(deployment: Deployment,
                                                                                            transport: str) -> None:
    t = transport
    pipeline = WorkflowStore(deployment.client).require("pipeline")

    async def scenario(client: Client) -> dict[str, Any]:
        async def call(tool: str, **args: Any) -> dict[str, Any]:
            return ok(await client.call_tool(tool, args))

        return {
            "paused": await call("loop_pause", idOrName=f"steady-{t}"),
            "resumed": await call("loop_resume", idOrName=f"steady-{t}"),
            "command": await call("loop_create_command", name=f"cmd-{t}", command="echo", args=["hello"],
                                  env={"API_KEY": SECRET}, timezone="UTC", maxAttempts=2, timeoutMs=None,
                                  schedule={"type": "interval", "everyMs": 90_000, "anchor": "fixed_delay"}),
            "agent": await call("loop_create_agent", name=f"agent-{t}", provider="codex", prompt=PROMPT,
                                schedule={"type": "cron", "expression": "0 9 * * 1-5"}, timezone="Europe/Paris",
                                configIsolation="none", description="nightly fixer"),
            "workflow": await call("loop_create_workflow", name=f"wf-{t}", workflow="pipeline",
                                   workflowInput={"BRANCH": "main"}, timeoutMs=600_000,
                                   schedule={"type": "once", "at": "2099-01-01T00:00:00Z"}),
            "dynamic": await call("loop_create_command", name=f"dyn-{t}", command="true",
                                  schedule={"type": "dynamic"}),
            "trigger": await call("loop_trigger", idOrName=f"triggered-{t}", idempotencyKey="order-42"),
            # an older client still sending a confirm literal: ignored, whatever it says
            "old client": await call("loop_pause", idOrName=f"dyn-{t}", confirm="anything"),
            "again": await call("loop_trigger", idOrName=f"triggered-{t}", idempotencyKey="order-42"),
        }

    out = deployment.run(transport, scenario)
    loops = LoopStore(deployment.client)
    assert (out["paused"]["status"], out["resumed"]["status"]) == ("paused", "active")
    assert loops.require(f"steady-{t}").status == "active"

    command = loops.require(f"cmd-{t}")
    assert out["command"]["id"] == command.id and out["command"]["target"]["env"] == "[redacted]"
    assert command.target == {"type": "command", "command": "echo", "shell": False, "args": ["hello"],
                              "env": {"API_KEY": SECRET}, "timeoutMs": None}
    assert (command.max_attempts, command.timezone, command.schedule.anchor) == (2, "UTC", "fixed_delay")
    assert command.description == (
        f"Why: keep cmd-{t} running as a loopsq scheduled automation. How: command \"echo\" on cadence every 90s "
        "(fixed delay). Outcome: record each run, status, retries, and evidence in loopsq for operator review.")

    agent = loops.require(f"agent-{t}")
    assert agent.target["prompt"] == PROMPT and out["agent"]["target"]["prompt"].startswith(PROMPT[:80] + "... ")
    assert (agent.target["configIsolation"], agent.description) == ("none", "nightly fixer")
    assert agent.schedule.expression == "0 9 * * 1-5" and agent.timezone == "Europe/Paris"

    workflow = loops.require(f"wf-{t}")
    assert workflow.target == {"type": "workflow", "workflowId": pipeline["id"], "input": {"BRANCH": "main"},
                               "timeoutMs": 600_000}
    assert workflow.next_run_at == "2099-01-01T00:00:00.000Z"
    assert "How: workflow pipeline on cadence once at 2099-01-01T00:00:00Z." in str(workflow.description)
    assert loops.require(f"dyn-{t}").schedule.min_interval_ms == 60_000
    assert out["old client"]["status"] == "paused"

    assert out["trigger"]["created"] is True
    assert out["again"] == {"runId": out["trigger"]["runId"], "created": False}
    runs = RunStore(deployment.client)
    run = wait_for(lambda: (r := runs.get(out["trigger"]["runId"])) and r.status != "running" and r, 30,
                   "the triggered run to end")
    assert (run.status, run.source, run.stdout, run.idempotency_key) == ("succeeded", "trigger", "triggered\n",
                                                                         "order-42")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_loop_run_now_with_wait_returns_the_finished_run_after_progress_notifications(deployment: Deployment,
                                                                                      transport: str) -> None:
    async def scenario(client: Client) -> tuple[dict[str, Any], list[tuple[float, float | None, str | None]],
                                                dict[str, Any]]:
        seen: list[tuple[float, float | None, str | None]] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            seen.append((value, total, message))

        args = {"idOrName": f"progress-{transport}", "wait": 60}
        waited = ok(await client.call_tool("loop_run_now", args, progress_callback=progress))
        shown = ok(await client.call_tool("loop_run_now", {**args, "showOutput": True}))
        return waited, seen, shown

    waited, seen, shown = deployment.run(transport, scenario)
    assert (waited["status"], waited["runNow"]) == (
        "succeeded", {"source": "ad_hoc", "advancesLoop": False, "finished": True})
    assert waited["stdout"] == "[redacted 17 chars]"  # "started\nfinished\n"
    assert (shown["status"], shown["stdout"], shown["runNow"]["finished"]) == ("succeeded", "started\nfinished\n", True)
    values = [value for value, _total, _message in seen]
    assert values == sorted(values) and len(set(values)) == len(values), seen
    assert {total for _value, total, _message in seen} == {60}
    messages = [str(message) for _value, _total, message in seen]
    run_id = waited["id"]
    assert any(m.startswith(f"run {run_id} running\n") and "started" in m for m in messages), messages
    assert messages[-1] == f"run {run_id} succeeded"
    assert RunStore(deployment.client).get(run_id).status == "succeeded"  # type: ignore[union-attr]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_workflow_run_with_wait_returns_the_ended_run_and_without_it_hands_the_run_to_a_worker(
        deployment: Deployment, transport: str) -> None:
    async def scenario(client: Client) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
        messages: list[str] = []

        async def progress(_value: float, _total: float | None, message: str | None) -> None:
            messages.append(str(message))

        args = {"idOrName": "pipeline"}
        waited = ok(await client.call_tool("workflow_run", {**args, "wait": 60, "showOutput": True},
                                           progress_callback=progress))
        return waited, messages, ok(await client.call_tool("workflow_run", args))

    waited, messages, queued = deployment.run(transport, scenario)
    assert (waited["status"], waited["finished"], waited["workflowName"]) == ("succeeded", True, "pipeline")
    assert [(s["stepId"], s["status"], s["stdout"]) for s in waited["steps"]] == [
        ("build", "succeeded", "built\n"), ("test", "succeeded", "tested\n")]
    assert messages[-1] == f"workflow run {waited['runId']} succeeded"
    assert (queued["status"], queued["finished"]) == ("queued", False) and "steps" not in queued
    store = WorkflowRunStore(deployment.client)
    ended = wait_for(lambda: (s := store.load(queued["runId"])) is not None and s.terminal and s, 30,
                     "the queued workflow run to end")
    assert ended.run["status"] == "succeeded"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_run_cancel_stops_a_running_loop_run_and_a_running_workflow_run(deployment: Deployment,
                                                                        transport: str) -> None:
    store = WorkflowRunStore(deployment.client)

    async def scenario(client: Client) -> dict[str, Any]:
        out: dict[str, Any] = {}
        out["started"] = ok(await client.call_tool("loop_run_now", {"idOrName": f"sleeper-{transport}"}))
        run_id = out["started"]["id"]
        out["pid"] = (await anyio_wait(lambda: (r := RunStore(deployment.client).get(run_id)) and r.pid))
        with anyio.fail_after(10):  # the live window, while it runs
            while not (live := ok(await client.call_tool("run_logs", {"runId": run_id})))["stdout"]:
                await anyio.sleep(0.1)
        out["live"] = live
        out["cancelled"] = ok(await client.call_tool("run_cancel", {"runId": run_id, "reason": "stop it"}))
        out["again"] = ok(await client.call_tool("run_cancel", {"runId": run_id}))
        queued = ok(await client.call_tool("workflow_run", {"idOrName": "slow"}))
        out["step_pid"] = await anyio_wait(lambda: (s := store.load(queued["runId"])) is not None
                                           and s.steps["hold"].get("pid"))
        out["wf_cancelled"] = ok(await client.call_tool("run_cancel", {"runId": queued["runId"]}))
        out["missing"] = error(await client.call_tool("run_cancel", {"runId": "nope"}))
        return out

    out = deployment.run(transport, scenario)
    assert (out["started"]["status"], out["started"]["runNow"]["finished"]) == ("running", False)
    assert out["live"] == {"runId": out["started"]["id"], "kind": "loopRun", "status": "running", "source": "live",
                           "stdout": "going\n", "stderr": "", "omittedChars": {"stdout": 0, "stderr": 0}}
    cancelled = out["cancelled"]
    assert (cancelled["kind"], cancelled["cancelRequested"]) == ("loopRun", True)
    assert (cancelled["run"]["status"], cancelled["run"]["error"]) == ("failed", "cancelled by user: stop it")
    assert not psutil.pid_exists(out["pid"]) or psutil.Process(out["pid"]).status() == psutil.STATUS_ZOMBIE
    assert (out["again"]["cancelRequested"], out["again"]["run"]) == (False, cancelled["run"])
    wf = out["wf_cancelled"]
    assert (wf["kind"], wf["cancelRequested"], wf["workflowRun"]["status"]) == ("workflowRun", True, "cancelled")
    assert wf["workflowRun"]["error"] == "cancelled by user"
    wait_for(lambda: not psutil.pid_exists(out["step_pid"]), 10, "the cancelled step's process to be killed")
    assert out["missing"] == "run not found: nope"


async def anyio_wait(predicate: Any, timeout: float = 30) -> Any:
    """Poll a blocking ``predicate`` from async code until it returns something truthy."""
    with anyio.fail_after(timeout):
        while not (value := predicate()):
            await anyio.sleep(0.05)
    return value


BAD_SPEC = {"name": "broken", "steps": [{"id": "a", "target": {"type": "command", "command": "true",
                                                               "shell": True}, "dependsOn": ["zzz"]}]}


def cli_cases(tmp: Path) -> list[tuple[str, dict[str, Any], list[str]]]:
    """Bad input that the CLI takes too: (tool, arguments, the CLI command)."""
    spec = tmp / "broken.json"
    spec.write_text(json.dumps(BAD_SPEC))
    every = {"schedule": HOURLY}
    return [
        ("loops_show", {"idOrName": "nope"}, ["show", "nope"]),
        ("loop_runs", {"idOrName": "nope"}, ["runs", "nope"]),
        ("loop_pause", {"idOrName": "nope"}, ["pause", "nope"]),
        ("loop_resume", {"idOrName": "nope"}, ["resume", "nope"]),
        ("loop_trigger", {"idOrName": "nope"}, ["trigger", "nope"]),
        ("loop_run_now", {"idOrName": "nope"}, ["run-now", "nope"]),
        ("workflow_read", {"idOrName": "nope"}, ["workflows", "show", "nope"]),
        ("workflow_run", {"idOrName": "nope"}, ["workflows", "run", "nope"]),
        ("workflow_run_inspect", {"runId": "nope"}, ["workflows", "inspect", "nope"]),
        ("run_logs", {"runId": "nope"}, ["logs", "nope"]),
        ("workflow_validate", {"workflow": BAD_SPEC}, ["workflows", "validate", str(spec)]),
        ("loop_create_workflow", {"name": "x", "workflow": "nope", **every},
         ["create", "workflow", "x", "--workflow", "nope", "--every", "1h"]),
        ("loop_create_command", {"name": " ", "command": "true", **every},
         ["create", "command", " ", "--cmd", "true", "--every", "1h"]),
        ("loop_create_command", {"name": "steady-stdio", "command": "true", **every},
         ["create", "command", "steady-stdio", "--cmd", "true", "--every", "1h"]),
    ]


def api_cases() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Bad loop bodies the HTTP API takes too: (tool, arguments, the API's body)."""
    def command(**extra: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        args = {"name": "bad", "command": "echo hi", "shell": True, "schedule": HOURLY, **extra}
        body = {k: v for k, v in args.items() if k not in ("command", "shell")}
        return args, {**body, "target": {"type": "command", "command": "echo hi", "shell": True}}

    cases = [command(schedule={"type": "interval", "everyMs": 0}), command(schedule={"type": "cron",
                                                                                      "expression": "61 * * * *"}),
             command(schedule={"type": "weekly"}), command(catchUp="sometimes"), command(maxAttempts=0),
             command(timezone="Mars/Olympus"), command(expiresAt="soon"), command(schedule={"type": "once",
                                                                                            "at": "tomorrow"})]
    out = [("loop_create_command", args, body) for args, body in cases]
    out.append(("loop_create_command", {"name": "bad", "command": "echo hi", "schedule": HOURLY},
                {"name": "bad", "schedule": HOURLY, "target": {"type": "command", "command": "echo hi",
                                                               "shell": False}}))
    out.append(("loop_create_agent", {"name": "bad", "provider": "gpt", "prompt": "x", "schedule": HOURLY},
                {"name": "bad", "schedule": HOURLY, "target": {"type": "agent", "provider": "gpt", "prompt": "x"}}))
    return out


SCHEMA_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("loops_list", {"limit": 0}, "limit must be an integer from 1 to 500, got 0"),
    ("loops_list", {"status": "sleeping"}, 'status must be one of active, paused, stopped, expired, all, got "sleeping"'),
    ("loops_list", {"bogus": 1},
     'unknown argument "bogus" (expected one of: status, limit, includeArchived, archivedOnly, tags)'),
    ("loops_show", {}, "idOrName is required"),
    ("loops_show", {"idOrName": 5}, "idOrName must be a string, got 5"),
    ("loops_show", {"idOrName": "x", "showOutput": "yes"}, 'showOutput must be a boolean, got "yes"'),
    ("loop_runs", {"status": "done"},
     'status must be one of running, succeeded, failed, timed_out, abandoned, skipped, missed, got "done"'),
    ("workflows_list", {"offset": -1}, "offset must be an integer from 0 to 100000, got -1"),
    ("run_logs", {"runId": "x", "maxChars": 0}, "maxChars must be an integer from 1 to 262144, got 0"),
    ("loop_run_now", {"idOrName": "steady-stdio", "wait": 601},
     "wait must be a number from 0 to 600, got 601"),
    ("loop_trigger", {"idOrName": "steady-stdio", "idempotencyKey": ""},
     'idempotencyKey must be a non-empty string, got ""'),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": {"type": "interval", "everyMs": 1000,
                                                                          "every": 5}},
     'unknown field "every" in schedule (expected one of: type, everyMs, anchor)'),
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "catchUpLimit": None},
     "catchUpLimit must be an integer, got null"),
    ("run_cancel", {"runId": "x", "reason": ""}, 'reason must be a non-empty string, got ""'),
    ("loop_create_command", {"name": "x" * 201, "command": "true", "schedule": HOURLY},
     'name must be at most 200 characters, got "' + "x" * 64 + '… (137 more characters)"'),
    # a domain field: the domain's message (the schema's bound is the same)
    ("loop_create_command", {"name": "x", "command": "true", "schedule": HOURLY, "args": ["a"] * 257},
     'target.args must be an array of at most 256 strings, got ["a", "a", "a", "a", "a", "a", "a", "a", "a", "a", '
     '"a", "a", "a"…'),
    ("workflows_list", {"status": "active", "limit": 1, "offset": 0, "x" * 5000: 1},
     f'unknown argument "{"x" * 64}… (4936 more characters)" (expected one of: status, limit, offset, tags)'),
]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_input_is_one_line_with_the_clis_or_the_apis_message_and_writes_nothing(
        deployment: Deployment, transport: str, tmp_path: Path) -> None:
    cases = cli_cases(tmp_path)
    expected_cli = []
    for _tool, _args, command in cases:
        done = deployment.cluster.cli(*command, check=False)
        assert done.returncode in (1, 2) and done.stderr.startswith("error: ") and done.stderr.count("\n") == 1
        expected_cli.append(done.stderr.removeprefix("error: ").rstrip("\n"))
    expected_api = []
    for _tool, _args, body in api_cases():
        response = httpx.post(f"{deployment.web}/api/loops", json=body, headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=10)
        assert response.status_code == 400, response.text
        expected_api.append(response.json()["error"]["message"])
    before = deployment.state()

    async def scenario(client: Client) -> tuple[list[str], list[str], list[str]]:
        async def refused(tool: str, args: dict[str, Any]) -> str:
            return error(await client.call_tool(tool, args))

        return ([await refused(tool, args) for tool, args, _ in cases],
                [await refused(tool, args) for tool, args, _ in api_cases()],
                [await refused(tool, args) for tool, args, _ in SCHEMA_CASES])

    from_cli, from_api, from_schema = deployment.run(transport, scenario)
    assert from_cli == expected_cli
    assert from_api == expected_api
    assert from_schema == [message for _tool, _args, message in SCHEMA_CASES]
    assert deployment.state() == before


HUGE = 50 * 1_048_576
#: What the stdio server may reach, at its peak, having been sent a 50 MB argument (it starts at about 80 MB; the
#: SDK's own reader, which holds and parses the whole line, reached several times the argument's size).
MAX_PEAK_RSS_MB = 200


def _stdio_server() -> psutil.Process:
    found = [p for p in psutil.Process().children(recursive=True) if p.cmdline()[-1:] == ["mcp"]]
    assert len(found) == 1, found
    return found[0]


def _peak_rss_mb(proc: psutil.Process) -> float:
    with open(f"/proc/{proc.pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def test_an_oversized_argument_is_refused_unread_and_the_stdio_servers_memory_stays_bounded(
        deployment: Deployment) -> None:
    before = deployment.state()

    async def scenario(client: Client) -> tuple[str, float, float, dict[str, Any]]:
        server = _stdio_server()
        at_start = _peak_rss_mb(server)
        with pytest.raises(MCPError) as refused:
            await client.call_tool("loop_create_command", {"name": "huge", "command": "x" * HUGE,
                                                           "schedule": HOURLY})
        peak = _peak_rss_mb(server)
        listed = ok(await client.call_tool("loops_list", {"limit": 1}))  # the session goes on
        return refused.value.error.message, at_start, peak, listed

    message, at_start, peak, listed = deployment.run("stdio", scenario)
    print(f"stdio server peak RSS: {at_start:.0f} MB at start, {peak:.0f} MB after a {HUGE >> 20} MB argument")
    prefix = "MCP message must be at most 1048576 bytes, got "
    assert message.startswith(prefix) and int(message.removeprefix(prefix)) > HUGE, message
    assert peak < MAX_PEAK_RSS_MB, (at_start, peak)
    assert len(listed["items"]) == 1
    assert deployment.state() == before


def test_an_oversized_request_to_the_http_transport_is_answered_413_unread(deployment: Deployment) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"loops_list","arguments":{"x":"' + \
        b"y" * 2_097_152 + b'"}}}'
    response = httpx.post(f"{deployment.web}/mcp", content=body, timeout=30,
                          headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json",
                                   "Accept": "application/json, text/event-stream"})
    assert response.status_code == 413
    assert response.json()["error"]["message"] == f"request body must be at most 1048576 bytes, got {len(body)}"


#: ``loop_update`` changes refused by the domain, with the messages ``PATCH /api/loops/{loop}`` gives.
UPDATE_BAD = [{"name": "x"}, {"nope": 1}, {"schedule": None}, {"maxAttempts": 0},
              {"target": {"type": "workflow", "workflowId": "ghost"}}]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_loop_update_edits_in_place_and_refuses_what_the_api_refuses(deployment: Deployment, transport: str) -> None:
    name = f"triggered-{transport}"
    loops = LoopStore(deployment.client)
    before_loop = loops.require(name)
    expected = []
    for changes in UPDATE_BAD:
        response = httpx.patch(f"{deployment.web}/api/loops/{name}", json=changes,
                               headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert response.status_code == 400, response.text
        expected.append(response.json()["error"]["message"])
    before = deployment.state()

    async def refusals(client: Client) -> list[str]:
        return [error(await client.call_tool("loop_update", {"idOrName": name, "changes": changes}))
                for changes in UPDATE_BAD] + [
            error(await client.call_tool("loop_update", {"idOrName": "ghost-loop", "changes": {"maxAttempts": 2}}))]

    assert deployment.run(transport, refusals) == [*expected, "loop not found: ghost-loop"]
    assert deployment.state() == before

    async def edit(client: Client) -> dict[str, Any]:
        return ok(await client.call_tool("loop_update", {"idOrName": name, "changes": {
            "schedule": {"type": "interval", "everyMs": 7_200_000}, "description": "edited"}}))

    out = deployment.run(transport, edit)
    after = loops.require(name)
    assert (out["id"], out["description"], after.id, after.name) == (before_loop.id, "edited", before_loop.id, name)
    assert after.schedule.every_ms == 7_200_000 and after.description == "edited"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tags_set_by_the_create_tools_filter_the_list_tools(deployment: Deployment, transport: str) -> None:
    t = transport

    async def scenario(client: Client) -> dict[str, Any]:
        async def call(tool: str, **args: Any) -> dict[str, Any]:
            return ok(await client.call_tool(tool, args))

        await call("loop_create_command", name=f"tagged-a-{t}", command="true", schedule=HOURLY,
                   tags={"team": f"data-{t}", "env": "prod"})
        await call("loop_create_command", name=f"tagged-b-{t}", command="true", schedule=HOURLY,
                   tags={"team": f"web-{t}", "env": "prod"})
        return {
            "team": await call("loops_list", tags={"team": f"data-{t}"}),
            "both": await call("loops_list", tags={"team": f"web-{t}", "env": "prod"}),
            "none": await call("loops_list", tags={"team": f"data-{t}", "env": "dev"}),
            "runs": await call("loop_runs", tags={"team": f"data-{t}"}),
            "bad": error(await client.call_tool("loops_list", {"tags": {"a b": "c"}})),
        }

    out = deployment.run(transport, scenario)
    assert [loop["name"] for loop in out["team"]["items"]] == [f"tagged-a-{t}"]
    assert out["team"]["items"][0]["tags"] == {"env": "prod", "team": f"data-{t}"}
    assert [loop["name"] for loop in out["both"]["items"]] == [f"tagged-b-{t}"]
    assert out["none"]["items"] == [] and out["runs"]["items"] == []
    assert out["bad"] == 'tags must match ^[A-Za-z0-9_./-]{1,64}$, got "a b"'  # (the schema's key pattern)
