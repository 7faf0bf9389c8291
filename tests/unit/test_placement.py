"""``requires`` and ``pool`` on loops, workflows and steps: validated in the domain, stored and read back (loops
stored before the fields too), shown by ``show``/``list``, and a pool that does not exist refused by every
interface with one line naming the field and the value, exit 2 / a ValidationError, and nothing written."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import fakeredis
import pytest
import redis

from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.errors import ValidationError
from loopsq.mcp import server
from loopsq.mcp.context import McpContext
from loopsq.sdk import LoopsClient
from loopsq.state import loops as loops_module
from loopsq.state import pool_registry
from loopsq.state import workflows as workflows_module
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.workflows import WorkflowStore
from loopsq.web import body_schemas
from tests.unit.cli_helpers import Cli, make_cli

NOW = datetime(2026, 1, 1, tzinfo=UTC)
KEYS = Keys()
PATTERN = "[a-z0-9][a-z0-9._:/-]{0,63}"
HOURLY = {"type": "interval", "everyMs": 3_600_000}
COMMAND = {"type": "command", "command": "true"}
BASE = ("create", "command", "hello", "--cmd", "true", "--every", "1h")
HINT = "(create it with: loopsq pool set gpu --limit N)"


def _body(**extra: Any) -> dict[str, Any]:
    return {"name": "hello", "timezone": "UTC", "schedule": HOURLY, "target": COMMAND, **extra}


def _spec(top: dict[str, Any] | None = None, *steps: dict[str, Any]) -> dict[str, Any]:
    return {"name": "w", **(top or {}),
            "steps": [{"id": f"s{i}", "target": COMMAND, **step} for i, step in enumerate(steps or ({},))]}


def _add_pool(client: redis.Redis, name: str, limit: int = 2) -> None:
    client.hset(KEYS.pools, name, json.dumps({"limit": limit}))


def _state(client: redis.Redis) -> dict[str, Any]:
    """Every key with its value: what "nothing written" compares."""
    readers = {"string": client.get, "hash": client.hgetall, "set": client.smembers,
               "stream": lambda key: client.xrange(key)}
    return {key: readers[client.type(key)](key) for key in sorted(client.keys("*"))}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


# -- the domain -------------------------------------------------------------------------------------------------
def test_requires_is_stored_sorted_without_duplicates_and_pool_as_given() -> None:
    loop = new_loop(_body(requires=["repo:web", "gpu", "repo:web"], pool="gpu-a100"), NOW)
    assert (loop.requires, loop.pool) == (["gpu", "repo:web"], "gpu-a100")
    data = loop.to_dict()
    assert (data["requires"], data["pool"]) == (["gpu", "repo:web"], "gpu-a100")


@pytest.mark.parametrize("extra", [{}, {"requires": None, "pool": None}, {"requires": []}])
def test_no_requirement_and_no_pool_leave_both_fields_out(extra: dict[str, Any]) -> None:
    loop = new_loop(_body(**extra), NOW)
    assert (loop.requires, loop.pool) == (None, None)
    assert "requires" not in loop.to_dict() and "pool" not in loop.to_dict()


def test_the_fields_come_right_after_the_workspace_in_the_json() -> None:
    loop = new_loop(_body(workspace="repo", overlap="allow", workspaceWaitMs=5000, requires=["gpu"], pool="p"), NOW)
    keys = list(loop.to_dict())
    assert keys[keys.index("workspaceWaitMs") + 1:keys.index("workspaceWaitMs") + 3] == ["requires", "pool"]


def test_a_stored_loop_round_trips_with_and_without_the_fields() -> None:
    loop = new_loop(_body(requires=["gpu"], pool="gpu"), NOW)
    assert Loop.from_json(loop.to_json()) == loop
    assert Loop.from_json(loop.to_json()).to_json() == loop.to_json()
    older = {k: v for k, v in json.loads(loop.to_json()).items() if k not in ("requires", "pool")}
    before_fields = Loop.from_dict(older)  # a loop stored before the fields existed
    assert (before_fields.requires, before_fields.pool, before_fields.extra) == (None, None, {})
    assert json.loads(before_fields.to_json()) == older


BODY_CASES = [
    ({"requires": ["GPU!"]}, f'requires must be a label ({PATTERN}), got "GPU!"'),
    ({"requires": ["gpu", ""]}, f'requires must be a label ({PATTERN}), got ""'),
    ({"requires": [7]}, f"requires must be a label ({PATTERN}), got 7"),
    ({"requires": ["x" * 65]}, f'requires must be a label ({PATTERN}), got "{"x" * 64}… (1 more characters)"'),
    ({"requires": "gpu"}, 'requires must be a list of labels, got "gpu"'),
    ({"requires": {"gpu": True}}, 'requires must be a list of labels, got {"gpu": true}'),
    ({"requires": [f"l{i}" for i in range(33)]}, "requires must have at most 32 labels, got 33"),
    ({"pool": "Big Pool"}, f'pool must be a label ({PATTERN}), got "Big Pool"'),
    ({"pool": ""}, f'pool must be a label ({PATTERN}), got ""'),
    ({"pool": ["gpu"]}, f'pool must be a label ({PATTERN}), got ["gpu"]'),
    ({"pool": "gpu\n"}, f'pool must be a label ({PATTERN}), got "gpu\\x0a"'),
]


@pytest.mark.parametrize(("extra", "message"), BODY_CASES, ids=[m[:50] for _, m in BODY_CASES])
def test_bad_requires_or_pool_in_a_create_body_name_the_field_and_the_value(extra: dict[str, Any],
                                                                            message: str) -> None:
    with pytest.raises(ValidationError) as info:
        new_loop(_body(**extra), NOW)
    assert info.value.message == message


SPEC_CASES = [
    (_spec({"requires": ["A"]}), f'workflow.requires must be a label ({PATTERN}), got "A"'),
    (_spec({"requires": "gpu"}), 'workflow.requires must be a list of labels, got "gpu"'),
    (_spec({"pool": 3}), f"workflow.pool must be a label ({PATTERN}), got 3"),
    (_spec(None, {}, {"requires": ["gpu", "GPU!"]}), f'workflow.steps[1].requires must be a label ({PATTERN}), got "GPU!"'),
    (_spec(None, {"requires": {"a": 1}}), 'workflow.steps[0].requires must be a list of labels, got {"a": 1}'),
    (_spec(None, {"pool": "Pool"}), f'workflow.steps[0].pool must be a label ({PATTERN}), got "Pool"'),
    # top-level problems come before step problems
    (_spec({"pool": "P"}, {"pool": "Q"}), f'workflow.pool must be a label ({PATTERN}), got "P"'),
]


@pytest.mark.parametrize(("spec", "message"), SPEC_CASES, ids=[m[:50] for _, m in SPEC_CASES])
def test_bad_requires_or_pool_in_a_workflow_spec_name_the_field_and_the_value(spec: dict[str, Any],
                                                                              message: str) -> None:
    with pytest.raises(ValidationError) as info:
        workflow_body_from_json(spec)
    assert info.value.message == message


def test_a_workflow_spec_keeps_its_own_and_its_steps_requirements_normalised() -> None:
    body = workflow_body_from_json(_spec({"requires": ["repo:web", "gpu", "gpu"], "pool": "nightly"},
                                         {"requires": ["b", "a"], "pool": "gpu"},
                                         {"requires": None, "pool": None}, {"requires": []}))
    assert (body["requires"], body["pool"]) == (["gpu", "repo:web"], "nightly")
    assert (body["steps"][0]["requires"], body["steps"][0]["pool"]) == (["a", "b"], "gpu")
    assert [sorted(step) for step in body["steps"][1:]] == [["continueOnFailure", "dependsOn", "id", "target"]] * 2
    plain = workflow_body_from_json(_spec())
    assert "requires" not in plain and "pool" not in plain


# -- the stores: an unknown pool is bad input, and nothing is written -------------------------------------------
def test_a_loop_naming_a_pool_that_does_not_exist_is_refused_and_nothing_is_written(client: redis.Redis) -> None:
    _add_pool(client, "cpu")
    before = _state(client)
    with pytest.raises(ValidationError) as info:
        LoopStore(client).create(new_loop(_body(pool="gpu"), NOW))
    assert info.value.message == f'pool "gpu" does not exist {HINT}'
    assert _state(client) == before


def test_a_loop_naming_an_existing_pool_is_stored_with_it(client: redis.Redis) -> None:
    _add_pool(client, "gpu")
    created = LoopStore(client).create(new_loop(_body(pool="gpu", requires=["gpu"]), NOW))
    stored = LoopStore(client).require("hello")
    assert stored == created and (stored.pool, stored.requires) == ("gpu", ["gpu"])


def test_a_pool_removed_between_the_check_and_the_write_refuses_the_loop(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    _add_pool(client, "gpu")
    real = pool_registry.require_pools

    def then_removed(*args: Any, **kwargs: Any) -> dict[str, str]:
        found = real(*args, **kwargs)
        client.hdel(KEYS.pools, "gpu")  # as `loopsq pool rm gpu` racing the create
        return found

    monkeypatch.setattr(loops_module, "require_pools", then_removed)
    with pytest.raises(ValidationError) as info:
        LoopStore(client).create(new_loop(_body(pool="gpu"), NOW))
    assert info.value.message == f'pool "gpu" does not exist {HINT}'
    assert client.keys("*") == []


def test_a_pool_changed_between_the_check_and_the_write_is_checked_again(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    _add_pool(client, "gpu", 1)
    real = pool_registry.require_pools
    calls: list[int] = []

    def then_changed(*args: Any, **kwargs: Any) -> dict[str, str]:
        found = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 1:
            _add_pool(client, "gpu", 5)
        return found

    monkeypatch.setattr(loops_module, "require_pools", then_changed)
    loop = new_loop(_body(pool="gpu"), NOW)
    assert LoopStore(client).create(loop) == loop  # the same id: only the pool was in question
    assert len(calls) == 2 and LoopStore(client).require("hello") == loop


def test_a_workflow_or_step_naming_a_pool_that_does_not_exist_is_refused_and_nothing_is_written(
        client: redis.Redis) -> None:
    _add_pool(client, "cpu")
    before = _state(client)
    store = WorkflowStore(client)
    for spec, field in ((_spec({"pool": "gpu"}), "workflow.pool"),
                        (_spec({"pool": "cpu"}, {"pool": "cpu"}, {"pool": "gpu"}), "workflow.steps[1].pool")):
        with pytest.raises(ValidationError) as info:
            store.create(workflow_body_from_json(spec), NOW)
        assert info.value.message == f'{field} "gpu" does not exist {HINT}'
    assert _state(client) == before
    spec = store.create(workflow_body_from_json(_spec({"pool": "cpu"}, {"pool": "cpu", "requires": ["gpu"]})), NOW)
    assert (spec["pool"], spec["steps"][0]["pool"], spec["steps"][0]["requires"]) == ("cpu", "cpu", ["gpu"])


def test_a_step_pool_removed_between_the_check_and_the_write_refuses_the_workflow(
        client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    _add_pool(client, "gpu")
    real = pool_registry.require_named_pools

    def then_removed(*args: Any, **kwargs: Any) -> dict[str, str]:
        found = real(*args, **kwargs)
        client.hdel(KEYS.pools, "gpu")
        return found

    monkeypatch.setattr(workflows_module, "require_named_pools", then_removed)
    with pytest.raises(ValidationError) as info:
        WorkflowStore(client).create(workflow_body_from_json(_spec(None, {"pool": "gpu"})), NOW)
    assert info.value.message == f'workflow.steps[0].pool "gpu" does not exist {HINT}'
    assert client.keys("*") == []


def test_pool_exists_reads_the_pools_hash(fake_redis: redis.Redis) -> None:
    _add_pool(fake_redis, "gpu")
    assert pool_registry.pool_exists(fake_redis, KEYS, "gpu")
    assert not pool_registry.pool_exists(fake_redis, KEYS, "cpu")
    assert not pool_registry.pool_exists(fake_redis, Keys("other"), "gpu")


# -- the CLI ----------------------------------------------------------------------------------------------------
def test_create_takes_repeated_and_comma_separated_requires_and_a_pool_and_show_and_list_print_them(
        cli: Cli) -> None:
    _add_pool(cli.redis, "gpu")
    created = cli.json(*BASE, "--requires", "repo:web, gpu", "--requires", "gpu", "--pool", "gpu")
    assert (created["requires"], created["pool"]) == (["gpu", "repo:web"], "gpu")
    shown = cli.json("show", "hello")
    assert (shown["requires"], shown["pool"]) == (["gpu", "repo:web"], "gpu")
    [listed] = cli.json("list")
    assert (listed["requires"], listed["pool"]) == (["gpu", "repo:web"], "gpu")
    cli.ok("create", "command", "plain", "--cmd", "true", "--every", "1h")
    plain = cli.json("show", "plain")
    assert "requires" not in plain and "pool" not in plain


CLI_CASES = [
    ((*BASE, "--requires", "GPU!"), f"--requires must be a label ({PATTERN}), got 'GPU!'"),
    ((*BASE, "--requires", "gpu,GPU!"), f"--requires must be a label ({PATTERN}), got 'GPU!'"),
    ((*BASE, "--requires", "gpu,"), f"--requires must be a label ({PATTERN}), got ''"),
    ((*BASE, "--requires", ",".join(f"l{i}" for i in range(33))), "--requires must have at most 32 labels, got 33"),
    ((*BASE, "--pool", "Big Pool"), f"--pool must be a label ({PATTERN}), got 'Big Pool'"),
    ((*BASE, "--pool", "gpu"), f"--pool 'gpu' does not exist {HINT}"),
    (("create", "agent", "a", "--provider", "claude", "--prompt", "hi", "--every", "1h", "--pool", "gpu"),
     f"--pool 'gpu' does not exist {HINT}"),
]


@pytest.mark.parametrize(("args", "message"), CLI_CASES, ids=[m[:50] for _, m in CLI_CASES])
def test_bad_requires_or_pool_flags_get_one_line_exit_2_and_write_nothing(cli: Cli, args: tuple[str, ...],
                                                                          message: str) -> None:
    _add_pool(cli.redis, "cpu")
    before = cli.state()
    result = cli.run(*args)
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {message}\n", "")
    assert cli.state() == before


def test_a_workflow_loop_naming_an_unknown_pool_is_refused_by_the_flag(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps(_spec()))
    cli.ok("workflows", "create", str(spec))
    before = cli.state()
    result = cli.run("create", "workflow", "nightly", "--workflow", "w", "--every", "1h", "--pool", "gpu")
    assert (result.exit_code, result.stderr) == (2, f"error: --pool 'gpu' does not exist {HINT}\n")
    assert cli.state() == before


def test_workflows_create_refuses_a_spec_file_naming_an_unknown_pool(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps(_spec({"requires": ["gpu"]}, {}, {"pool": "gpu", "requires": ["repo:web"]})))
    before = cli.state()
    result = cli.run("workflows", "create", str(spec))
    assert (result.exit_code, result.stderr, result.stdout) == (
        2, f'error: workflow.steps[1].pool "gpu" does not exist {HINT}\n', "")
    assert cli.state() == before
    _add_pool(cli.redis, "gpu")
    created = cli.json("workflows", "create", str(spec))
    assert (created["requires"], created["steps"][1]["pool"], created["steps"][1]["requires"]) == (
        ["gpu"], "gpu", ["repo:web"])
    shown = cli.json("workflows", "show", "w")
    assert (shown["requires"], shown["steps"][1]["pool"]) == (["gpu"], "gpu")


def test_a_bad_label_in_a_spec_file_is_one_line_exit_2(cli: Cli, tmp_path: Path) -> None:
    spec = tmp_path / "w.json"
    spec.write_text(json.dumps(_spec(None, {"requires": ["GPU!"]})))
    result = cli.run("workflows", "create", str(spec))
    assert (result.exit_code, result.stderr) == (
        2, f'error: workflow.steps[0].requires must be a label ({PATTERN}), got "GPU!"\n')
    assert cli.state() == {}


# -- the SDK and MCP --------------------------------------------------------------------------------------------
def test_the_sdk_creates_with_requires_and_pool_and_refuses_an_unknown_pool(fake_redis: redis.Redis) -> None:
    sdk = LoopsClient(client=fake_redis)
    with pytest.raises(ValidationError) as info:
        sdk.create(_body(pool="gpu"))
    assert info.value.message == f'pool "gpu" does not exist {HINT}'
    assert fake_redis.keys("*") == []
    _add_pool(fake_redis, "gpu")
    loop = sdk.create(_body(pool="gpu", requires=["gpu", "cuda:12"]))
    assert (sdk.get("hello").requires, loop.pool) == (["cuda:12", "gpu"], "gpu")


def _mcp(ctx: McpContext, arguments: dict[str, Any]) -> tuple[bool, str]:
    async def progress(_v: float, _t: float | None, _m: str | None) -> None:
        return None

    async def main() -> tuple[bool, str]:
        result = await server.call_tool(ctx, "loop_create_command", arguments, progress)
        return bool(result.is_error), result.content[0].text  # type: ignore[union-attr]

    return anyio.run(main)


def test_the_mcp_create_tools_take_requires_and_pool_and_refuse_an_unknown_pool(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_MCP_ALLOW_MUTATIONS", "true")
    client = fakeredis.FakeRedis(decode_responses=True)
    ctx = McpContext("redis://fake.invalid:6379/0", tmp_path, client=client)
    args = {"name": "hello", "command": "true", "schedule": HOURLY}
    for tool in ("loop_create_command", "loop_create_agent", "loop_create_workflow"):
        properties = server.TOOLS_BY_NAME[tool].schema["properties"]
        assert properties["requires"]["items"]["pattern"] == f"^{PATTERN}$"
        assert properties["pool"]["pattern"] == f"^{PATTERN}$"
    try:
        assert _mcp(ctx, {**args, "pool": "gpu"}) == (True, f'pool "gpu" does not exist {HINT}')
        assert _mcp(ctx, {**args, "requires": ["GPU!"]}) == (True, f'requires must be a label ({PATTERN}), got "GPU!"')
        assert client.keys("*") == []
        _add_pool(client, "gpu")
        failed, text = _mcp(ctx, {**args, "pool": "gpu", "requires": ["gpu"]})
        assert not failed and (json.loads(text)["pool"], json.loads(text)["requires"]) == ("gpu", ["gpu"])
    finally:
        ctx.close()


# -- the API's document -----------------------------------------------------------------------------------------
def test_the_api_schemas_take_requires_and_pool_where_the_server_does() -> None:
    parts = body_schemas.components()
    step = parts["WorkflowCreate"]["properties"]["steps"]["items"]["properties"]
    for properties in (parts["LoopCreate"]["properties"], parts["WorkflowCreate"]["properties"], step):
        requires, pool = properties["requires"], properties["pool"]["anyOf"]
        assert (requires["type"], requires["maxItems"]) == (["array", "null"], 32)
        assert requires["items"]["pattern"] == pool[0]["pattern"] == f"^{PATTERN}$"
        assert pool[1] == {"type": "null"}


@pytest.mark.parametrize("text", ["gpu", "a", "repo:web", "x/y.z_1-2", "0" * 64, "0" * 65, "GPU", "-a", "", "a b",
                                  "é", "gpu\n", "_a"])
def test_the_label_pattern_of_the_document_is_the_servers(text: str) -> None:
    import re

    in_schema = re.fullmatch(body_schemas.patterns()["label"].removeprefix("^").removesuffix("$"), text) is not None
    try:
        new_loop(_body(pool=text), NOW)
    except ValidationError:
        accepted = False
    else:
        accepted = True
    assert in_schema == accepted
