"""Agent loops at the reference's later level through the HTTP API and the SDK (issue 18): the same agent option
fields and messages as the CLI and spec files, archive / unarchive / restore / rename, ``retry: false`` on a
trigger, prompt files in the SDK (and refused by the API)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from loopsq.errors import ConflictError, ValidationError
from loopsq.sdk import LoopsClient
from loopsq.state.keys import Keys
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, TOKEN, assert_error, redis_state
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration
KEYS = Keys()
HOURLY = {"type": "interval", "everyMs": 3_600_000}


def agent_body(name: str = "bot", **target: Any) -> dict[str, Any]:
    return {"name": name, "timezone": "UTC", "schedule": HOURLY,
            "target": {"type": "agent", "provider": "codex", "prompt": "review", **target}}


@pytest.fixture
def api(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("TZ", "UTC")
    settings = WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False)
    with TestClient(create_app(settings), headers=AUTH) as client:
        yield client


@pytest.fixture
def sdk(redis_server: RedisServer, real_redis: redis.Redis) -> Iterator[LoopsClient]:
    client = LoopsClient(redis_server.url)
    yield client
    client.close()


def stored(real_redis: redis.Redis, loop_id: str) -> dict[str, Any]:
    return json.loads(str(real_redis.get(KEYS.loop(loop_id))))


def test_the_api_takes_the_agent_options_and_stores_the_creation_defaults(api: TestClient,
                                                                          real_redis: redis.Redis) -> None:
    body = agent_body(variant="high", sandbox="read-only", addDirs=["/a"], permissionMode="bypass",
                      preflight={"beforeRun": True})
    response = api.post("/api/loops", json=body)
    assert response.status_code == 201, response.text
    target = stored(real_redis, response.json()["id"])["target"]
    assert target == {**body["target"], "timeoutMs": None, "idleTimeoutMs": 1_800_000, "promptVia": "stdin"}


@pytest.mark.parametrize(("target", "message"), [
    ({"provider": "claude", "authProfile": "work"},
     'target.authProfile is currently supported only for provider codewith, got provider "claude"'),
    ({"provider": "opencode"}, "target.model is required for provider opencode; pass a provider/model id such as "
     "openrouter/google/gemini-2.5-flash, got null"),
    ({"sandbox": "enabled"}, "target.sandbox must be read-only, workspace-write, or danger-full-access for provider "
     'codex, got "enabled"'),
    ({"permissionMode": "sometimes"}, 'target.permissionMode must be "default" or "plan" or "auto" or "bypass", '
     'got "sometimes"'),
    ({"promptFile": "/etc/hostname"}, "target.promptFile is read only by the CLI, the SDK and spec files; send the "
     'text as target.prompt, got "/etc/hostname"'),
    ({"provider": "aicopilot", "promptVia": "argv", "prompt": "-x"}, 'target.prompt must not begin with "-" when '
     'passed on argv to provider aicopilot (its CLI takes no end-of-options separator); use promptVia "stdin", got '
     '"-x"'),
])
def test_the_api_refuses_what_a_provider_does_not_take_with_the_same_message(
    api: TestClient, real_redis: redis.Redis, target: dict[str, Any], message: str
) -> None:
    before = redis_state(real_redis)
    assert_error(api.post("/api/loops", json=agent_body(**target)), 400, message)
    assert redis_state(real_redis) == before


def test_a_workflow_step_gets_the_same_agent_rules(api: TestClient) -> None:
    spec = {"name": "wf", "steps": [{"id": "a", "target": {"type": "agent", "provider": "cursor", "prompt": "p",
                                                              "variant": "high"}}]}
    assert_error(api.post("/api/workflows", json=spec), 400,
                 'workflow.steps[0].target.variant is not supported for provider cursor, got provider "cursor"')


def test_archive_unarchive_restore_and_rename_over_the_api(api: TestClient, real_redis: redis.Redis) -> None:
    loop = api.post("/api/loops", json=agent_body()).json()
    api.post("/api/loops", json=agent_body("other"))
    archived = api.post(f"/api/loops/{loop['id']}/archive")
    assert archived.status_code == 200
    assert (archived.json()["status"], archived.json()["archivedFromStatus"]) == ("paused", "active")
    assert [x["name"] for x in api.get("/api/loops").json()["items"]] == ["other"]
    assert [x["name"] for x in api.get("/api/loops?archived=only").json()["items"]] == ["bot"]
    assert sorted(x["name"] for x in api.get("/api/loops?archived=include").json()["items"]) == ["bot", "other"]
    assert_error(api.post(f"/api/loops/{loop['id']}/archive"), 409, f"loop is already archived: {loop['id']}")
    assert_error(api.post("/api/loops/bot/trigger"), 409, "loop is archived; unarchive it before running: bot")
    assert_error(api.post("/api/loops/bot/resume"), 409, "loop is archived; unarchive it before resuming: bot")
    assert api.post("/api/loops/bot/restore").json()["status"] == "active"
    assert_error(api.post("/api/loops/bot/unarchive"), 409, "loop is not archived: bot")
    renamed = api.post("/api/loops/bot/rename", json={"name": "robot"})
    assert (renamed.status_code, renamed.json()["name"], renamed.json()["id"]) == (200, "robot", loop["id"])
    assert api.get("/api/loops/robot").json()["id"] == loop["id"]
    assert_error(api.get("/api/loops/bot"), 404, "loop not found: bot")
    before = redis_state(real_redis)
    assert_error(api.post("/api/loops/robot/rename", json={"name": "other"}), 409, "loop name already exists: other")
    assert_error(api.post("/api/loops/robot/rename", json={"name": ""}), 400, 'loop name must not be empty, got ""')
    assert_error(api.post("/api/loops/robot/rename", json={"title": "x"}), 400,
                 'rename takes exactly {"name": ...}, got {"title": "x"}')
    assert redis_state(real_redis) == before


def test_a_trigger_body_can_ask_for_no_retry(api: TestClient, real_redis: redis.Redis) -> None:
    api.post("/api/loops", json=agent_body())
    plain = api.post("/api/loops/bot/trigger").json()["runId"]
    once = api.post("/api/loops/bot/trigger", json={"retry": False}).json()["runId"]
    assert "retry" not in json.loads(str(real_redis.get(KEYS.trigger(plain))))
    assert json.loads(str(real_redis.get(KEYS.trigger(once))))["retry"] is False
    assert_error(api.post("/api/loops/bot/trigger", json={"retry": "no"}), 400, 'retry must be true or false, got "no"')
    assert_error(api.post("/api/loops/bot/trigger", json={"again": True}), 400,
                 'trigger body takes only retry, got "again"')


def test_the_sdk_reads_a_prompt_file_and_archives_restores_and_renames(
    sdk: LoopsClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real_redis: redis.Redis
) -> None:
    (tmp_path / "p.md").write_text("Fix the flaky test.")
    monkeypatch.chdir(tmp_path)
    loop = sdk.create(agent_body() | {"target": {"type": "agent", "provider": "claude", "promptFile": "p.md"}})
    assert loop.target["prompt"] == "Fix the flaky test."
    assert loop.target["promptSource"] == {"type": "file", "path": str(tmp_path / "p.md")}
    with pytest.raises(ValidationError, match=r"^target.promptFile: cannot read 'nope.md': No such file or directory$"):
        sdk.create(agent_body("b2") | {"target": {"type": "agent", "provider": "claude", "promptFile": "nope.md"}})
    assert sdk.archive("bot").archived_from_status == "active"
    assert [x.name for x in sdk.list()] == [] and [x.name for x in sdk.list(archived=True)] == ["bot"]
    with pytest.raises(ConflictError, match=r"^loop is archived; unarchive it before running: bot$"):
        sdk.trigger("bot")
    assert sdk.restore("bot").status == "active"
    assert sdk.rename("bot", "robot").id == loop.id
    run_id = sdk.trigger("robot", retry=False)
    assert json.loads(str(real_redis.get(KEYS.trigger(run_id))))["retry"] is False
