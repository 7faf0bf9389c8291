"""codewith as one ``codewith exec --json`` process (OpenLoops 0.4.9, replacing 0.3.60's durable ``agent start``
plus polling, which reloaded the whole rollout each turn, hit ``context_length_exceeded`` and ended "completed"
with no work): its JSON events give the result text and the usage, and decide the outcome; the idle watchdog,
timeout and cancel are every target's; a loop stored for the durable mode loads and runs this way."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain.codewith_exec import MAX_LINE_BYTES, NO_TURN_COMPLETED, ExecEventReader, read_exec_events
from loopsq.domain.models import Loop
from loopsq.domain.targets import validate_target
from loopsq.domain.usage import Usage, parse_usage
from loopsq.engine.steering import execute_with_control
from loopsq.executor import RunMetadata, execute_target
from loopsq.system.procs import is_process_alive
from tests.unit.test_executor_agents import calls, install_fake

P = "fix the bug"
META = RunMetadata(loop_id="l1", run_id="r1", attempt=1)
EXEC = ["--ask-for-approval", "never", "exec", "--json", "--ephemeral", "--sandbox", "workspace-write",
        "--skip-git-repo-check", "--ignore-rules"]


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    """An env with a fake ``codewith`` first on PATH, recording into tmp_path/rec."""
    install_fake(tmp_path / "bin", "codewith", "fake_provider.py")
    (tmp_path / "rec").mkdir()
    return {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "FAKE_RECORD_DIR": str(tmp_path / "rec"),
            "HOME": str(tmp_path)}


def lines(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(event) + "\n" for event in events)


STARTED = ({"type": "thread.started", "thread_id": "t-1"}, {"type": "turn.started"})
REPLY = {"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": "Fixed: off-by-one."}}
COMMAND = {"type": "item.completed", "item": {"id": "item_0", "type": "command_execution", "command": "pytest",
                                              "aggregated_output": "1 passed", "exit_code": 0, "status": "completed"}}
COMPLETED = {"type": "turn.completed", "usage": {"input_tokens": 1200, "cached_input_tokens": 1000,
                                                 "output_tokens": 80}}
CONTEXT = "Codex ran out of room in the model's context window. (context_length_exceeded)"
DONE = lines(*STARTED, COMMAND, REPLY, COMPLETED)


def codewith(**fields: Any) -> dict[str, Any]:
    return {"type": "agent", "provider": "codewith", "prompt": P, **fields}


# -- the events --------------------------------------------------------------------------------------------------
def test_a_completed_turn_gives_the_last_message_the_thread_and_the_usage() -> None:
    outcome = read_exec_events(DONE)
    assert (outcome.completed, outcome.failure, outcome.result_text, outcome.thread_id) == (
        True, None, "Fixed: off-by-one.", "t-1")
    assert outcome.usage == Usage(1200, 80)
    assert parse_usage("codewith", DONE) == Usage(1200, 80)


@pytest.mark.parametrize(("events", "failure"), [
    ((*STARTED, {"type": "turn.failed", "error": {"message": CONTEXT}}), CONTEXT),
    ((*STARTED, {"type": "turn.failed", "error": "Permission denied by sandbox"}), "Permission denied by sandbox"),
    ((*STARTED, {"type": "turn.failed"}), "turn failed"),
    ((*STARTED, {"type": "error", "message": "stream disconnected before completion"}),
     "stream disconnected before completion"),
    # an error the turn recovered from (a reconnect) is no failure; a later turn.failed is
    ((*STARTED, {"type": "error", "message": "reconnecting 1/5"}, REPLY, COMPLETED), None),
    ((*STARTED, REPLY, COMPLETED, {"type": "turn.started"}, {"type": "turn.failed", "error": {"message": "x"}}), "x"),
], ids=["turn-failed", "turn-failed-text", "turn-failed-bare", "error", "error-recovered", "second-turn-failed"])
def test_a_failed_turn_or_an_unrecovered_error_is_the_runs_failure(events: tuple[dict[str, Any], ...],
                                                                   failure: str | None) -> None:
    assert read_exec_events(lines(*events)).failure == failure


def test_events_split_anywhere_read_as_the_whole_and_an_oversized_line_is_skipped() -> None:
    huge = json.dumps({"type": "item.completed", "item": {"type": "agent_message", "text": "x" * MAX_LINE_BYTES}})
    data = (lines(*STARTED, REPLY) + huge + "\n" + lines(COMPLETED)).encode()
    reader = ExecEventReader()
    for start in range(0, len(data), 4093):
        reader.feed(data[start:start + 4093])
    reader.finish()
    assert reader.outcome() == read_exec_events(DONE.replace(lines(COMMAND), ""))
    assert reader.outcome().result_text == "Fixed: off-by-one."  # not the oversized one


def test_a_last_line_without_its_newline_still_counts() -> None:
    assert read_exec_events(DONE.rstrip("\n")).completed


# -- the process --------------------------------------------------------------------------------------------------
def test_codewith_runs_one_exec_process_and_its_events_give_the_result_and_the_usage(
    fake_env: dict[str, str]
) -> None:
    fake_env["FAKE_STDOUT"] = DONE
    result, fields = execute_with_control(codewith(authProfile="work", promptVia="stdin"), META, env=fake_env)
    assert (result.status, result.exit_code, result.error) == ("succeeded", 0, None)
    assert result.result_text == "Fixed: off-by-one."
    assert result.to_dict()["resultText"] == "Fixed: off-by-one."
    assert result.stdout == DONE  # the events as codewith wrote them
    assert (fields["input_tokens"], fields["output_tokens"]) == (1200, 80)
    [call] = calls(fake_env, "codewith")  # one process: no agent start, read, logs or stop
    assert call["argv"] == ["--auth-profile", "work", *EXEC]
    assert call["stdin"] == P


@pytest.mark.parametrize(("stdout", "exit_code", "error"), [
    (lines(*STARTED, {"type": "turn.failed", "error": {"message": CONTEXT}}), 0, CONTEXT),
    (lines(*STARTED, {"type": "turn.failed", "error": {"message": CONTEXT}}), 1, CONTEXT),
    (lines(*STARTED, {"type": "error", "message": "unexpected status 401 Unauthorized"}), 1,
     "unexpected status 401 Unauthorized"),
    # the durable mode's silent success: exit 0, no completed turn, no work
    (lines(*STARTED), 0, NO_TURN_COMPLETED),
    ("", 0, NO_TURN_COMPLETED),
    ("Error: unknown model\n", 2, "process exited with code 2"),
    (lines(*STARTED, REPLY, COMPLETED), 3, "process exited with code 3"),
], ids=["turn-failed-exit-0", "turn-failed-exit-1", "error-exit-1", "no-completed-turn", "no-events", "not-json",
        "completed-but-exit-3"])
def test_a_run_whose_events_say_it_failed_fails_with_their_message(
    fake_env: dict[str, str], stdout: str, exit_code: int, error: str
) -> None:
    fake_env |= {"FAKE_STDOUT": stdout, "FAKE_EXIT": str(exit_code)}
    result = execute_target(codewith(), META, env=fake_env)
    assert (result.status, result.exit_code, result.error) == ("failed", exit_code, error)


def test_a_cancel_kills_the_codewith_process_group_at_once(fake_env: dict[str, str]) -> None:
    fake_env |= {"FAKE_STDOUT": lines(*STARTED), "FAKE_SLEEP": "60"}
    cancel = threading.Event()
    pids: list[int] = []
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    result = execute_target(codewith(), META, env=fake_env, cancel=cancel, on_spawn=lambda info: pids.append(info.pid))
    assert (result.status, result.error) == ("cancelled", "cancelled")
    assert time.monotonic() - started < 10
    assert pids and not is_process_alive(pids[0])


def test_the_timeout_and_the_idle_watchdog_apply_to_codewith_as_to_every_target(
    fake_env: dict[str, str]
) -> None:
    fake_env |= {"FAKE_STDOUT": lines(*STARTED), "FAKE_SLEEP": "60"}
    result = execute_target(codewith(timeoutMs=500), META, env=fake_env)
    assert (result.status, result.error) == ("timed_out", "timed out after 500ms")
    result = execute_target(codewith(idleTimeoutMs=500), META, env=fake_env)
    assert (result.status, result.error) == ("timed_out", "idle timed out after 500ms without stdout/stderr")


# A codewith loop as the durable mode (0.3.60) stored it: its prompt on argv, codewith's auth profile, no timeout.
DURABLE_LOOP = json.dumps({
    "id": "0123456789ab", "name": "nightly-fix", "status": "active",
    "schedule": {"type": "interval", "everyMs": 3_600_000, "anchor": "fixed_rate"},
    "target": {"type": "agent", "provider": "codewith", "prompt": P, "authProfile": "work", "timeoutMs": None,
               "promptVia": "argv", "sandbox": "workspace-write", "addDirs": ["/srv/shared"]},
    "nextRunAt": "2026-12-03T13:00:00.000Z", "catchUp": "latest", "catchUpLimit": 50, "overlap": "skip",
    "maxAttempts": 1, "retryDelayMs": 60000, "retryBackoff": "fixed", "leaseMs": 1800000, "timezone": "Etc/UTC",
    "failureStreak": 0, "createdAt": "2026-11-01T09:00:00.000Z", "updatedAt": "2026-11-01T09:00:00.000Z",
})


def test_a_loop_stored_for_the_durable_mode_loads_and_runs_as_one_exec(fake_env: dict[str, str]) -> None:
    loop = Loop.from_json(DURABLE_LOOP)
    validate_target(loop.target)  # still a valid target
    fake_env["FAKE_STDOUT"] = DONE
    result, fields = execute_with_control(loop.target, META, env=fake_env)
    assert (result.status, result.result_text, fields["input_tokens"]) == ("succeeded", "Fixed: off-by-one.", 1200)
    [call] = calls(fake_env, "codewith")
    assert call["argv"] == ["--auth-profile", "work", *EXEC, "--add-dir", "/srv/shared", "--", P]
    assert call["stdin"] == ""
