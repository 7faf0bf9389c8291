"""Namespaces (``LOOPSQ_NAMESPACE``, ``--namespace``): what one may be, the keys, queues and timer set it names, and
the default keeping exactly the names loopsq used before namespaces could be chosen (no state-layout change)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.domain import labels
from loopsq.domain.namespaces import check_namespace
from loopsq.engine import timers
from loopsq.errors import ValidationError
from loopsq.state.keys import Keys
from loopsq.system.config import configured_namespace

RULE = ("must be 1-32 letters, digits, '_' or '-' starting with a letter or a digit, and not 'rq' "
        "([A-Za-z0-9][A-Za-z0-9_-]{0,31})")


def test_the_default_namespace_keeps_every_name_loopsq_used_before() -> None:
    keys = Keys()
    assert (keys.namespace, keys.meta, keys.loop("L1"), keys.changes, keys.scheduler_lock, keys.workers) == (
        "loopsq", "loopsq:meta", "loopsq:loop:L1", "loopsq:changes", "loopsq:scheduler-lock", "loopsq:workers")
    assert keys.base_queue == timers.QUEUE_NAME == "loopsq"
    assert labels.queue_name(["gpu", "repo:web"], keys.base_queue) == "loopsq+gpu+repo:web"
    assert keys.scheduled_jobs == timers.scheduled_key() == "rq:scheduler:scheduled_jobs"
    assert Keys(configured_namespace()) == keys or configured_namespace() != "loopsq"


def test_another_namespace_prefixes_every_key_and_names_its_queues_and_timers() -> None:
    keys = Keys("team-a")
    assert (keys.meta, keys.loop("L1"), keys.changes, keys.timer("L1"), keys.pattern) == (
        "team-a:meta", "team-a:loop:L1", "team-a:changes", "team-a:timer:L1", "team-a:*")
    assert keys.base_queue == "team-a"
    assert labels.queue_name(["gpu"], keys.base_queue) == "team-a+gpu"
    assert labels.queue_requirements("team-a+gpu", "team-a") == ("gpu",)
    assert labels.queue_requirements("loopsq+gpu", "team-a") is None  # another deployment's queue: not ours
    assert keys.scheduled_jobs == "team-a:timers" == timers.scheduled_key(keys)
    assert timers.queues_named([b"team-a+gpu", b"loopsq+gpu"], keys.base_queue) == {"team-a": (), "team-a+gpu": ("gpu",)}


@pytest.mark.parametrize("value", ["a", "A9", "team_b-2", "x" * 32])
def test_good_namespaces_pass(value: str) -> None:
    assert check_namespace(value, "--namespace") == value


@pytest.mark.parametrize("value", ["", "a:b", "a+b", "a*", "-a", "x" * 33, "rq", "RQ", "é", "a b", "{a}"])
def test_bad_namespaces_name_the_source_and_the_value(value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        check_namespace(value, "LOOPSQ_NAMESPACE")
    assert caught.value.message == f'LOOPSQ_NAMESPACE {RULE}, got "{value}"'


def test_the_flag_wins_over_the_environment_and_empty_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_NAMESPACE", "b")
    assert configured_namespace("a") == "a" and configured_namespace() == "b"
    monkeypatch.setenv("LOOPSQ_NAMESPACE", "")
    assert configured_namespace() == "loopsq"


@pytest.mark.parametrize(("args", "env", "source"), [
    (["--namespace", "a:b", "list"], None, "--namespace"),
    (["list"], "rq", "LOOPSQ_NAMESPACE"),
])
def test_a_bad_namespace_is_one_error_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, args: list[str], env: str | None,
                                                      source: str) -> None:
    monkeypatch.setenv("LOOPSQ_NAMESPACE", env or "")  # restored after the test, whatever the CLI sets
    monkeypatch.setenv("LOOPSQ_REDIS_URL", "redis://127.0.0.1:1/0")  # never reached
    result = CliRunner().invoke(cli, args)
    value = "a:b" if env is None else env
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f'error: {source} {RULE}, got "{value}"\n')


def test_the_sdk_works_in_the_namespace_it_is_given_or_the_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    import fakeredis

    from loopsq.sdk import LoopsClient

    redis_ = fakeredis.FakeRedis(decode_responses=True)
    monkeypatch.setenv("LOOPSQ_NAMESPACE", "b")
    assert LoopsClient(client=redis_).keys.namespace == "b"
    assert LoopsClient(client=redis_, namespace="a").keys.namespace == "a"
    with pytest.raises(ValidationError) as caught:
        LoopsClient(client=redis_, namespace="a:b")
    assert caught.value.message == f'LoopsClient(namespace) {RULE}, got "a:b"'


def test_a_runtime_given_no_keys_works_in_the_environment_s_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """What an RQ job run by a plain ``rq worker`` (``worker.jobs``) goes by."""
    import fakeredis

    from loopsq.engine.runtime import Runtime

    monkeypatch.setenv("LOOPSQ_NAMESPACE", "b")
    rt = Runtime(client=fakeredis.FakeRedis(decode_responses=True))
    assert rt.keys == Keys("b") and rt.loops.keys == Keys("b")


def test_each_namespace_moves_only_its_own_timers_onto_its_own_routed_queue() -> None:
    """Two deployments' timers at the same time for loops needing ``gpu``: each scheduler's move takes its own,
    onto its own ``<ns>+gpu`` queue, listed in its own queue registry; the fleet view of each sees its own."""
    from datetime import UTC, datetime, timedelta

    import fakeredis

    from loopsq.engine import fleet

    server = fakeredis.FakeServer()
    raw, text = fakeredis.FakeRedis(server=server), fakeredis.FakeRedis(server=server, decode_responses=True)
    due = datetime.now(UTC) - timedelta(seconds=1)
    a, b = Keys("a"), Keys("b")
    for keys in (a, b):
        assert timers.arm(raw, keys, "L1", due, queue_name=labels.queue_name(["gpu"], keys.base_queue))
    assert text.zcard("a:timers") == text.zcard("b:timers") == 1 and not text.exists(timers.scheduled_key())
    assert timers.move_due(raw, keys=a) == 1
    assert (text.llen("rq:queue:a+gpu"), text.llen("rq:queue:b+gpu"), text.zcard("b:timers")) == (1, 0, 1)
    assert text.hkeys("a:queues") == ["a+gpu"] and text.hkeys("b:queues") == ["b+gpu"]
    assert timers.move_due(raw) == 0  # the default namespace has none
    assert [q.name for q in fleet.read_fleet(text, a).queues] == ["a", "a+gpu"]
    assert fleet.read_fleet(text, b).timers.armed == 1 and fleet.read_fleet(text, a).timers.armed == 0
