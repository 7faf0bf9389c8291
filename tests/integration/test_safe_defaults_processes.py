"""The behaviours loopsq takes from OpenLoops 0.4-0.5, on real scheduler and worker processes: the default circuit
breaker, the default idle timeout of agent loops, agent runs that print nothing, exit 75 ("nothing to do") and
expiry after N successful runs. A loop stored before these defaults (its JSON without the new fields) keeps the
behaviour it was stored with."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from loopsq.domain import agent_options, timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.models import Loop
from loopsq.domain.run_rules import LoopRun
from loopsq.state.loops import LoopStore
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer
from tests.unit.test_executor_agents import install_fake

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def store(cluster: Cluster, body: dict[str, Any], *, stored_before: tuple[str, ...] = ()) -> Loop:
    """Store a loop as ``create`` would; ``stored_before``: top-level fields (``pauseAfterFailures``) or target
    fields (``target.idleTimeoutMs``) dropped from its JSON, as a loop stored before they were written has it."""
    data = new_loop({"timezone": "UTC", **body}, timeutil.now()).to_dict()
    for name in stored_before:
        holder, _, key = name.rpartition(".")
        (data[holder] if holder else data).pop(key)
    client = redis.Redis.from_url(cluster.url, decode_responses=True)
    try:
        return LoopStore(client).create(Loop.from_dict(data))
    finally:
        client.close()


def soon(seconds: float = 1.0) -> dict[str, Any]:
    """A once schedule ``seconds`` from now."""
    return {"type": "once", "at": timeutil.to_iso(timeutil.now() + timedelta(seconds=seconds))}


def codex_loop(name: str, **target: Any) -> dict[str, Any]:
    return {"name": name, "schedule": soon(), "target": {"type": "agent", "provider": "codex", "prompt": "review",
                                                        **target}}


#: What a codex run that answered prints (``codex exec --json`` lines).
CODEX_ANSWER = json.dumps({"type": "item.completed", "item": {"type": "agent_message", "text": "all clean"}})


def fake_codex(cluster: Cluster, **env: str) -> dict[str, str]:
    """A worker env whose PATH finds the fake provider as ``codex``, behaving as ``env`` (``FAKE_*``) says."""
    bin_dir = cluster.tmp / "bin"
    install_fake(bin_dir, "codex", "fake_provider.py")
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", **env}


def ended(cluster: Cluster, *names: str) -> bool:
    return all(any(r.terminal for r in cluster.runs(name)) for name in names)


def every_second(name: str, command: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "schedule": {"type": "interval", "everyMs": 1000},
            "target": {"type": "command", "command": command, "shell": True}, **fields}


@pytest.mark.timeout(90)
def test_the_default_breaker_pauses_a_new_loop_after_five_failures_and_never_an_old_stored_one(
        cluster: Cluster) -> None:
    cluster.start_all(schedulers=1, workers=1)  # (first: slots before a scheduler runs would be missed)
    new = store(cluster, every_second("new", "exit 3"))
    old = store(cluster, every_second("old", "exit 3"), stored_before=("pauseAfterFailures",))
    assert (new.pause_after_failures, old.pause_after_failures) == (5, None)
    cluster.wait_until(lambda: cluster.loop("new")["status"] == "paused", 40, "the breaker to pause the new loop")
    cluster.wait_until(lambda: sum(r.status == "failed" for r in cluster.runs("old")) >= 8, 40,
                       "the old loop to fail eight times")
    shown = json.loads(cluster.cli("--json", "show", "new").stdout)
    assert shown["statusReason"] == (
        "circuit breaker open: paused after 5 consecutive unsuccessful runs (last: failed: process exited with "
        f"code 3); fix the cause, then resume it (loopsq resume {new.id})")
    # (a slot a loaded worker reached late is recorded missed: neither a run nor a failure)
    assert [r.status for r in cluster.runs("new") if r.status != "missed"] == ["failed"] * 5
    old_loop = cluster.loop("old")
    assert old_loop["status"] == "active" and "pauseAfterFailures" not in old_loop
    assert old_loop["failureStreak"] >= 8


@pytest.mark.timeout(90)
def test_the_default_idle_timeout_kills_a_silent_run_of_a_new_agent_loop_and_not_of_an_old_stored_one(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # The default shortened to 1 s where new loops are made (this process): the stored value is what the worker uses.
    monkeypatch.setattr(agent_options, "AGENT_IDLE_TIMEOUT_MS", 1000)
    new = store(cluster, codex_loop("new"))
    old = store(cluster, codex_loop("old"), stored_before=("target.idleTimeoutMs",))
    assert (new.target.get("idleTimeoutMs"), old.target.get("idleTimeoutMs")) == (1000, None)
    cluster.start("scheduler")
    cluster.start("worker", env=fake_codex(cluster, FAKE_SLEEP="3", FAKE_STDOUT=CODEX_ANSWER))
    cluster.wait_until(lambda: ended(cluster, "new", "old"), 40, "both agent runs to end")
    [new_run], [old_run] = cluster.runs("new"), cluster.runs("old")
    assert (new_run.status, new_run.error) == ("timed_out", "idle timed out after 1000ms without stdout/stderr")
    assert (old_run.status, old_run.error, old_run.stdout) == ("succeeded", None, CODEX_ANSWER)


@pytest.mark.timeout(60)
def test_an_agent_run_that_printed_nothing_fails_with_agent_produced_no_output(cluster: Cluster) -> None:
    store(cluster, codex_loop("mute"))
    cluster.start("scheduler")
    cluster.start("worker", env=fake_codex(cluster, FAKE_STDOUT=""))
    cluster.wait_until(lambda: ended(cluster, "mute"), 30, "the agent run to end")
    [run] = cluster.runs("mute")
    assert (run.status, run.exit_code, run.error) == ("failed", 0, "agent produced no output")
    shown = json.loads(cluster.cli("--json", "show", "mute").stdout)
    assert (shown["lastRun"]["status"], shown["lastRun"]["error"]) == ("failed", "agent produced no output")


@pytest.mark.timeout(90)
def test_exit_75_is_recorded_skipped_not_retried_not_counted_and_the_next_slots_run(cluster: Cluster) -> None:
    cluster.start_all(schedulers=1, workers=1)  # (first: slots before a scheduler runs would be missed)
    cluster.create("idle", "exit 75", "--every", "1s", "--attempts", "3", "--retry-delay", "100ms")
    cluster.create("busy", "exit 75", "--every", "1s", "--overlap", "allow", "--attempts", "2",
                   "--retry-delay", "100ms")

    def ran() -> list[LoopRun]:  # (a slot a busy worker reached late is recorded missed: not a run)
        return [r for r in cluster.runs("idle") if r.terminal and r.status != "missed"]

    cluster.wait_until(lambda: len(ran()) >= 7, 40, "seven slots of the idle loop to end")
    runs = ran()
    assert {(r.status, r.error, r.exit_code, r.attempt) for r in runs} == {
        ("skipped", "nothing to do (exit 75)", 75, 1)}
    assert len({r.scheduled_for for r in runs}) == len(runs)  # one row per slot: every next slot ran
    loop = cluster.loop("idle")
    assert (loop["status"], loop["failureStreak"], loop["pauseAfterFailures"]) == ("active", 0, 5)
    assert "retryScheduledFor" not in loop
    # On an overlap-allow loop exit 75 is an ordinary failure: retried, counted, and the breaker pauses it.
    cluster.wait_until(lambda: cluster.loop("busy")["status"] == "paused", 40, "the breaker to pause the busy loop")
    assert {(r.status, r.attempt) for r in cluster.runs("busy") if r.status != "missed"} == {("failed", 2)}
    done = cluster.cli("run-now", "idle", check=False)
    assert done.returncode == 0, done.stderr
    assert " skipped source=ad_hoc " in done.stdout


@pytest.mark.timeout(90)
def test_a_loop_expires_after_n_consecutive_successes_a_failure_starting_the_count_again(cluster: Cluster) -> None:
    counter = cluster.tmp / "count"
    # Succeeds, fails on its second run, then succeeds: expires at its fifth run, the third success in a row.
    command = f'n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}; [ $n -ne 2 ]'
    cluster.start_all(schedulers=1, workers=1)
    loop_id = cluster.create("thrice", command, "--every", "1s", "--expires-after-runs", "3")
    cluster.wait_until(lambda: cluster.loop("thrice")["status"] == "expired", 40, "the loop to expire")
    ran = [r.status for r in cluster.runs("thrice") if r.status != "missed"]
    assert ran == ["succeeded", "failed", "succeeded", "succeeded", "succeeded"]
    loop = cluster.loop("thrice")
    assert (loop["successStreak"], loop["expiresAfterRuns"], "nextRunAt" in loop) == (3, 3, False)
    assert loop["statusReason"] == (
        f"expired after 3 consecutive successful runs; resume it to start a new count (loopsq resume {loop_id})")
    assert cluster.timer_at("thrice") is None
    assert [c["data"].get("also") for c in cluster.changes() if "loop_expired" in c["data"].get("also", [])] == [
        ["loop_expired"]]
    shown = json.loads(cluster.cli("--json", "show", "thrice").stdout)
    assert (shown["status"], shown["successStreak"]) == ("expired", 3)
    resumed = json.loads(cluster.cli("--json", "resume", "thrice").stdout)
    assert (resumed["status"], resumed["successStreak"]) == ("active", 0)
