"""History past Redis's window, through the CLI: ``--keep-runs`` and ``show``'s window, ``runs`` of trimmed runs
and of removed loops (by name or id), ``mirror --rebuild`` keeping the archive, ``prune`` and ``logs`` of a run
that left Redis."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest

from loopsq.state.keys import Keys
from tests.unit.cli_helpers import NOW, Cli, make_cli

KEYS = Keys()


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    monkeypatch.delenv("LOOPSQ_KEEP_RUNS", raising=False)
    return make_cli(tmp_path, monkeypatch)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The CLI's clock: ``NOW`` plus ``clock[0]`` seconds (tests move it on)."""
    offset = [0]
    monkeypatch.setattr("loopsq.domain.timeutil.now", lambda: NOW + timedelta(seconds=offset[0]))
    return offset


def _history(cli: Cli, clock: list[int], runs: int = 4, keep: int = 2) -> tuple[str, list[str]]:
    """A loop with ``--keep-runs keep`` that ran ``runs`` times a second apart, then one maintenance pass."""
    out = cli.ok("create", "command", "hist", "--every", "1h", "--cmd", "echo out-$LOOPS_RUN_ID",
                 "--keep-runs", str(keep))
    loop_id = out.split()[2]
    cli.ok("list")  # the mirror exists from here on (a mirror keeps what it saw; one made later starts from Redis)
    ids = []
    for _ in range(runs):
        clock[0] += 1
        ids.append(cli.ok("run-now", "hist", "--local").split()[0])
    clock[0] += 1
    cli.ok("tick")
    return loop_id, ids


def test_keep_runs_is_stored_and_show_displays_the_window_and_where_it_comes_from(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli.ok("create", "command", "own", "--every", "1h", "--cmd", "true", "--keep-runs", "20")
    cli.ok("create", "command", "default", "--every", "1h", "--cmd", "true")
    own = cli.json("show", "own")
    assert (own["keepRuns"], own["historyWindow"]) == (20, {"keepRuns": 20, "source": "loop"})
    default = cli.json("show", "default")
    assert "keepRuns" not in default
    assert default["historyWindow"] == {"keepRuns": 100, "source": "LOOPSQ_KEEP_RUNS"}
    monkeypatch.setenv("LOOPSQ_KEEP_RUNS", "7")
    assert cli.json("show", "default")["historyWindow"] == {"keepRuns": 7, "source": "LOOPSQ_KEEP_RUNS"}
    monkeypatch.setenv("LOOPSQ_KEEP_RUNS", "0")
    bad = cli.run("show", "default")
    assert (bad.exit_code, bad.stderr) == (2, "error: LOOPSQ_KEEP_RUNS must be a positive integer, got '0'\n")


def test_runs_past_the_window_stay_listed_from_the_mirror_marked_archived(cli: Cli, clock: list[int]) -> None:
    loop_id, ids = _history(cli, clock)
    assert cli.redis.zrange(KEYS.loop_runs(loop_id), 0, -1) == ids[2:]
    rows = cli.json("runs", "hist", "--limit", "1000")
    assert [r["id"] for r in rows] == list(reversed(ids))
    archived = {r["id"]: r.get("archivedAt") for r in rows}
    assert [archived[i] is not None for i in ids] == [True, True, False, False]
    human = cli.ok("runs", "hist", "--limit", "1000").splitlines()
    assert [line.split()[0] for line in human] == list(reversed(ids))


def test_a_removed_loops_runs_are_listed_by_its_name_or_its_id(cli: Cli, clock: list[int]) -> None:
    loop_id, ids = _history(cli, clock)
    assert cli.ok("remove", "hist") == "removed\n"
    cli.ok("tick")  # a removed loop keeps no window: its runs leave Redis
    assert cli.redis.zcard(KEYS.loop_runs(loop_id)) == 0
    by_name = [r["id"] for r in cli.json("runs", "hist")]
    by_id = [r["id"] for r in cli.json("runs", loop_id)]
    assert by_name == by_id == list(reversed(ids))
    missing = cli.run("runs", "never-was")
    assert (missing.exit_code, missing.stderr) == (1, "error: loop not found: never-was\n")


def test_a_rebuild_keeps_the_archived_runs_and_says_how_many(cli: Cli, clock: list[int]) -> None:
    _loop_id, ids = _history(cli, clock)
    out = cli.ok("mirror", "--rebuild")
    assert re.fullmatch(r"rebuilt \S+loops\.db: loops=1 workflows=0 kept 2 archived run\(s\) that Redis no longer "
                        r"holds\n", out), out
    assert [r["id"] for r in cli.json("runs", "hist")] == list(reversed(ids))
    assert cli.json("mirror", "--rebuild")["archivedKept"] == 2


def test_logs_of_a_run_that_left_redis_prints_its_recorded_output(cli: Cli, clock: list[int]) -> None:
    _loop_id, ids = _history(cli, clock)
    assert not cli.redis.exists(KEYS.run(ids[0]))
    assert cli.ok("logs", ids[0]) == f"out-{ids[0]}\n"
    assert cli.ok("logs", ids[3]) == f"out-{ids[3]}\n"  # still in Redis, its live stream long gone
    missing = cli.run("logs", "nope")
    assert (missing.exit_code, missing.stderr) == (1, "error: run not found: nope\n")


def test_prune_deletes_only_old_archived_rows_and_a_dry_run_nothing(cli: Cli, clock: list[int]) -> None:
    _loop_id, ids = _history(cli, clock)
    assert cli.ok("prune", "--older-than", "1h") == (
        "pruned loop_runs=0 workflow_runs=0 workflow_step_runs=0 workflow_events=0 (archived, created before "
        "2025-12-31T23:00:05.000Z)\n")
    clock[0] = 2 * 3600
    dry = cli.json("prune", "--older-than", "1h", "--loop", "hist", "--dry-run")
    assert dry == {"dryRun": True, "createdBefore": "2026-01-01T01:00:00.000Z", "loopRuns": 2, "workflowRuns": 0,
                   "workflowStepRuns": 0, "workflowEvents": 0}
    assert len(cli.json("runs", "hist")) == 4
    assert cli.ok("prune", "--older-than", "1h").startswith("pruned loop_runs=2 workflow_runs=0 ")
    # What Redis still holds stays, however old: the mirror keeps containing everything Redis has.
    assert [r["id"] for r in cli.json("runs", "hist")] == list(reversed(ids[2:]))
    unknown = cli.run("prune", "--older-than", "1h", "--loop", "nope")
    assert (unknown.exit_code, unknown.stderr) == (1, "error: loop not found: nope\n")


def test_create_keep_runs_reaches_the_api_body_shape(cli: Cli) -> None:
    created = cli.json("create", "command", "c", "--every", "1h", "--cmd", "true", "--keep-runs", "3")
    stored = json.loads(cli.redis.get(KEYS.loop(created["id"])))
    assert stored["keepRuns"] == 3


def test_a_workflow_run_past_its_window_is_still_inspected_from_the_mirror(
    cli: Cli, clock: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tmp_path / "wf.json"
    spec.write_text(json.dumps({"name": "wf", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}))
    cli.ok("workflows", "create", str(spec))
    cli.ok("workflows", "runs")  # the mirror exists from here on
    ids = []
    for _ in range(3):
        clock[0] += 1
        ids.append(cli.ok("workflows", "run", "wf", "--local").split()[0])
    monkeypatch.setenv("LOOPSQ_KEEP_WORKFLOW_RUNS", "1")
    clock[0] += 1
    cli.ok("tick")
    assert not cli.redis.exists(KEYS.wf_run(ids[0]))
    assert [r["id"] for r in cli.json("workflows", "runs", "wf")] == list(reversed(ids))
    inspected = cli.ok("workflows", "inspect", ids[0]).splitlines()
    assert inspected == [f"{ids[0]}  succeeded  wf", "  00  succeeded   a", "  events=4"]
    events = [line.split()[1] for line in cli.ok("workflows", "events", ids[0]).splitlines()]
    assert events == ["created", "step_started", "step_succeeded", "succeeded"]
