"""``loopsq pool set|list|show|rm``: exact output, exact one-line errors and exit codes, bad input writes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loopsq.state.keys import Keys
from loopsq.state.pools import Acquired, PoolStore
from tests.unit.cli_helpers import Cli, make_cli

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
LABEL = "[a-z0-9][a-z0-9._:/-]{0,63}"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def store(cli: Cli) -> PoolStore:
    return PoolStore(cli.redis, Keys())


def test_set_creates_then_changes_a_pool(cli: Cli) -> None:
    assert cli.ok("pool", "set", "claude-acct", "--limit", "3") == "pool claude-acct limit=3\n"
    assert cli.ok("pool", "set", "claude-acct", "--limit", "1") == "pool claude-acct limit=1\n"
    assert cli.json("pool", "set", "claude-acct", "--limit", "2") == {"name": "claude-acct", "limit": 2}
    assert [f["type"] for _id, f in cli.redis.xrange(Keys().changes)] == ["pool_set"] * 3


def test_list_shows_every_pool_with_its_use(cli: Cli) -> None:
    assert cli.ok("pool", "list") == ""
    cli.ok("pool", "set", "gpu", "--limit", "1")
    cli.ok("pool", "set", "claude-acct", "--limit", "3")
    assert isinstance(store(cli).acquire("claude-acct", "run1", 60_000), Acquired)
    store(cli).acquire("gpu", "run2", 60_000)
    store(cli).acquire("gpu", "run3", 60_000)
    assert cli.ok("pool", "list") == (
        "claude-acct  limit=3  in-use=1  waiting=0\n"
        "gpu  limit=1  in-use=1  waiting=1\n")
    assert cli.ok("pool", "ls") == cli.ok("pool", "list")
    assert cli.json("pool", "list") == [
        {"name": "claude-acct", "limit": 3, "inUse": 1, "waiting": 0},
        {"name": "gpu", "limit": 1, "inUse": 1, "waiting": 1},
    ]


def test_show_lists_holders_with_fence_and_since_and_waiters_with_position(cli: Cli) -> None:
    cli.ok("pool", "set", "gpu", "--limit", "1")
    held = store(cli).acquire("gpu", "loop1|2026-01-01T00:00:00.000Z", 60_000)
    assert isinstance(held, Acquired)
    store(cli).acquire("gpu", "step:wf1:build", 60_000)
    out = cli.ok("pool", "show", "gpu")
    assert re.fullmatch(
        "gpu  limit=1  in-use=1  waiting=1\n"
        rf"  holds  fence={held.fence}  since={ISO}  loop1\|2026-01-01T00:00:00.000Z\n"
        rf"  waits  position=0  since={ISO}  step:wf1:build\n", out), out
    body = cli.json("pool", "show", "gpu")
    assert {k: body[k] for k in ("name", "limit", "inUse", "waiting")} == {
        "name": "gpu", "limit": 1, "inUse": 1, "waiting": 1}
    assert [(h["holder"], h["fence"]) for h in body["holders"]] == [("loop1|2026-01-01T00:00:00.000Z", held.fence)]
    assert [(w["holder"], w["position"]) for w in body["waiters"]] == [("step:wf1:build", 0)]


def test_rm_removes_the_pool_and_its_keys(cli: Cli) -> None:
    cli.ok("pool", "set", "gpu", "--limit", "1")
    store(cli).acquire("gpu", "run1", 60_000)
    assert cli.ok("pool", "rm", "gpu") == "gpu removed\n"
    assert cli.redis.keys("loopsq:pool*") == []
    cli.ok("pool", "set", "gpu", "--limit", "1")
    assert cli.json("pool", "remove", "gpu") == {"removed": True, "name": "gpu"}


@pytest.mark.parametrize(("args", "message"), [
    (("pool", "set", "acct", "--limit", "0"), "--limit must be a positive integer, got '0'"),
    (("pool", "set", "acct", "--limit", "-1"), "--limit must be a positive integer, got '-1'"),
    (("pool", "set", "acct", "--limit", "three"), "--limit must be a positive integer, got 'three'"),
    (("pool", "set", "acct", "--limit", "2.5"), "--limit must be a positive integer, got '2.5'"),
    (("pool", "set", "acct", "--limit", ""), "--limit must be a positive integer, got ''"),
    (("pool", "set", "acct", "--limit", "10001"), "--limit must be at most 10000, got '10001'"),
    (("pool", "set", "Claude Acct", "--limit", "3"), f'pool name must be a label ({LABEL}), got "Claude Acct"'),
    (("pool", "set", "acct|x", "--limit", "3"), f'pool name must be a label ({LABEL}), got "acct|x"'),
    (("pool", "set", "a\nb", "--limit", "3"), f'pool name must be a label ({LABEL}), got "a\\x0ab"'),
    (("pool", "set", "-x", "--limit", "3"), "No such option '-x'."),
    (("pool", "set", "acct"), "Missing option '--limit'."),
    (("pool", "show", "Bad"), f'pool name must be a label ({LABEL}), got "Bad"'),
    (("pool", "rm", "a b"), f'pool name must be a label ({LABEL}), got "a b"'),
])
def test_bad_input_gets_one_line_exit_2_and_writes_nothing(cli: Cli, args: tuple[str, ...], message: str) -> None:
    cli.ok("pool", "set", "acct", "--limit", "2")
    before = cli.state()
    result = cli.run(*args)
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {message}\n", "")
    assert cli.state() == before


@pytest.mark.parametrize("verb", ["show", "rm"])
def test_an_unknown_pool_is_not_found_exit_1(cli: Cli, verb: str) -> None:
    result = cli.run("pool", verb, "nope")
    assert (result.exit_code, result.stderr, result.stdout) == (1, "error: pool not found: nope\n", "")
    result = cli.run("--json", "pool", verb, "nope")
    assert result.exit_code == 1
    assert json.loads(result.stderr) == {"error": {"code": "not_found", "exitCode": 1,
                                                   "message": "pool not found: nope"}}


def test_bad_input_is_reported_before_redis_is_contacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli = make_cli(tmp_path, monkeypatch)

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("Redis contacted")

    monkeypatch.setattr("loopsq.cli.app.connect", refuse)
    result = cli.run("pool", "set", "acct", "--limit", "0")
    assert (result.exit_code, result.stderr) == (2, "error: --limit must be a positive integer, got '0'\n")
