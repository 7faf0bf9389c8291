"""Lifecycle commands on a loop already where they would put it are documented no-ops (nothing written, no change
entry); commands that make no sense for the loop's status are refused; either way the output agrees with ``show``."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopsq.domain.timeutil import to_iso
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from tests.unit.cli_helpers import NOW, Cli, make_cli

KEYS = Keys()


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def create(cli: Cli, name: str, *schedule: str) -> str:
    return str(cli.json("create", "command", name, "--cmd", "true", *(schedule or ("--every", "1h")))["id"])


def changes(cli: Cli) -> int:
    return len(cli.redis.xrange(KEYS.changes))


def status_of(cli: Cli, name: str) -> str:
    return str(cli.json("show", name)["status"])


def set_status(cli: Cli, loop_id: str, **fields: object) -> None:
    LoopStore(cli.redis, KEYS).update(loop_id, "test_set", NOW, lambda loop: loop.with_changes(**fields))


@pytest.mark.parametrize(("setup", "command", "status"), [
    ((), "resume", "active"),
    (("pause",), "pause", "paused"),
    (("stop",), "stop", "stopped"),
    (("pause", "stop"), "stop", "stopped"),
])
def test_a_command_that_changes_nothing_writes_nothing_and_prints_what_show_says(
        cli: Cli, setup: tuple[str, ...], command: str, status: str) -> None:
    loop_id = create(cli, "l")
    for step in setup:
        cli.ok(step, "l")
    before = cli.state()
    assert cli.ok(command, "l") == f"{loop_id} {status}\n"
    assert cli.state() == before  # no write and no change entry
    assert status_of(cli, "l") == status


def test_stopping_an_expired_loop_changes_nothing(cli: Cli) -> None:
    loop_id = create(cli, "l")
    set_status(cli, loop_id, status="expired", next_run_at=None, expires_at=to_iso(NOW))
    count = changes(cli)
    assert cli.ok("stop", "l") == f"{loop_id} expired\n"
    assert (changes(cli), status_of(cli, "l")) == (count, "expired")


@pytest.mark.parametrize("status", ["stopped", "expired"])
def test_pausing_a_loop_that_is_not_scheduled_is_refused(cli: Cli, status: str) -> None:
    loop_id = create(cli, "l")
    set_status(cli, loop_id, status=status, next_run_at=None)
    before = cli.state()
    result = cli.run("pause", "l")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == f"error: loop l ({loop_id}) is {status}: only an active loop can be paused\n"
    assert cli.state() == before
    assert status_of(cli, "l") == status


def test_resuming_an_expired_loop_is_refused(cli: Cli) -> None:
    loop_id = create(cli, "l")
    set_status(cli, loop_id, status="expired", next_run_at=None, expires_at="2025-12-31T00:00:00.000Z")
    before = cli.state()
    result = cli.run("resume", "l")
    assert (result.exit_code, result.stderr) == (
        2, f"error: loop l ({loop_id}) expired at 2025-12-31T00:00:00.000Z: an expired loop cannot be resumed\n")
    assert cli.state() == before


def test_a_once_loop_whose_slot_ran_cannot_be_resumed_and_show_agrees(cli: Cli) -> None:
    loop_id = create(cli, "once", "--at", "2025-12-31T00:00:00Z")
    slot = "2025-12-31T00:00:00.000Z"
    cli.redis.hset(KEYS.slots(loop_id), slot, "run1")  # the slot has its run (as the runner records it)
    set_status(cli, loop_id, status="stopped", next_run_at=None)
    before = cli.state()
    result = cli.run("resume", "once")
    assert (result.exit_code, result.stderr) == (
        2, f"error: loop once ({loop_id}) already ran its one slot (2025-12-31T00:00:00.000Z): nothing to resume\n")
    assert cli.state() == before
    refused = cli.run("pause", "once")
    assert refused.stderr == f"error: loop once ({loop_id}) is stopped: only an active loop can be paused\n"
    assert status_of(cli, "once") == "stopped"


def test_a_once_loop_stopped_before_its_slot_resumes_to_that_slot(cli: Cli) -> None:
    loop_id = create(cli, "later", "--at", "2026-06-01T00:00:00Z")
    cli.ok("stop", "later")
    assert cli.ok("resume", "later") == f"{loop_id} active\n"
    shown = cli.json("show", "later")
    assert (shown["status"], shown["nextRunAt"]) == ("active", "2026-06-01T00:00:00.000Z")


def test_each_real_transition_still_appends_exactly_one_change(cli: Cli) -> None:
    create(cli, "l")
    count = changes(cli)
    for command, status in (("pause", "paused"), ("resume", "active"), ("stop", "stopped"), ("resume", "active")):
        cli.ok(command, "l")
        count += 1
        assert (changes(cli), status_of(cli, "l")) == (count, status)
