"""Bad input for steering, gates, jitter and the control file: one line naming the field and the value, exit
status 2 (or a ValidationError from the domain), and nothing written anywhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loopsq.domain.control import parse_control
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.timeutil import now
from loopsq.errors import ValidationError
from tests.unit.cli_helpers import Cli, make_cli

BASE = ("create", "command", "hello", "--cmd", "echo hi", "--every", "1m")


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


CASES = [
    ((*BASE, "--min-interval", "5s"), "--min-interval requires --steerable, got '5s'"),
    ((*BASE, "--max-interval", "1h"), "--max-interval requires --steerable, got '1h'"),
    ((*BASE, "--steerable", "--min-interval", "soon"), "--min-interval: invalid duration: soon"),
    ((*BASE, "--steerable", "--min-interval", "0"), "--min-interval must be greater than zero, got '0'"),
    ((*BASE, "--steerable", "--min-interval", "500ms"), "--min-interval must be at least 1s, got '500ms'"),
    ((*BASE, "--steerable", "--min-interval", "1h", "--max-interval", "1m"),
     "--max-interval must be at least --min-interval, got '1m'"),
    ((*BASE, "--gate", " "), "--gate must be a non-empty command, got ' '"),
    ((*BASE, "--gate-timeout", "5s"), "--gate-timeout requires --gate, got '5s'"),
    ((*BASE, "--gate", "true", "--gate-timeout", "0"), "--gate-timeout must be greater than zero, got '0'"),
    ((*BASE, "--gate", "true", "--gate-timeout", "later"), "--gate-timeout: invalid duration: later"),
    ((*BASE, "--jitter", "0"), "--jitter must be greater than zero, got '0'"),
    ((*BASE, "--jitter", "a bit"), "--jitter: invalid duration: a bit"),
    ((*BASE, "--jitter", "8d"), "--jitter must be at most 7d, got '8d'"),
    (("create", "command", "hello", "--cmd", "true", "--dynamic", "--jitter", "5m"),
     "--jitter needs --every or --cron, got '5m'"),
    ((*BASE, "--workspace", " "), "--workspace must not be empty, got ' '"),
    ((*BASE, "--workspace", "a\tb"),
     "--workspace must not contain control, format, bidi or zero-width characters (U+0009 at position 2), "
     "got 'a\\x09b'"),
    ((*BASE, "--workspace-wait", "1m"), "--workspace-wait requires --workspace, got '1m'"),
    ((*BASE, "--workspace", "repo", "--workspace-wait", "1m"), "--workspace-wait requires --overlap allow, got '1m'"),
    ((*BASE, "--workspace", "repo", "--overlap", "allow", "--workspace-wait", "0"),
     "--workspace-wait must be greater than zero, got '0'"),
    ((*BASE, "--workspace", "x" * 201), f"--workspace must be at most 200 characters, got '{'x' * 64}… (137 more characters)'"),
    ((*BASE, "--budget-runs", "ten/day"), "--budget-runs must be N/day or N/week, got 'ten/day'"),
    ((*BASE, "--budget-cost", "5/month"), "--budget-cost must be AMOUNT/day or AMOUNT/week, got '5/month'"),
    (("runs", "--outcome", "maybe"), "--outcome must be one of progress, no_op, done, needs_human, got 'maybe'"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a[7:] or a)[:60] for a, _ in CASES])
def test_bad_feature_flags_get_one_line_exit_2_and_write_nothing(cli: Cli, args: tuple[str, ...],
                                                                 message: str) -> None:
    before = cli.state()
    result = cli.run(*args)
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {message}\n", "")
    assert cli.state() == before


def _body(**extra: Any) -> dict[str, Any]:
    return {"name": "x", "schedule": {"type": "interval", "everyMs": 60_000},
            "target": {"type": "command", "command": "true"}, **extra}



BODY_CASES = [
    ({"steerable": "yes"}, 'steerable must be true or false, got "yes"'),
    ({"minIntervalMs": 5000}, "minIntervalMs requires steerable: true, got 5000"),
    ({"steerable": True, "minIntervalMs": 10}, "minIntervalMs must be at least 1000 (1s), got 10"),
    ({"jitterMs": 0}, "jitterMs must be a positive integer, got 0"),
    ({"jitterMs": 700_000_000}, "jitterMs must be at most 604800000 (7d), got 700000000"),
    ({"jitterMs": 1000, "schedule": {"type": "dynamic"}},
     "jitterMs applies to interval and cron schedules, got a dynamic schedule"),
    ({"workspace": ""}, 'workspace must be a non-empty string, got ""'),
    ({"workspace": 5}, "workspace must be a non-empty string, got 5"),
    ({"workspaceWaitMs": 1000}, "workspaceWaitMs requires a workspace, got 1000"),
    ({"budgetRuns": {"limit": 5}}, "budgetRuns.per must be day or week, got null"),
    ({"budgetRuns": {"limit": 1.5, "per": "day"}}, "budgetRuns.limit must be a positive integer, got 1.5"),
    ({"budgetCost": {"limit": -1, "per": "week"}}, "budgetCost.limit must be a positive number (USD), got -1"),
    ({"budgetCost": "5/day"}, 'budgetCost must be an object with limit and per, got "5/day"'),
    ({"gate": "true"}, 'gate must be an object with a command, got "true"'),
    ({"gate": {"command": ""}}, 'gate.command must be a non-empty command, got ""'),
    ({"gate": {"command": "true", "every": 1}}, 'gate has an unknown field "every" (expected command, timeoutMs)'),
    ({"gate": {"command": "true", "timeoutMs": -1}}, "gate.timeoutMs must be a positive integer, got -1"),
]


@pytest.mark.parametrize(("extra", "message"), BODY_CASES, ids=[m[:40] for _, m in BODY_CASES])
def test_bad_feature_fields_of_a_create_body_name_the_field_and_the_value(extra: dict[str, Any],
                                                                          message: str) -> None:
    with pytest.raises(ValidationError) as info:
        new_loop(_body(**extra), now())
    assert info.value.message == message


def test_good_feature_fields_are_stored_on_the_loop() -> None:
    loop = new_loop(_body(steerable=True, maxIntervalMs=3_600_000, gate={"command": "git diff --quiet"}), now())
    assert (loop.steerable, loop.min_interval_ms, loop.max_interval_ms) == (True, None, 3_600_000)
    assert loop.to_dict()["gate"] == {"command": "git diff --quiet"}


CONTROL_CASES = [
    ("{", "control file ignored: not JSON (JSONDecodeError: Expecting property name enclosed in double quotes: "
          "line 1 column 2 (char 1))"),
    ("[]", "control file ignored: expected one JSON object, got []"),
    ('{"outcome": "no_op", "next": "1m"}',
     'control file ignored: unknown key "next" (expected outcome, nextIn, stop, note)'),
    ('{"nextIn": "soon"}', "control file ignored: nextIn: invalid duration: soon"),
    ('{"nextIn": -5}', "control file ignored: nextIn must be greater than zero, got -5"),
    ('{"nextIn": true}', 'control file ignored: nextIn must be a duration such as "10m" or milliseconds, got true'),
    ('{"stop": "yes"}', 'control file ignored: stop must be true or false, got "yes"'),
    ('{"note": 5}', "control file ignored: note must be a string, got 5"),
]


@pytest.mark.parametrize(("text", "warning"), CONTROL_CASES, ids=[t for t, _ in CONTROL_CASES])
def test_a_malformed_control_file_is_only_a_warning_and_applies_nothing(text: str, warning: str) -> None:
    control = parse_control(text)
    assert control.warning == warning
    assert control.empty and control.to_dict() is None


def test_a_control_file_past_its_size_bound_is_a_warning() -> None:
    assert parse_control(None, truncated=True).warning == "control file ignored: larger than 65536 bytes"


def test_a_good_control_file_parses_every_field() -> None:
    control = parse_control('{"outcome": "progress", "nextIn": "10m", "stop": false, "note": "3 files"}')
    assert control.to_dict() == {"outcome": "progress", "nextInMs": 600_000, "note": "3 files"}


BACKFILL = ("backfill", "hourly")
BACKFILL_CASES = [
    ((*BACKFILL, "--from", "yesterday", "--to", "2025-01-02T00:00:00Z"), "invalid --from: yesterday"),
    ((*BACKFILL, "--from", "2025-01-01T00:00:00Z", "--to", "soon"), "invalid --to: soon"),
    ((*BACKFILL, "--from", "2025-01-02T00:00:00Z", "--to", "2025-01-01T00:00:00Z"),
     "--to must be after --from, got 2025-01-01T00:00:00.000Z (from 2025-01-02T00:00:00.000Z)"),
    ((*BACKFILL, "--from", "2025-01-01T00:00:00Z", "--to", "2999-01-01T00:00:00Z"),
     "--to must not be in the future, got 2999-01-01T00:00:00.000Z"),
    ((*BACKFILL, "--from", "2000-01-01T00:00:00Z", "--to", "2025-01-01T00:00:00Z"),
     "--from/--to span more than 10000 slots; backfill a shorter range"),
    ((*BACKFILL, "--from", "2025-01-01T00:00:00Z", "--to", "2025-01-02T00:00:00Z", "--overlap", "replace"),
     "--overlap must be skip or allow, got 'replace'"),
    ((*BACKFILL, "--from", "2025-01-01T00:00:00Z", "--to", "2025-01-02T00:00:00Z", "--max-parallel", "2"),
     "--max-parallel requires --overlap allow, got '2'"),
    ((*BACKFILL, "--from", "2025-01-01T00:00:00Z", "--to", "2025-01-02T00:00:00Z", "--max-parallel", "0"),
     "--max-parallel must be a positive integer, got '0'"),
    (("backfill", "dyn", "--from", "2025-01-01T00:00:00Z", "--to", "2025-01-02T00:00:00Z"),
     "backfill needs an interval or cron loop; dyn has a dynamic schedule"),
    (("backfill", "hourly", "--to", "2025-01-02T00:00:00Z"), "Missing option '--from'."),
]


@pytest.fixture
def loops_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    cli = make_cli(tmp_path, monkeypatch)
    cli.ok("create", "command", "hourly", "--every", "1h", "--cmd", "true", "--timezone", "UTC")
    cli.ok("create", "command", "dyn", "--dynamic", "--cmd", "true")
    return cli


@pytest.mark.parametrize(("args", "message"), BACKFILL_CASES, ids=[m[:50] for _, m in BACKFILL_CASES])
def test_bad_backfill_input_gets_one_line_exit_2_and_runs_nothing(loops_cli: Cli, args: tuple[str, ...],
                                                                  message: str) -> None:
    before = loops_cli.state()
    result = loops_cli.run(*args)
    assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {message}\n", "")
    assert loops_cli.state() == before


STEP_CASES = [
    ({"workspace": ""}, 'workflow.steps[0].workspace must be a non-empty string, got ""'),
    ({"workspace": 7}, "workflow.steps[0].workspace must be a non-empty string, got 7"),
    ({"workspaceWaitMs": 5}, "workflow.steps[0].workspaceWaitMs requires a workspace, got 5"),
    ({"workspace": "repo", "workspaceWaitMs": 0}, "workflow.steps[0].workspaceWaitMs must be a positive integer, got 0"),
]


@pytest.mark.parametrize(("extra", "message"), STEP_CASES, ids=[m[:50] for _, m in STEP_CASES])
def test_bad_step_workspace_fields_name_the_step_field_and_the_value(extra: dict[str, Any], message: str) -> None:
    from loopsq.domain.workflow_spec import workflow_body_from_json

    body = {"name": "w", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}, **extra}]}
    with pytest.raises(ValidationError) as info:
        workflow_body_from_json(body)
    assert info.value.message == message


def test_a_step_workspace_is_stored_trimmed_with_its_wait() -> None:
    from loopsq.domain.workflow_spec import workflow_body_from_json

    body = {"name": "w", "steps": [{"id": "a", "target": {"type": "command", "command": "true"},
                                    "workspace": " repo ", "workspaceWaitMs": 5000},
                                   {"id": "b", "target": {"type": "command", "command": "true"}, "workspace": None}]}
    steps = workflow_body_from_json(body)["steps"]
    assert (steps[0]["workspace"], steps[0]["workspaceWaitMs"]) == ("repo", 5000)
    assert "workspace" not in steps[1]
