"""Upgrading a live deployment (issue #28) with real processes of both releases on one redis-server: the previous
release (0.1.0, commit 9923ab3, state layout v1) runs loops with a pending retry, a running run, a workflow
loop on a spec it archives, a workflow run mid-step and a trigger with an idempotency key; it is stopped (the
workers holding runs crash); ``loopsq migrate`` moves the state to v2; today's scheduler and worker carry on, and
the history reads the same from the CLI, the API and the dashboard. Then a process that finds the state newer than
it knows exits 2 with one line.

The previous release is extracted with ``git archive`` (once per session) and run on this venv's interpreter with
``PYTHONPATH`` pointing at it: its dependency ranges are within today's (checked: it starts and runs here).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from loopsq import __version__
from loopsq.domain import timeutil
from tests.integration.processes import KEYS, Cluster, Proc, open_cluster
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

#: Until the first tag after versioning, the previous release is this commit (issue #28).
PREVIOUS = "9923ab3"
ROOT = Path(__file__).resolve().parents[2]
META = {"layout": "2", "readableFrom": "2"}
#: How long (wall time) 0.1.0's scheduler and workers run beside today's, restarted each time they exit.
MIXED_FLEET_S = 120.0
#: How long a process manager waits before it starts an exited process again (``loopsq install``'s RestartSec).
RESTART_AFTER_S = 5.0
#: A loop whose ledger got nothing for this long has stalled.
STALL_S = 10.0
#: What today's worker (and CLI) says of a v1 state, its one line.
V1_REFUSED = ("error: this Redis holds loopsq state v1; this loopsq reads v2: run `loopsq migrate` (a scheduler "
              "does at its start)\n")


@pytest.fixture(scope="session")
def previous_release() -> Iterator[Path]:
    """The previous release's source tree (``git archive`` of ``PREVIOUS``), extracted once per session."""
    have = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], capture_output=True)
    if have.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this clone (a shallow clone?): fetch the history to run it")
    where = Path(tempfile.mkdtemp(prefix="loopsq-previous-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS, "loopsq", "worker"],
                             capture_output=True, check=True)
    tar = where / "src.tar"
    tar.write_bytes(archive.stdout)
    with tarfile.open(tar) as bundle:
        bundle.extractall(where, filter="data")
    tar.unlink()
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    # A server of this test's own: these tests stamp layouts no process of this release may use, and a process
    # (or a guard thread a test left in the session's process) on a shared server would rightly exit on it.
    server = RedisServer().start()
    try:
        yield from open_cluster(server.url, tmp_path)
    finally:
        server.cleanup()


#: The Python of a venv the previous release is installed in (``.ci/upgrade_test.sh``); without it, this venv's
#: interpreter runs the extracted source.
OWN_VENV = os.environ.get("LOOPSQ_UPGRADE_FROM_PYTHON")


def old_env(cluster: Cluster, old: Path) -> dict[str, str]:
    env = {k: v for k, v in cluster.env.items() if k != "PYTHONPATH"}
    return env if OWN_VENV else {**env, "PYTHONPATH": str(old)}


def old_argv(*args: str) -> list[str]:
    return [OWN_VENV or sys.executable, "-m", "loopsq", *args]


def old_cli(cluster: Cluster, old: Path, *args: str) -> str:
    done = subprocess.run(old_argv(*args), env=old_env(cluster, old), capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=cluster.tmp)
    assert done.returncode == 0, f"0.1.0 loopsq {args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def start_old(cluster: Cluster, old: Path, role: str, name: str) -> Proc:
    log = cluster.tmp / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(old_argv(role), env=old_env(cluster, old), stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cluster.tmp)
    proc = Proc(name, popen, log)
    cluster.procs.append(proc)
    return proc


def at(seconds: float) -> str:
    return timeutil.to_iso(timeutil.now() + timedelta(seconds=seconds))


def test_a_v1_deployment_stopped_migrated_and_restarted_on_v2_carries_on(cluster: Cluster,
                                                                          previous_release: Path) -> None:
    old = previous_release
    ledger = cluster.ledger_cmd()
    assert old_cli(cluster, old, "--version") == "0.1.0\n"
    old_cli(cluster, old, "create", "command", "fast", "--cmd", ledger, "--every", "2s")
    old_cli(cluster, old, "create", "command", "retry", "--cmd", f"{ledger}; exit 1", "--at", at(2),
            "--attempts", "3", "--retry-delay", "20s")
    old_cli(cluster, old, "create", "command", "slow", "--cmd", f"sleep 20; {ledger}", "--at", at(2))
    spec = cluster.tmp / "wf.json"
    spec.write_text(json.dumps({"name": "wf", "steps": [
        {"id": "a", "target": {"type": "command", "command": "true", "shell": True}},
        {"id": "b", "target": {"type": "command", "command": "true", "shell": True}, "dependsOn": ["a"]}]}))
    old_cli(cluster, old, "workflows", "create", str(spec))
    old_cli(cluster, old, "create", "workflow", "wfloop", "--workflow", "wf", "--every", "3s")
    # A workflow run mid-step at the switch: step a is still sleeping when its worker dies; b never starts.
    steps = cluster.ledger_dir
    mid = cluster.tmp / "wfmid.json"
    mid.write_text(json.dumps({"name": "wfmid", "steps": [
        {"id": "a", "target": {"type": "command", "command": f"echo a >> {steps}/step-a; sleep 40; "
                                                             f"echo done >> {steps}/step-a", "shell": True}},
        {"id": "b", "target": {"type": "command", "command": f"echo b >> {steps}/step-b", "shell": True},
         "dependsOn": ["a"]}]}))
    old_cli(cluster, old, "workflows", "create", str(mid))
    old_cli(cluster, old, "create", "workflow", "midstep", "--workflow", "wfmid", "--at", at(2))
    procs = [start_old(cluster, old, "scheduler", "old-scheduler")]
    procs += [start_old(cluster, old, "worker", f"old-worker{i}") for i in (1, 2, 3)]
    cluster.wait_started(*procs)

    # Live state at the switch: a pending retry (attempt 1 failed), a running run, workflow runs, history.
    retry_loop = cluster.wait_until(lambda: (lp := cluster.loop("retry")).get("retryScheduledFor") and lp, 30,
                                    "retry's attempt 1 to fail under 0.1.0")
    slow = cluster.wait_until(lambda: [r for r in cluster.runs("slow") if r.status == "running"], 30,
                              "slow to be running under 0.1.0")[0]
    cluster.wait_until(lambda: any(r.status == "succeeded" for r in cluster.runs("wfloop")), 30, "a workflow run")
    # An archived spec with history: wfloop refers to wf by id and goes on (0.1.0 archives specs, not loops).
    wf_id = old_cli(cluster, old, "workflows", "archive", "wf").split()[0]
    midstep = cluster.wait_until(lambda: (steps / "step-a").exists() and [
        r for r in cluster.runs("midstep") if r.status == "running"], 30, "midstep's step a to be running")[0]
    cluster.wait_until(lambda: len(cluster.runs("fast")) >= 3, 30, "fast's runs under 0.1.0")
    triggered = old_cli(cluster, old, "trigger", "fast", "--key", "deploy-42").split()[0]
    cluster.wait_until(lambda: (r := cluster.run(triggered)) and r.status == "succeeded", 30, "the trigger's run")
    assert cluster.client.keys("loopsq:slot:*"), "0.1.0 writes a key per slot"
    # Today's scheduler started beside live 0.1.0 processes refuses to migrate (stop-the-world), changing nothing.
    early = cluster.start("scheduler", name="early-scheduler", wait=False)
    assert early.popen.wait(timeout=30) == 2
    assert early.text().startswith("error: 4 loopsq process(es) are live on this Redis (")
    assert early.text().endswith("); stop every 0.1.0 scheduler and worker before migrating from v1\n")
    assert early.text().count("\n") == 1
    assert not cluster.client.exists(KEYS.meta) and not cluster.client.exists(KEYS.migrate_lock)
    for holder in [p for p in procs if cluster.worker_id(p) in (slow.worker_id, midstep.worker_id)]:
        holder.kill9()  # a crash at the switch: the running runs are left to recovery
    for proc in procs:
        proc.terminate()
    old_ids = {name: {r.id for r in cluster.runs(name)} for name in ("fast", "retry", "slow", "wfloop", "midstep")}
    (retry_run,) = cluster.runs("retry")
    assert (retry_run.attempt, retry_run.status) == (1, "failed")

    # Today's processes refuse the v1 state until it is migrated.
    refused = cluster.cli("list", check=False)
    assert (refused.returncode, refused.stderr) == (2, "error: this Redis holds loopsq state v1; this loopsq "
                                                       "reads v2: run `loopsq migrate` (a scheduler does at its start)\n")
    worker = cluster.start("worker", wait=False)
    assert worker.popen.wait(timeout=30) == 2
    assert worker.text() == refused.stderr  # its one line, and nothing else
    cluster.wait_until(lambda: not cluster.client.keys("loopsq:worker:*") and not cluster.client.keys(
        "loopsq:scheduler:*"), 20, "the killed worker's liveness to expire")
    dry = cluster.cli("migrate", "--dry-run").stdout
    assert dry.startswith("v1 -> v2: would move ") and dry.endswith(" would stamp layout v2\n"), dry
    assert cluster.client.keys("loopsq:slot:*") and not cluster.client.exists(KEYS.meta)
    done = cluster.cli("migrate").stdout
    assert done.startswith("v1 -> v2: moved ") and done.endswith("stamped layout v2\n"), done
    assert cluster.client.keys("loopsq:slot:*") == []
    assert cluster.client.hgetall(KEYS.meta) == META
    assert cluster.cli("migrate").stdout == "state is v2: nothing to migrate\n"

    cluster.start_all(schedulers=1, workers=1)
    # The pending retry runs its next attempt on the same row, once, at its time (20 s after attempt 1 failed).
    again = cluster.wait_until(lambda: [r for r in cluster.runs("retry") if r.attempt >= 2 and r.status != "running"],
                               60, "retry's attempt 2 under 0.2.0")
    assert [r.id for r in again] == [retry_run.id]
    assert [a["attempt"] for a in again[0].previous_attempts] == [1]
    assert len(cluster.ledger("retry")) == 2  # attempt 1 (0.1.0) and attempt 2 (0.2.0), nothing twice
    assert cluster.loop("retry")["retryScheduledFor"] == retry_loop["retryScheduledFor"]  # attempt 3 pending
    # The running run of the crashed worker is recovered once, under its own row; its slot never ran again.
    recovered = cluster.wait_until(lambda: (r := cluster.run(slow.id)) and r.status != "running" and r, 30,
                                   "slow's run to be recovered")
    assert recovered.status == "abandoned"
    assert [r.id for r in cluster.runs("slow")] == [slow.id]
    assert cluster.ledger("slow") == []  # (its process died with its worker: the watchdog)
    # So is the workflow run mid-step: its loop run abandoned once (its workflow run failed, b skipped).
    halted = cluster.wait_until(lambda: (r := cluster.run(midstep.id)) and r.status != "running" and r, 30,
                                "midstep's run to be recovered")
    assert halted.status == "abandoned"
    assert [r.id for r in cluster.runs("midstep")] == [midstep.id]
    (wf_run,) = json.loads(cluster.cli("workflows", "runs", "wfmid", "--json").stdout)
    seen = json.loads(cluster.cli("workflows", "inspect", wf_run["id"], "--json").stdout)
    assert seen["workflowRun"]["status"] == "failed", seen
    assert {s["stepId"]: s["status"] for s in seen["steps"]} == {"a": "skipped", "b": "skipped"}, seen  # (§3.8)
    # The other loops go on; every slot ran once; the whole history reads from the CLI.
    cluster.wait_until(lambda: len({r.id for r in cluster.runs("fast")} - old_ids["fast"]) >= 2, 30, "fast under 0.2.0")
    cluster.wait_until(lambda: any(r.id not in old_ids["wfloop"] and r.status == "succeeded"
                                   for r in cluster.runs("wfloop")), 30, "a workflow run under 0.2.0")
    slots = [line[0] for line in cluster.ledger("fast")]
    assert len(slots) == len(set(slots)), "a slot of fast ran twice"
    listed = json.loads(cluster.cli("runs", "fast", "--limit", "1000", "--json").stdout)
    assert old_ids["fast"] <= {r["id"] for r in listed}
    assert cluster.client.keys("loopsq:slot:*") == []
    # A trigger's idempotency key given under 0.1.0 still stands for its run.
    assert cluster.cli("trigger", "fast", "--key", "deploy-42").stdout.split()[0] == triggered
    # The spec archived under 0.1.0 is listed as archived; a loop whose runs all come from 0.1.0, archived
    # today, keeps its history in the CLI.
    archived = json.loads(cluster.cli("workflows", "list", "--status", "archived", "--json").stdout)
    assert [(s["id"], s["name"]) for s in archived] == [(wf_id, "wf")]
    assert cluster.cli("archive", "slow").stdout.startswith(f"{cluster.loop('slow')['id']} archived")
    assert "slow" in cluster.cli("list", "--archived").stdout
    cli_ids = {name: {r["id"] for r in json.loads(cluster.cli("runs", name, "--limit", "1000", "--json").stdout)}
               for name in old_ids}
    assert cli_ids["slow"] == {slow.id} and cli_ids["midstep"] == {midstep.id}
    assert_history_in_api_and_dashboard(cluster, old_ids, cli_ids)
    # Step a ran once and was not run again (nor finished: its process died with its worker); b never ran.
    assert (steps / "step-a").read_text() == "a\n" and not (steps / "step-b").exists()

    # Rolling deploy: a newer release migrates; every process of this one exits 2 with one line, writing nothing.
    cluster.client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "3"})
    line = "error: this Redis holds loopsq state v3; this loopsq reads v2: upgrade it"
    for proc in cluster.procs[-2:]:
        assert proc.popen.wait(timeout=30) == 2, proc.text()
        assert proc.text().rstrip().splitlines()[-1] == line


def assert_history_in_api_and_dashboard(cluster: Cluster, old_ids: dict[str, set[str]],
                                        cli_ids: dict[str, set[str]]) -> None:
    """Today's web app, in this process on the same Redis and data dir, lists the same runs as the CLI (the
    0.1.0 ones among them, the archived loop's too) and shows them on each loop's page."""
    from fastapi.testclient import TestClient

    from loopsq.web import WebSettings, create_app

    token = "upgrade-test-token-0123456789"
    settings = WebSettings(redis_url=cluster.url, data_dir=Path(cluster.env["LOOPSQ_DATA_DIR"]), token=token,
                           follow_mirror=False, rq_dashboard=False)
    # (The context closes the app's layout guard before the test stamps a layout this release does not read.)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {token}"}) as web:
        for name, before in old_ids.items():
            page = web.get("/api/runs", params={"loop": name, "limit": 500})
            assert page.status_code == 200, page.text
            assert before <= {r["id"] for r in page.json()["items"]}, name
        # The loops that ran nothing since: the very runs the CLI lists, each on its loop's page.
        for name in ("slow", "midstep", "retry"):
            listed = {r["id"] for r in web.get("/api/runs", params={"loop": name}).json()["items"]}
            assert listed == cli_ids[name] == old_ids[name], name
            html = web.get(f"/loops/{name}")
            assert html.status_code == 200, html.text
            assert all(run_id in html.text for run_id in old_ids[name]), name


#: Asks 0.1.0's ``keys.Keys``, in its own interpreter, every key name it spells (NUL for each argument).
_OLD_SPELLINGS = """
import inspect, json
from loopsq.keys import Keys
keys, names = Keys(), []
for name, member in inspect.getmembers(Keys):
    if isinstance(member, property):
        names.append(getattr(keys, name))
    elif inspect.isfunction(member) and not name.startswith("_"):
        params = list(inspect.signature(member).parameters.values())[1:]
        required = [p for p in params if p.default is inspect.Parameter.empty]
        names += [member(keys, *["\\0"] * len(required)), member(keys, *["\\0"] * len(params))]
print(json.dumps(names))
"""


def old_key_names(cluster: Cluster, old: Path) -> re.Pattern[str]:
    """The key names 0.1.0 writes: those its keys module spells (an argument stands for any characters), and RQ's
    and rq-scheduler's (``rq:*``)."""
    done = subprocess.run([OWN_VENV or sys.executable, "-c", _OLD_SPELLINGS], env=old_env(cluster, old),
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=cluster.tmp)
    assert done.returncode == 0, done.stderr
    spelled = [re.escape(name).replace("\0", ".+") for name in json.loads(done.stdout)]
    return re.compile("|".join([*spelled, r"rq:.+"]))


def written_by_today(cluster: Cluster, live: list[str], rq_workers: set[str], old_names: re.Pattern[str]) -> list[str]:
    """What today's refused processes left in Redis: the stamp, the migrate lock, a liveness key or an RQ worker
    beside 0.1.0's (``live``, ``rq_workers``), any key 0.1.0 does not spell (the slot hashes, maintenance's index).
    """
    client = cluster.client
    found = [key for key in client.scan_iter(count=1000) if not old_names.fullmatch(key)]
    found += [key for key in (KEYS.meta, KEYS.migrate_lock) if client.exists(key)]
    liveness = sorted([*client.scan_iter("loopsq:worker:*"), *client.scan_iter("loopsq:scheduler:*")])
    if liveness != live:
        found.append(f"liveness keys {liveness} (0.1.0's: {live})")
    if client.smembers("rq:workers") != rq_workers:
        found.append(f"rq:workers {sorted(client.smembers('rq:workers'))} (0.1.0's: {sorted(rq_workers)})")
    return found


# Two minutes of wall time: defined only where .ci/upgrade_test.sh runs this file against the previous release
# installed with its own dependencies (LOOPSQ_UPGRADE_FROM_PYTHON), not a second time in the main suite.
if OWN_VENV:
    @pytest.mark.timeout(MIXED_FLEET_S + 360)
    def test_a_v1_fleet_beside_todays_restarted_processes_for_two_minutes_runs_every_slot_once_and_loses_no_run(
            cluster: Cluster, previous_release: Path) -> None:
        """Issue #28 point 3, 0.1.0 -> 0.2.0 being stop-the-world: today's scheduler and worker, started beside a live
        0.1.0 fleet and restarted each time they exit (a process manager's Restart=always), each exit 2 with their one
        line and write nothing; the 0.1.0 fleet runs on, each slot and each attempt once, no loop stalls, no run is
        lost; after the stop and the migration today's processes carry every loop on."""
        old = previous_release
        ledger = cluster.ledger_cmd()
        fast = [f"fast{i}" for i in range(10)]
        for name in fast:
            old_cli(cluster, old, "create", "command", name, "--cmd", ledger, "--every", "2s")
        # The retrying loop's ledger says each attempt: a slot's 3 attempts, 5 s apart, then the next slot.
        attempts = f'echo "$LOOPS_SCHEDULED_FOR $LOOPS_RUN_ID $LOOPS_ATTEMPT" >> {cluster.ledger_dir}/ledger-retry'
        old_cli(cluster, old, "create", "command", "retry", "--cmd", f"{attempts}; exit 1", "--every", "15s",
                "--attempts", "3", "--retry-delay", "5s")
        names = [*fast, "retry"]
        olds = [start_old(cluster, old, "scheduler", "old-scheduler")]
        olds += [start_old(cluster, old, "worker", f"old-worker{i}") for i in (1, 2)]
        cluster.wait_started(*olds)
        # (Before 0.1.0 has run a slot, no key tells its state from an unstamped v2 one: `state.layout.read`.)
        cluster.wait_until(lambda: all(cluster.ledger(n) for n in fast) and cluster.loop("retry").get(
            "retryScheduledFor"), 90, "every loop to run under 0.1.0 and retry's attempt 1 to fail")
        live = sorted([*cluster.client.scan_iter("loopsq:worker:*"), *cluster.client.scan_iter("loopsq:scheduler:*")])
        assert len(live) == 3, live
        rq_workers = cluster.client.smembers("rq:workers")
        old_names = old_key_names(cluster, old)
        assert written_by_today(cluster, live, rq_workers, old_names) == []  # (0.1.0 alone: the check sees nothing)
        shown = ", ".join(key.split(":", 1)[1] for key in live)
        lines = {"scheduler": f"error: 3 loopsq process(es) are live on this Redis ({shown}); stop every 0.1.0 "
                              "scheduler and worker before migrating from v1\n",
                 "worker": V1_REFUSED}

        # Two minutes of a mixed fleet: today's processes restarted RESTART_AFTER_S after each exit.
        seen: dict[str, set[str]] = {name: set() for name in names}
        starts: list[tuple[str, Proc]] = []
        current: dict[str, Proc | None] = {"scheduler": None, "worker": None}
        due = {"scheduler": 0.0, "worker": 0.0}
        left: list[str] = []
        begin = time.monotonic()
        sample_at = begin
        while (now := time.monotonic()) < begin + MIXED_FLEET_S:
            for role, proc in current.items():
                if proc is not None and not proc.alive():
                    left += [f"after {proc.name}: {what}" for what in written_by_today(cluster, live, rq_workers,
                                                                                       old_names)]
                    current[role], due[role] = None, now + RESTART_AFTER_S
                if current[role] is None and now >= due[role]:
                    current[role] = cluster.start(role, name=f"today-{role}{len(starts) + 1}", wait=False)
                    starts.append((role, current[role]))
            if now >= sample_at:
                for name in names:
                    seen[name] |= {run.id for run in cluster.runs(name)}
                assert all(proc.alive() for proc in olds), cluster.logs()
                sample_at = now + 5
            time.sleep(0.2)
        end = time.time()
        stalled = [name for name in names if (cluster.ledger_dir / f"ledger-{name}").stat().st_mtime < end - STALL_S]
        for name in names:
            seen[name] |= {run.id for run in cluster.runs(name)}
        for _role, proc in starts:
            with contextlib.suppress(subprocess.TimeoutExpired):  # (one that runs on fails below, with its log)
                proc.popen.wait(timeout=30)
        left += written_by_today(cluster, live, rq_workers, old_names)

        assert all(proc.alive() for proc in olds), cluster.logs()
        assert not [proc.name for proc in olds if "Traceback" in proc.text()], cluster.logs()
        assert stalled == [], cluster.logs()
        assert [role for role, _proc in starts].count("scheduler") >= 2 and len(starts) >= 4, starts
        for role, proc in starts:
            assert (proc.popen.returncode, proc.text()) == (2, lines[role]), proc.name
        assert left == []
        assert_each_slot_and_attempt_once(cluster, fast)
        # No history row lost: every run seen in Redis meanwhile is listed by 0.1.0's CLI.
        for name in names:
            listed = {r["id"] for r in json.loads(old_cli(cluster, old, "runs", name, "--limit", "1000", "--json"))}
            assert seen[name] <= listed, (name, seen[name] - listed)

        # The stop-the-world switch: 0.1.0 stopped, the state migrated, today's processes carry every loop on.
        stop_as_a_process_manager(olds)
        cluster.wait_until(lambda: not cluster.client.keys("loopsq:worker:*") and not cluster.client.keys(
            "loopsq:scheduler:*"), 30, "0.1.0's liveness keys to go")
        done = cluster.cli("migrate").stdout
        assert done.startswith("v1 -> v2: moved ") and done.endswith("stamped layout v2\n"), done
        for name in names:
            listed = {r["id"] for r in json.loads(cluster.cli("runs", name, "--limit", "1000", "--json").stdout)}
            assert seen[name] <= listed, (name, seen[name] - listed)
        before = {name: len(cluster.ledger(name)) for name in names}
        cluster.start_all(schedulers=1, workers=1)
        cluster.wait_until(lambda: all(len(cluster.ledger(name)) > before[name] for name in names), 60,
                           "every loop to run under 0.2.0")
        assert_each_slot_and_attempt_once(cluster, fast)
        assert cluster.client.keys("loopsq:slot:*") == []


def stop_as_a_process_manager(procs: list[Proc], timeout: float = 30.0) -> None:
    """SIGTERM each (schedulers first, as the list has them), then SIGKILL one still running ``timeout`` after (a
    platform's stop timeout: Heroku's 30 s); its runs are left to recovery."""
    for proc in procs:
        proc.sigterm()
    for proc in procs:
        try:
            proc.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill9()


def assert_each_slot_and_attempt_once(cluster: Cluster, fast: list[str]) -> None:
    """No slot of the fast loops ran twice; each attempt of the retrying loop's slots ran once, all under the
    slot's one run (a retry keeps its row)."""
    for name in fast:
        slots = [line[0] for line in cluster.ledger(name)]
        assert len(slots) == len(set(slots)), f"a slot of {name} ran twice: {sorted(slots)}"
    tried = [(slot, attempt) for slot, _run_id, attempt in cluster.ledger("retry")]
    assert len(tried) == len(set(tried)), f"an attempt of retry ran twice: {sorted(tried)}"
    runs_of = {slot: {run_id for s, run_id, _ in cluster.ledger("retry") if s == slot} for slot, _ in tried}
    assert all(len(ids) == 1 for ids in runs_of.values()), runs_of
    assert {attempt for _slot, attempt in tried} == {"1", "2", "3"}, tried


def test_bad_input_to_migrate_is_one_line_exit_2_and_changes_nothing(cluster: Cluster) -> None:
    empty = cluster.cli("migrate", check=False)
    assert (empty.returncode, empty.stdout, empty.stderr) == (
        2, "", "error: this Redis holds no loopsq state under 'loopsq:': nothing to migrate\n")
    cluster.client.set("sidekiq:queue", "x")
    other = cluster.cli("migrate", "--dry-run", check=False)
    assert (other.returncode, other.stderr) == (
        2, "error: this Redis holds no loopsq state under 'loopsq:' (it holds 1 other keys): nothing to migrate\n")
    assert cluster.client.keys("*") == ["sidekiq:queue"]
    cluster.client.hset(KEYS.meta, mapping={"layout": "4", "readableFrom": "3"})
    newer = cluster.cli("migrate", check=False)
    assert (newer.returncode, newer.stderr) == (
        2, "error: this Redis holds loopsq state v4; this loopsq reads v2: upgrade it\n")
    scheduler = cluster.start("scheduler", wait=False)
    assert scheduler.popen.wait(timeout=30) == 2
    assert scheduler.text() == "error: this Redis holds loopsq state v4; this loopsq reads v2: upgrade it\n"
    assert sorted(cluster.client.keys("*")) == [KEYS.meta, "sidekiq:queue"]
    assert cluster.client.hgetall(KEYS.meta) == {"layout": "4", "readableFrom": "3"}


def test_a_worker_that_finds_a_newer_layout_exits_2_and_leaves_its_running_run_to_recovery(cluster: Cluster) -> None:
    import httpx

    from tests.redis_server import free_port

    loop_id = cluster.create("slow", "sleep 60", "--at", at(1))
    scheduler, worker = cluster.start_all(schedulers=1, workers=1)
    assert cluster.client.hgetall(KEYS.meta) == META  # stamped by the first process on an empty Redis
    port = free_port()
    with (cluster.tmp / "web.log").open("wb") as out:
        popen = subprocess.Popen([sys.executable, "-m", "loopsq", "web", "--port", str(port), "--no-rq-dashboard"],
                                 env={**cluster.env, "LOOPSQ_API_TOKEN": "upgrade-test-token-0123456789"},
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cluster.tmp)
    web = Proc("web", popen, cluster.tmp / "web.log")
    cluster.procs.append(web)

    def health() -> dict[str, object] | None:
        try:
            return dict(httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=10).json())
        except httpx.TransportError:
            return None

    answered = cluster.wait_until(health, 30, "the web app to answer")
    assert (answered["version"], answered["layout"]) == (__version__, 2) == ("0.2.0", 2)
    (running,) = cluster.wait_until(lambda: [r for r in cluster.runs("slow") if r.status == "running" and r.pid],
                                    30, "slow to be running with its process recorded")
    before = cluster.client.get(KEYS.run(running.id))
    # A newer release migrated the state (simulated: its stamp): both processes stop at once, with one line.
    cluster.client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "3"})
    line = "error: this Redis holds loopsq state v3; this loopsq reads v2: upgrade it"
    for proc in (worker, scheduler, web):
        assert proc.popen.wait(timeout=30) == 2, proc.text()
        assert proc.text().rstrip().splitlines()[-1] == line
    assert cluster.client.get(KEYS.run(running.id)) == before  # nothing written into a layout it does not know
    # The release that reads the state (here: the stamp put back) recovers the run once, as a dead worker's.
    cluster.client.hset(KEYS.meta, mapping=META)
    cluster.start("scheduler")
    recovered = cluster.wait_until(lambda: (r := cluster.run(running.id)) and r.status != "running" and r, 60,
                                   "the run to be recovered")
    assert recovered.status == "abandoned"
    assert [r.id for r in cluster.runs("slow")] == [running.id]
    assert cluster.loop("slow")["id"] == loop_id


def test_up_migrates_an_older_state_before_its_children_start_and_refuses_a_newer_one(cluster: Cluster) -> None:
    from loopsq.ops.up import bring_layout_forward
    from loopsq.state.layout import StateLayoutError
    from tests.unit.test_state_layout import _v1_state

    class Said:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def say(self, line: str) -> None:
            self.lines.append(line)

    _v1_state(cluster.client)
    sup = Said()
    bring_layout_forward(sup, cluster.url)  # type: ignore[arg-type]
    assert sup.lines == ["v1 -> v2: moved 6 slot keys into 1 loops' slot hashes, compressed 5 settled JSON rows, "
                         "indexed 1 active loops for maintenance, stamped layout v2"]
    assert cluster.client.keys("loopsq:slot:*") == [] and cluster.client.hgetall(KEYS.meta) == META
    cluster.client.hset(KEYS.meta, mapping={"layout": "3", "readableFrom": "3"})
    with pytest.raises(StateLayoutError) as newer:
        bring_layout_forward(sup, cluster.url)  # type: ignore[arg-type]
    assert newer.value.message == "this Redis holds loopsq state v3; this loopsq reads v2: upgrade it"
