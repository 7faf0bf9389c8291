"""Result-driven cadence with real schedulers and workers: a target's $LOOPS_CONTROL_FILE moves, stops and pauses
its loop; its outcome is recorded on the run, mirrored and filterable; a malformed file is only a warning."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.timeutil import from_iso
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def counting_cmd(cluster: Cluster, name: str, then: str, after: int, before: str = '{"outcome":"no_op"}') -> str:
    """A command that writes ``before`` to its control file on its first ``after`` runs, then ``then``."""
    counter = cluster.ledger_dir / f"count-{name}"
    return (f'n=$(($(cat {counter} 2>/dev/null || echo 0) + 1)); echo $n > {counter}; '
            f'if [ $n -le {after} ]; then printf %s \'{before}\' > "$LOOPS_CONTROL_FILE"; '
            f'else printf %s \'{then}\' > "$LOOPS_CONTROL_FILE"; fi')


@pytest.mark.timeout(60)
def test_a_loop_whose_run_says_done_stops_after_that_run_and_outcomes_are_recorded(cluster: Cluster) -> None:
    cluster.create("steer", counting_cmd(cluster, "steer", '{"outcome":"done","note":"all green"}', 2),
                   "--every", "1s")
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: cluster.loop("steer")["status"] == "stopped", 30, "the loop to stop itself")
    runs = cluster.ran("steer")
    assert [r.outcome for r in runs] == ["no_op", "no_op", "done"], [r.to_dict() for r in runs]
    assert [r.status for r in runs] == ["succeeded"] * 3
    loop = cluster.loop("steer")
    assert loop["statusReason"] == f"stopped by run {runs[-1].id} (done): all green"
    assert "nextRunAt" not in loop
    assert runs[-1].control == {"outcome": "done", "note": "all green"}
    # The outcome is one column of the mirror, and filterable.
    out = json.loads(cluster.cli("runs", "steer", "--outcome", "no_op", "--json").stdout)
    assert [r["id"] for r in out] == [runs[1].id, runs[0].id]
    human = cluster.cli("runs", "steer", "--outcome", "done").stdout
    assert "  outcome: done: all green" in human
    # The stop is part of the run's own transition: one change entry, noting loop_stopped.
    ends = [c for c in cluster.changes() if c["type"] == "run_succeeded"
            and any(r["id"] == runs[-1].id for r in c["data"].get("upsert", {}).get("loop_runs", []))]
    assert len(ends) == 1 and "loop_stopped" in ends[0]["data"]["also"]


@pytest.mark.timeout(60)
def test_next_in_moves_a_steerable_loops_next_slot_within_its_bounds(cluster: Cluster) -> None:
    cmd = 'printf %s \'{"outcome":"progress","nextIn":"3h"}\' > "$LOOPS_CONTROL_FILE"'
    cluster.create("later", cmd, "--every", "1s", "--steerable", "--max-interval", "2h")
    cluster.start_all(schedulers=1, workers=1)
    run = cluster.wait_until(lambda: [r for r in cluster.ran("later") if r.status == "succeeded"], 20,
                             "a run")[0]
    assert run.finished_at is not None
    loop = cluster.wait_until(lambda: cluster.loop("later") if cluster.loop("later").get("nextRunAt") else None, 5,
                              "a next slot")
    delta = (from_iso(loop["nextRunAt"]) - from_iso(run.finished_at)).total_seconds()
    assert delta == 7200, loop  # clamped to --max-interval
    assert cluster.timer_at("later") == pytest.approx(from_iso(loop["nextRunAt"]).timestamp(), abs=0.01)
    assert len(cluster.ran("later")) == 1


@pytest.mark.timeout(60)
def test_next_in_of_a_loop_that_is_not_steerable_changes_nothing(cluster: Cluster) -> None:
    cmd = 'printf %s \'{"outcome":"progress","nextIn":"3h"}\' > "$LOOPS_CONTROL_FILE"'
    cluster.create("fixed", cmd, "--every", "1s")
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: sum(r.status == "succeeded" for r in cluster.ran("fixed")) >= 3, 20, "three runs")
    assert {r.outcome for r in cluster.ran("fixed") if r.status == "succeeded"} == {"progress"}


@pytest.mark.timeout(60)
def test_needs_human_pauses_the_loop_with_the_note_as_reason(cluster: Cluster) -> None:
    cmd = 'printf %s \'{"outcome":"needs_human","note":"merge conflict in main"}\' > "$LOOPS_CONTROL_FILE"'
    cluster.create("human", cmd, "--every", "1s")
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: cluster.loop("human")["status"] == "paused", 20, "the loop to pause")
    assert cluster.loop("human")["statusReason"] == "needs_human: merge conflict in main"
    assert [r.outcome for r in cluster.ran("human")] == ["needs_human"]
    shown = json.loads(cluster.cli("show", "human").stdout)
    assert shown["statusReason"] == "needs_human: merge conflict in main"
    # Under load, a slot that came due while the processes started may be recorded missed (catch-up latest) at
    # the same moment as the run: ``lastRun`` is then that record, which ran nothing.
    last = shown["lastRun"]
    assert last["outcome"] == "needs_human" if last["status"] != "missed" else last["missedKind"] == "catch_up"
    ran = [r for r in json.loads(cluster.cli("runs", "human", "--json").stdout) if r["status"] != "missed"]
    assert [r["outcome"] for r in ran] == ["needs_human"]


@pytest.mark.timeout(60)
def test_a_malformed_control_file_is_a_warning_on_the_run_and_changes_nothing_else(cluster: Cluster) -> None:
    cmd = 'printf %s \'{"outcome":"finished","stop":true}\' > "$LOOPS_CONTROL_FILE"'
    cluster.create("bad", cmd, "--every", "1s")
    cluster.start_all(schedulers=1, workers=1)
    cluster.wait_until(lambda: sum(r.status == "succeeded" for r in cluster.ran("bad")) >= 2, 20, "two runs")
    run = cluster.ran("bad")[0]
    assert run.control_warning == ("control file ignored: outcome must be one of progress, no_op, done, needs_human, "
                                   'got "finished"')
    assert run.outcome is None and run.control is None
    assert cluster.loop("bad")["status"] == "active"
    human = cluster.cli("runs", "bad").stdout
    assert '  warning: control file ignored: outcome must be one of' in human
