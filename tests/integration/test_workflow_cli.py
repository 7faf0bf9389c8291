"""The workflow run commands as real processes (reference §7.2): ``workflows run|runs|events|inspect|cancel|
recover`` and ``logs``, their exact human output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopsq.domain import timeutil
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.engine.runtime import Runtime
from loopsq.engine.workflow_runner import execute_workflow
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.procs import hostname, process_start_time
from tests.integration.processes import KEYS, Cluster, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

FAILED_B = "step b failed: process exited with code 1"


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def sh(step_id: str, script: str, **fields: Any) -> dict[str, Any]:
    return {"id": step_id, "target": {"type": "command", "command": script, "shell": True}, **fields}


def create_workflow(cluster: Cluster, steps: list[dict[str, Any]], name: str = "wf") -> str:
    """``loopsq workflows create`` of a spec file; returns the workflow id."""
    path = cluster.tmp / f"{name}.json"
    path.write_text(json.dumps({"name": name, "steps": steps}))
    out = cluster.cli("workflows", "create", str(path)).stdout
    assert out.startswith("created workflow ") and out.endswith(f" ({name}) steps={len(steps)}\n"), out
    return out.split()[2]


def stored(cluster: Cluster, steps: list[dict[str, Any]], name: str = "wf") -> dict[str, Any]:
    """The same, stored from this process (where the command is not what is tested, to keep the suite quick)."""
    return WorkflowStore(cluster.client).create(workflow_body_from_json({"name": name, "steps": steps}),
                                                timeutil.now())


def run_here(cluster: Cluster, spec: dict[str, Any]) -> str:
    """Execute a workflow run in this process; returns its id."""
    rt = Runtime(client=cluster.client, role="test").start()
    try:
        return execute_workflow(rt, spec).run_id
    finally:
        rt.stop()


def store(cluster: Cluster) -> WorkflowRunStore:
    return WorkflowRunStore(cluster.client)


def run_ids(cluster: Cluster) -> list[str]:
    """Workflow run ids, oldest first."""
    return [str(i) for i in cluster.client.zrange(KEYS.wf_runs, 0, -1)]


FAILING = [sh("a", "echo out-a"), sh("b", "exit 1", dependsOn=["a"]), sh("c", "true", dependsOn=["b"])]
"""A three-step workflow whose middle step fails: a succeeds, b fails, c (after b) is skipped."""


# -- workflows run ------------------------------------------------------------------------------------------
def test_workflows_run_local_prints_the_run_and_its_steps_and_exits_0_on_success(cluster: Cluster) -> None:
    create_workflow(cluster, [sh("a", "true"), sh("b", "true", dependsOn=["a"])])
    done = cluster.cli("workflows", "run", "wf", "--local")
    (run_id,) = run_ids(cluster)
    assert done.stdout == f"{run_id} succeeded\n  00  succeeded   a\n  01  succeeded   b\n"
    assert done.stderr == ""


def test_workflows_run_local_exits_1_when_the_workflow_fails(cluster: Cluster) -> None:
    create_workflow(cluster, FAILING)
    done = cluster.cli("workflows", "run", "wf", "--local", check=False)
    (run_id,) = run_ids(cluster)
    assert done.returncode == 1
    # The run's reason just under its line, each step's on its own line (a skipped step's: why it was skipped).
    assert done.stdout == (f"{run_id} failed\n  error: {FAILED_B}\n  00  succeeded   a\n"
                           f"  01  failed      b  process exited with code 1\n  02  skipped     c  {FAILED_B}\n")


@pytest.mark.timeout(60)
def test_workflows_run_on_a_worker_prints_the_run_the_worker_executed(cluster: Cluster) -> None:
    stored(cluster, [sh("a", 'echo "$LOOPS_WORKFLOW_RUN_ID" > ' + str(cluster.tmp / "seen"))])
    worker = cluster.start("worker")
    done = cluster.cli("workflows", "run", "wf")
    (run_id,) = run_ids(cluster)
    assert done.stdout == f"{run_id} succeeded\n  00  succeeded   a\n"
    assert done.stderr == f"workflow run {run_id} queued\n"  # its id first, before the wait
    assert (cluster.tmp / "seen").read_text().strip() == run_id
    assert store(cluster).require(run_id).run["workerId"] == cluster.worker_id(worker)


def test_workflows_run_without_a_worker_says_so_after_its_wait_naming_the_queued_run(cluster: Cluster) -> None:
    stored(cluster, [sh("a", "true")])
    for wait in ("0.5", "0"):
        done = cluster.cli("workflows", "run", "wf", "--wait", wait, check=False)
        run_id = done.stderr.split()[2]
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (f"workflow run {run_id} queued\n"
                               f"error: no worker picked up workflow run {run_id} within {wait}s; it stays queued for a "
                               "worker (is `loopsq worker` running? --no-wait returns at once; --local runs it here)\n")
    # It did stay queued: a worker that comes runs both.
    cluster.start("worker")
    cluster.wait_until(lambda: len(ids := run_ids(cluster)) == 2 and all(
        store(cluster).require(i).run["status"] == "succeeded" for i in ids), 20, "both queued runs to succeed")


@pytest.mark.timeout(60)
def test_workflows_run_no_wait_queues_the_run_prints_its_id_and_exits_0(cluster: Cluster) -> None:
    stored(cluster, [sh("a", "sleep 0.5")])
    queued = cluster.cli("workflows", "run", "wf", "--no-wait")
    run_id = queued.stdout.split()[0]
    assert (queued.returncode, queued.stdout, queued.stderr) == (0, f"{run_id} queued\n", "")
    spec = json.loads(cluster.cli("--json", "workflows", "run", "wf", "--no-wait").stdout)
    assert set(spec) == {"runId", "workflowId", "workflowName", "status"}
    assert (spec["workflowName"], spec["status"]) == ("wf", "queued")
    refused = cluster.cli("workflows", "run", "wf", "--no-wait", "--local", check=False)
    assert (refused.returncode, refused.stderr) == (
        2, "error: --no-wait runs the workflow on a worker; drop --local or --no-wait\n")
    cluster.start("worker")
    for queued_id in (run_id, spec["runId"]):
        cluster.wait_until(lambda i=queued_id: (s := store(cluster).load(i)) and s.terminal, 20, "the run to end")
        assert store(cluster).require(queued_id).run["status"] == "succeeded"


# -- runs, events, inspect ----------------------------------------------------------------------------------
def test_workflows_runs_lists_newest_first_with_padded_status_and_start(cluster: Cluster) -> None:
    run_here(cluster, stored(cluster, FAILING))
    run_here(cluster, stored(cluster, [sh("x", "true")], name="other"))
    first, second = (store(cluster).require(i).run for i in run_ids(cluster))
    listed = cluster.cli("workflows", "runs").stdout
    assert listed == (f"{second['id']}  succeeded   other  started={second['startedAt']}\n"
                      f"{first['id']}  failed      wf  started={first['startedAt']}\n")
    assert cluster.cli("workflows", "runs", "wf").stdout == f"{first['id']}  failed      wf  started={first['startedAt']}\n"
    assert cluster.cli("workflows", "runs", "--limit", "1").stdout.count("\n") == 1
    missing = cluster.cli("workflows", "runs", "nope", check=False)
    assert (missing.returncode, missing.stderr) == (1, "error: workflow not found: nope\n")


def test_workflows_events_prints_each_event_with_its_zero_padded_sequence(cluster: Cluster) -> None:
    run_id = run_here(cluster, stored(cluster, FAILING))
    stamps = [e["createdAt"] for e in store(cluster).events(run_id)]
    expected = [("created", "-"), ("step_started", "a"), ("step_succeeded", "a"), ("step_started", "b"),
                ("step_failed", "b"), ("step_skipped", "c"), ("failed", "-")]
    lines = [f"{i + 1:03d}  {kind:<14}  {step_id}  {stamps[i]}" for i, (kind, step_id) in enumerate(expected)]
    assert cluster.cli("workflows", "events", run_id).stdout == "\n".join(lines) + "\n"
    assert lines[0].startswith("001  created         -  ")
    assert cluster.cli("workflows", "events", run_id, "--limit", "2").stdout == "\n".join(lines[:2]) + "\n"
    missing = cluster.cli("workflows", "events", "nope", check=False)
    assert (missing.returncode, missing.stderr) == (1, "error: workflow run not found: nope\n")


def test_workflows_inspect_prints_the_run_its_steps_and_the_event_count(cluster: Cluster) -> None:
    run_id = run_here(cluster, stored(cluster, FAILING))
    assert cluster.cli("workflows", "inspect", run_id).stdout == (
        f"{run_id}  failed  wf\n"
        f"  error: {FAILED_B}\n"
        "  00  succeeded   a\n"
        "  01  failed      b  process exited with code 1\n"
        f"  02  skipped     c  {FAILED_B}\n"
        "  events=7\n"
    )
    body = json.loads(cluster.cli("--json", "workflows", "inspect", run_id).stdout)
    assert (body["workflowRun"]["id"], len(body["steps"]), len(body["events"])) == (run_id, 3, 7)
    assert body["steps"][0]["stdout"] == "[redacted 6 chars]"  # "out-a\n"
    missing = cluster.cli("workflows", "inspect", "nope", check=False)
    assert (missing.returncode, missing.stderr) == (1, "error: workflow run not found: nope\n")


# -- cancel and recover -------------------------------------------------------------------------------------
def _seed_running(cluster: Cluster, **step_a: Any) -> str:
    """A run left ``running`` with step a ``running`` with the given pid fields (as a dead process leaves it)."""
    spec = WorkflowStore(cluster.client).create(workflow_body_from_json(
        {"name": "seeded", "steps": [sh("a", "true"), sh("b", "true")]}), timeutil.now())
    runs = store(cluster)
    state, _ = runs.create(spec, timeutil.now(), owner=step_a.pop("worker", None))
    assert runs.start_step(state, "a", timeutil.now())
    assert runs.mark_step_pid(state, "a", timeutil.now(), **step_a)
    return state.run_id


def test_workflows_cancel_prints_the_status_and_leaves_a_terminal_run_unchanged(cluster: Cluster) -> None:
    run_id = _seed_running(cluster, pid=999_999, start_time=None, host="elsewhere")
    assert cluster.cli("workflows", "cancel", run_id, "--reason", "no longer needed").stdout == f"{run_id} cancelled\n"
    state = store(cluster).require(run_id)
    assert (state.run["status"], state.run["error"]) == ("cancelled", "no longer needed")
    assert {s["stepId"]: s["status"] for s in state.ordered_steps()} == {"a": "cancelled", "b": "cancelled"}
    assert cluster.cli("workflows", "cancel", run_id).stdout == f"{run_id} cancelled\n"
    assert store(cluster).require(run_id).run["error"] == "no longer needed"
    missing = cluster.cli("workflows", "cancel", "nope", check=False)
    assert (missing.returncode, missing.stderr) == (1, "error: workflow run not found: nope\n")


def test_workflows_recover_refuses_while_the_recorded_process_lives_on_this_host(cluster: Cluster) -> None:
    me = os.getpid()
    run_id = _seed_running(cluster, pid=me, start_time=process_start_time(me), host=hostname())
    refused = cluster.cli("workflows", "recover", run_id, check=False)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == f"error: cannot recover workflow run while step processes are still alive: a pid={me}\n"


def test_workflows_recover_treats_a_reused_pid_with_another_start_time_as_dead(cluster: Cluster) -> None:
    me = os.getpid()
    run_id = _seed_running(cluster, pid=me, start_time=(process_start_time(me) or 0) - 100, host=hostname())
    assert cluster.cli("workflows", "recover", run_id).stdout == f"{run_id} recovered=1\n"
    body = json.loads(cluster.cli("--json", "workflows", "recover", run_id).stdout)
    assert (body["workflowRun"]["status"], body["recoveredSteps"]) == ("running", [])


def test_workflows_recover_on_another_hosts_step_follows_that_hosts_worker_liveness(cluster: Cluster) -> None:
    run_id = _seed_running(cluster, pid=4242, start_time=1.0, host="other-host", worker="worker:other-host:1:abc")
    cluster.client.set(KEYS.worker("worker:other-host:1:abc"), "{}", px=60_000)
    refused = cluster.cli("workflows", "recover", run_id, check=False)
    assert refused.stderr == "error: cannot recover workflow run while step processes are still alive: a pid=4242\n"
    cluster.client.delete(KEYS.worker("worker:other-host:1:abc"))
    assert cluster.cli("workflows", "recover", run_id, "--reason", "host lost").stdout == f"{run_id} recovered=1\n"
    step_a = store(cluster).require(run_id).steps["a"]
    assert (step_a["status"], step_a["error"]) == ("pending", "host lost")


# -- logs ---------------------------------------------------------------------------------------------------
def _start_logs(cluster: Cluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "loopsq", "logs", *args], env=cluster.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _blocked_readers(cluster: Cluster) -> int:
    """Clients of the server blocked in XREAD (a ``logs -f`` waiting for output)."""
    return sum(1 for c in cluster.client.client_list() if c.get("cmd") == "xread" and "b" in c.get("flags", ""))


@pytest.mark.timeout(60)
def test_logs_follow_prints_a_steps_lines_as_they_come_and_ends_with_the_step(cluster: Cluster) -> None:
    go = cluster.tmp / "go"
    talk = f"while [ ! -e {go} ]; do sleep 0.02; done; for i in 1 2 3 4 5; do echo line$i; sleep 0.25; done"
    stored(cluster, [sh("quiet", "true"), sh("talk", talk, dependsOn=["quiet"])])
    cluster.start("worker")
    running = subprocess.Popen([sys.executable, "-m", "loopsq", "workflows", "run", "wf"], env=cluster.env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        run_id = cluster.wait_until(lambda: (ids := run_ids(cluster)) and ids[0], 20, "the run to be created")
        follower = _start_logs(cluster, run_id, "--step", "talk", "-f")
        cluster.wait_until(lambda: _blocked_readers(cluster), 20, "logs -f to wait for output", every=0.02)
        go.touch()  # the step starts printing only once the follower is waiting
        assert follower.stdout is not None
        arrivals = [(time.monotonic(), line) for line in follower.stdout]
        assert follower.wait(timeout=10) == 0, follower.stderr.read() if follower.stderr else ""
        ended = time.monotonic()
        assert [line for _, line in arrivals] == [f"line{i}\n" for i in range(1, 6)]
        # Followed, not dumped at the end: the lines came over the second the step took to print them.
        assert arrivals[-1][0] - arrivals[0][0] >= 0.75, arrivals
        assert ended - arrivals[-1][0] < 2
        assert running.wait(timeout=20) == 0
    finally:
        running.kill()
        running.communicate(timeout=10)
    # Afterwards, without -f, the whole output is printed at once.
    assert cluster.cli("logs", run_id, "--step", "talk").stdout == "".join(f"line{i}\n" for i in range(1, 6))


@pytest.mark.timeout(60)
def test_logs_follow_of_a_step_that_prints_nothing_ends_when_the_step_ends(cluster: Cluster) -> None:
    run_id = run_here(cluster, stored(cluster, [sh("silent", "sleep 0.5")]))
    follower = _start_logs(cluster, run_id, "--step", "silent", "-f")
    try:
        out, err = follower.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        follower.kill()
        follower.communicate()
        raise AssertionError("logs -f kept waiting for a step that ended without output") from None
    assert (follower.returncode, out, err) == (0, "", "")


def test_logs_follow_exits_1_when_what_it_followed_failed_as_run_now_does(cluster: Cluster) -> None:
    run_id = run_here(cluster, stored(cluster, FAILING))
    for args, code in (((), 1), (("--step", "b"), 1), (("--step", "a"), 0)):
        done = cluster.cli("logs", run_id, *args, "-f", check=False)
        assert done.returncode == code, (args, done.stdout, done.stderr)
    assert cluster.cli("logs", run_id, check=False).returncode == 0  # without -f: only the output, as before
    ok_id = run_here(cluster, stored(cluster, [sh("a", "echo fine")], name="ok"))
    assert cluster.cli("logs", ok_id, "-f").stdout == "a | fine\n"


@pytest.mark.timeout(60)
def test_logs_follow_of_a_loop_run_that_fails_while_followed_exits_1(cluster: Cluster) -> None:
    go = cluster.tmp / "go"
    cluster.create("flaky", f"while [ ! -e {go} ]; do sleep 0.02; done; echo dying; exit 3", "--at",
                   "2020-01-01T00:00:00Z")
    cluster.start_all(schedulers=1, workers=1)
    run = cluster.wait_until(lambda: (runs := cluster.runs("flaky")) and runs[0], 30, "the run to start")
    follower = _start_logs(cluster, run.id, "-f")
    try:
        cluster.wait_until(lambda: _blocked_readers(cluster), 20, "logs -f to wait for output", every=0.02)
        go.touch()
        out, err = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert (follower.returncode, out, err) == (1, "dying\n", "")


def test_logs_of_an_unknown_run_or_step_says_which(cluster: Cluster) -> None:
    run_id = run_here(cluster, stored(cluster, [sh("a", "true")]))
    missing = cluster.cli("logs", "nope", check=False)
    assert (missing.returncode, missing.stderr) == (1, "error: run not found: nope\n")
    no_step = cluster.cli("logs", run_id, "--step", "zz", check=False)
    assert (no_step.returncode, no_step.stderr) == (1, f"error: workflow step not found: {run_id}/zz\n")


TWO_TALKING = [sh("first", "echo one; echo uno >&2; printf 'no newline'"), sh("second", "echo two", dependsOn=["first"])]


def test_logs_of_a_workflow_run_prints_every_step_each_line_behind_its_step_id(cluster: Cluster) -> None:
    run_id = run_here(cluster, stored(cluster, TWO_TALKING))
    done = cluster.cli("logs", run_id)
    assert done.stdout == "first | one\nfirst | no newline\nsecond | two\n"
    assert done.stderr == "first | uno\n"
    # One step alone is printed as it was written, without the prefix.
    assert cluster.cli("logs", run_id, "--step", "first").stdout == "one\nno newline"


def test_logs_json_prints_one_json_object_per_line(cluster: Cluster) -> None:
    run_id = run_here(cluster, stored(cluster, TWO_TALKING))
    rows = [json.loads(line) for line in cluster.cli("logs", run_id, "--json").stdout.splitlines()]
    assert rows == [
        {"runId": run_id, "stepId": "first", "stream": "stdout", "line": "one"},
        {"runId": run_id, "stepId": "first", "stream": "stdout", "line": "no newline"},
        {"runId": run_id, "stepId": "first", "stream": "stderr", "line": "uno"},
        {"runId": run_id, "stepId": "second", "stream": "stdout", "line": "two"},
    ]


@pytest.mark.timeout(90)
def test_logs_of_a_workflow_loops_run_prints_its_steps_and_follows_them(cluster: Cluster) -> None:
    go = cluster.tmp / "go"
    wait = f"while [ ! -e {go} ]; do sleep 0.02; done"
    stored(cluster, [sh("prep", "echo ready"), sh("talk", f"{wait}; echo late1; sleep 0.3; echo late2",
                                                   dependsOn=["prep"])], name="flow")
    cluster.cli("create", "workflow", "wfloop", "--workflow", "flow", "--at", "2020-01-01T00:00:00Z")
    cluster.start_all(schedulers=1, workers=1)
    loop_run = cluster.wait_until(lambda: (runs := cluster.runs("wfloop")) and runs[0], 30, "the loop run")
    cluster.wait_until(lambda: (ids := run_ids(cluster)) and (s := store(cluster).load(ids[0])) and s.steps["talk"]["status"]
                       == "running", 30, "step talk to start")
    follower = _start_logs(cluster, loop_run.id, "-f")
    try:
        cluster.wait_until(lambda: _blocked_readers(cluster), 20, "logs -f to wait for output", every=0.02)
        go.touch()
        out, err = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert (follower.returncode, err) == (0, "")
    assert out == "prep | ready\ntalk | late1\ntalk | late2\n"
    cluster.wait_until(lambda: (r := cluster.run(loop_run.id)) and r.terminal, 30, "the loop run to end")
    assert cluster.cli("logs", loop_run.id).stdout == "prep | ready\ntalk | late1\ntalk | late2\n"


@pytest.mark.timeout(60)
def test_logs_of_an_ended_run_is_its_stored_output_after_the_live_window_is_gone(cluster: Cluster) -> None:
    cluster.create("talker", "echo stored-line; echo err-line >&2", "--at", "2020-01-01T00:00:00Z")
    cluster.start_all(schedulers=1, workers=1)
    run = cluster.wait_until(lambda: (runs := cluster.runs("talker")) and runs[0].terminal and runs[0], 30,
                             "the run to end")
    cluster.client.delete(KEYS.live(run.id))
    done = cluster.cli("logs", run.id)
    assert (done.stdout, done.stderr) == ("stored-line\n", "err-line\n")
