"""Chaos run: a real deployment (Redis with AOF, 2 schedulers, 3 workers, a mirror) under SIGKILLs, then the
invariants checked. Prints one summary line; exits 1 on any violation.

    .venv/bin/python bench/chaos.py                 # 3 minutes, a kill every ~20 s
    .venv/bin/python bench/chaos.py --duration 30   # a short mode
    .venv/bin/python bench/chaos.py --redis-faults  # and Redis itself SIGKILLed about every 30 s
    .venv/bin/python bench/chaos.py --keep-runs 3   # every loop with a history window of 3: trimming throughout
    .venv/bin/python bench/chaos.py --concurrency 4 --labels   # workers of 4 slots, one labelled gpu
    .venv/bin/python bench/chaos.py --sentinel --duration 90 --failover-every 20   # Sentinel failovers, short

Checks, after the faults stop:
  1. no (loop, slot, attempt[, step]) executed twice — from a ledger every command appends to;
  2. no active loop without a future timer (an armed or in-flight timer, or a run going);
  3. every run terminal or owned by a live lease (then, after pausing every loop, every run terminal);
  4. the SQLite mirror contains everything in Redis and equals it row for row on what Redis holds (the window);
     every row it has beyond that is archived (it left Redis on purpose), and every executed slot has its row.

With ``--redis-faults`` Redis runs on AOF with ``appendfsync always`` and is SIGKILLed too, about every 30 s
(``--redis-kill-every``; once in a run shorter than a minute), kept away 1-8 s and restarted from its AOF on the
same port. Also checked then:
  5. every execution in the ledger has its run (or workflow step) recorded with its exit code, unless its worker
     was one of the processes killed (then it is recorded abandoned) or it was replaced by a newer slot;
  6. no loopsq process exited (only the ones killed on purpose, each started again);
and check 2 waits for the grace after the last outage (recovery waits for live workers to beat again).

With ``--sentinel`` Redis is a master, a replica and three sentinels on loopback (``tests.redis_server.
SentinelGroup``, no AOF), every process given only the ``redis+sentinel://`` URL; ``SENTINEL FAILOVER`` runs every
``--failover-every`` seconds (default 30; the first half that in, each next one counted from the start of the
last, which waits until the group has settled), and the second failover is a SIGKILL of the master instead (started again as a replica once the
sentinels promoted the other). Not with ``--redis-faults``. Also
checked then (issue 27, point 2):
  8. no loop is stranded: every loop active throughout records a slot scheduled after the last failover settled
     (an execution, a run, a skip or a missed streak), within ``STRANDED_WAIT_S``; one recorded only within
     ``LATE_WAIT_S`` more is late (``late=``, a backlog on a loaded machine), not stranded; one whose slots were
     all recorded missed is ``starved=`` (the progress watchdog's repairs count, and are printed);
  9. every slot of every loop, from its first record to its last, has a record in the mirror: a run, a skip, or
     inside a ``missed`` streak; slots that fell due while the loop waited for (or ran) a retry of an earlier
     slot are passed over without a record today (a gap of invariant 7 with or without failovers), counted apart
     (``passed_over_for_retries=``) and not a violation here;
and the summary prints how many failovers were done (``failovers=``) and the watchdog's repairs (``repaired=``).
The figure for issue 27 (10 failovers, about 5 minutes) is, on a quiet machine:

    .venv/bin/python bench/chaos.py --sentinel --duration 300 --failover-every 30

``--concurrency N`` starts every worker with N slots (``loopsq worker --concurrency N``; without it, loopsq's
default); a worker picked for a kill is then killed once it holds 2 runs or more (it is waited for up to
``BUSY_WAIT_S``), and the summary says how many runs each killed worker held. ``--labels`` makes the fleet mixed:
``worker.3`` carries the label ``gpu`` (``LOOPSQ_WORKER_LABELS``) and about a fifth of the loops (command targets
of every kind: retrying, overlapping, plain) require it. Every target also appends the name and labels of the
worker executing it (``CHAOS_WORKER``/``CHAOS_LABELS`` in each worker's environment, which targets inherit) to a
second ledger; then also checked:
  7. every execution of a loop requiring ``gpu`` happened on a worker carrying ``gpu``, and there was one at least.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from loopsq.domain import run_rules as rules  # noqa: E402
from loopsq.domain import timeutil  # noqa: E402
from loopsq.domain.loop_spec import new_loop  # noqa: E402
from loopsq.domain.run_rules import LoopRun  # noqa: E402
from loopsq.domain.workflow_spec import workflow_body_from_json  # noqa: E402
from loopsq.engine import timers  # noqa: E402
from loopsq.mirror.apply import row_to_entity  # noqa: E402
from loopsq.mirror.follow import mirror_lag  # noqa: E402
from loopsq.mirror.schema import MIRRORED_COLUMNS, open_db  # noqa: E402
from loopsq.state.connection import client_for  # noqa: E402
from loopsq.state.keys import Keys  # noqa: E402
from loopsq.state.loops import LoopStore  # noqa: E402
from loopsq.state.runs import RunStore  # noqa: E402
from loopsq.state.snapshot import snapshot_tables  # noqa: E402
from loopsq.state.workflows import WorkflowStore  # noqa: E402
from tests.redis_server import RedisServer, SentinelGroup, SentinelProcess  # noqa: E402

KEYS = Keys()
#: With ``--labels``: the worker that carries it, and the label.
GPU_WORKER, GPU = "worker.3", "gpu"
#: How long a worker picked for a kill may be waited for to hold 2 runs or more (with ``--concurrency``).
BUSY_WAIT_S = 3.0
#: With ``--sentinel``: how long after the last failover settled every active loop has to execute a later slot
#: (the progress watchdog's grace, 30 s, plus the slowest loop's cadence and a margin).
STRANDED_WAIT_S = 60.0
#: How much longer a loop not recorded within ``STRANDED_WAIT_S`` is waited for before it counts as stranded (on a
#: loaded machine the queue's backlog alone can hold a fire that long; a stuck state never heals).
LATE_WAIT_S = 120.0
#: How long the mirror's end-of-run comparison is repeated until it holds (see ``main``).
MIRROR_SETTLE_S = 30.0


class Fleet:
    """The processes of the deployment, restartable by name."""

    def __init__(self, url: str, data: Path, logs: Path, concurrency: int | None = None,
                 labels: dict[str, str] | None = None) -> None:
        self.url, self.data, self.logs = url, data, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, "LOOPSQ_REDIS_URL": url, "LOOPSQ_DATA_DIR": str(data), "PYTHONUNBUFFERED": "1"}
        self.concurrency = concurrency
        #: Worker name -> its declared labels (comma-separated), for ``--labels``.
        self.labels = labels or {}

    def start(self, name: str) -> None:
        role = name.split(".")[0]
        args, env = [sys.executable, "-m", "loopsq", role], dict(self.env)
        if role == "worker":
            if self.concurrency is not None:
                args += ["--concurrency", str(self.concurrency)]
            env["LOOPSQ_WORKER_LABELS"] = self.labels.get(name, "")
            # Not LOOPSQ_*: targets inherit these (loopsq keeps its own variables from them), and write them down.
            env["CHAOS_WORKER"], env["CHAOS_LABELS"] = name, self.labels.get(name) or "-"
        proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=ROOT, start_new_session=True)
        self.procs[name] = proc
        # Each line of its log stamped with the time it was read (loopsq's own lines carry none).
        threading.Thread(target=_stamp, args=(proc, self.logs / f"{name}.log"), daemon=True).start()

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is None:  # (one that exited by itself is reported, not killed)
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _stamp(proc: subprocess.Popen[bytes], path: Path) -> None:
    """Copy the process's output into ``path``, each line prefixed with the wall-clock time (UTC) it came."""
    assert proc.stdout is not None
    with open(path, "ab") as log:
        for line in proc.stdout:
            stamp = time.strftime("%H:%M:%S", time.gmtime()) + f".{int(time.time() * 1000) % 1000:03d} "
            log.write(stamp.encode() + line)
            log.flush()


def ledger_cmd(ledger: Path, fail_every: int = 0, sleep: float = 0.0) -> str:
    # Where it ran first (a kill between the two lines leaves a "where" without an execution, never the reverse).
    where = f'echo "$LOOPS_LOOP_ID $LOOPS_SCHEDULED_FOR $LOOPS_ATTEMPT $CHAOS_WORKER $CHAOS_LABELS" >> {ledger}.where'
    line = f'echo "$LOOPS_LOOP_ID $LOOPS_SCHEDULED_FOR $LOOPS_ATTEMPT $LOOPS_WORKFLOW_STEP_ID" >> {ledger}'
    cmd = f"{where}; {line}"
    if sleep:
        cmd += f"; sleep {sleep}"
    if fail_every:
        # Fail deterministically on some slots (by the slot's seconds), so retries happen.
        cmd += f'; s=$(echo "$LOOPS_SCHEDULED_FOR" | cut -c18-19); [ $((10#$s % {fail_every})) -ne 0 ]'
    return cmd


def create_loops(client: redis.Redis, ledger: Path, count: int, rng: random.Random,
                 keep_runs: int | None = None, labels: bool = False) -> set[str]:
    """Create the workflows and ``count`` loops; returns the ids of the loops that require ``GPU`` (``labels``:
    the command loops whose index is 1 mod 4, of every kind but the workflow one)."""
    gpu: set[str] = set()
    loops, workflows = LoopStore(client, KEYS), WorkflowStore(client, KEYS)
    now = timeutil.now()
    specs = []
    for i in range(3):
        body = {"name": f"chaos-wf-{i}", "maxParallel": 1 + i % 2, "steps": [
            {"id": "a", "target": {"type": "command", "command": ledger_cmd(ledger), "shell": True}},
            {"id": "b", "dependsOn": ["a"], "target": {"type": "command", "command": ledger_cmd(ledger), "shell": True}},
            {"id": "c", "dependsOn": ["a"], "continueOnFailure": True,
             "target": {"type": "command", "command": ledger_cmd(ledger, fail_every=3), "shell": True}},
        ]}
        specs.append(workflows.create(workflow_body_from_json(body), now))
    for i in range(count):
        every = rng.choice([1000, 2000, 3000, 4000, 5000])
        kind = i % 10
        body: dict[str, object] = {"name": f"chaos-{i:03d}", "timezone": "UTC",
                                   "schedule": {"type": "interval", "everyMs": every}, "leaseMs": 60_000}
        if keep_runs is not None:
            body["keepRuns"] = keep_runs
        if kind < 2:  # small workflows
            body["target"] = {"type": "workflow", "workflowId": specs[i % 3]["id"]}
            body["maxAttempts"] = 2
        elif kind < 4:  # failing, retrying
            body["target"] = {"type": "command", "command": ledger_cmd(ledger, fail_every=2), "shell": True}
            body.update(maxAttempts=3, retryDelayMs=300)
        elif kind < 6:  # overlapping
            body["target"] = {"type": "command", "command": ledger_cmd(ledger, sleep=every / 1000 * 1.5),
                              "shell": True}
            body["overlap"] = rng.choice(["skip", "allow", "replace"])
            body["maxAttempts"] = 2
        else:
            body["target"] = {"type": "command", "command": ledger_cmd(ledger), "shell": True}
            body["maxAttempts"] = rng.choice([1, 2])
        # No circuit breaker: the failing loops would be paused after 5 failures, and their retries across the
        # faults are what this bench is for.
        body["pauseAfterFailures"] = 0
        loop = new_loop(body, now + timedelta(milliseconds=rng.randint(0, 2000)))
        if labels and kind >= 2 and i % 4 == 1:  # (new_loop keeps no requires yet: into the stored loop directly)
            loop = dataclasses.replace(loop, extra={**loop.extra, "requires": [GPU]})
            gpu.add(loop.id)
        loops.create(loop)
    return gpu


def wait_until(predicate, timeout: float, step: float = 0.25) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def check_ledger(ledger: Path) -> tuple[int, list[str]]:
    counts = Counter(line.strip() for line in ledger.read_text().splitlines() if line.strip())
    dupes = [f"executed {n} times: {key}" for key, n in counts.items() if n > 1]
    return sum(counts.values()), dupes


def check_timers(client: redis.Redis) -> list[str]:
    raw = timers.raw_from(client)
    loops = [loop for loop in LoopStore(client, KEYS).all() if loop.status == "active"]
    states = timers.armed_state(raw, KEYS, [loop.id for loop in loops])
    running = {r.loop_id for r in RunStore(client, KEYS).get_many(RunStore(client, KEYS).running_ids())}
    bad = []
    for loop in loops:
        score, status = states[loop.id]
        if rules.timer_at(loop) is None and loop.id in running:
            continue
        if score is None and status not in ("queued", "started"):
            bad.append(f"active loop {loop.name} has no timer (status={status})")
    return bad


def check_leases(client: redis.Redis) -> list[str]:
    """Every run recorded running has its lease and a live worker. The loops still fire while this reads (the
    index, then the runs, then their keys, in separate round trips): a run that ended between two reads is not
    one without an owner, so a run is judged only as read running, and a suspect is read again."""
    store = RunStore(client, KEYS)

    def owned(run: LoopRun) -> bool:
        return bool(client.exists(KEYS.lease(run.id)) and client.exists(KEYS.worker(run.worker_id or "-")))

    bad = []
    for run in store.get_many(store.running_ids()):
        if run.status != "running" or owned(run):
            continue
        again = store.get(run.id)
        if again is not None and again.status == "running" and not owned(again):
            bad.append(f"running run {run.id} of {run.loop_name} has no live owner")
    return bad


def check_mirror(client: redis.Redis, db: Path, ledger: Path) -> tuple[list[str], int]:
    """The mirror contains every row Redis has and equals it on those; definitions match exactly; every row
    beyond Redis's is an archived run (or a step or event of one); every executed slot has its loop run row.
    Returns the violations and how many archived runs the mirror holds."""
    conn = open_db(db)
    expected = snapshot_tables(client, KEYS)
    bad = []
    archived = {str(r[0]) for t in ("loop_runs", "workflow_runs")
                for r in conn.execute(f"SELECT id FROM {t} WHERE archived_at IS NOT NULL")}
    for table in MIRRORED_COLUMNS:
        rows = {r["id"]: row_to_entity(table, r) for r in conn.execute(f"SELECT * FROM {table}")}
        want = {e["id"]: row_to_entity(table, _roundtrip(conn, table, e)) for e in expected.get(table, [])}
        if not set(want) <= set(rows):
            bad.append(f"{table}: mirror lacks {len(set(want) - set(rows))} of Redis's {len(want)} rows")
            continue
        extra = set(rows) - set(want)
        owner = {"workflow_step_runs": "workflowRunId", "workflow_events": "workflowRunId"}.get(table)
        unarchived = [i for i in extra if (rows[i].get(owner) if owner else i) not in archived]
        if unarchived:
            bad.append(f"{table}: {len(unarchived)} row(s) not in Redis and not archived, e.g. {unarchived[0]}")
        differing = [i for i in want if rows[i] != want[i]]
        if differing:
            first = differing[0]
            fields = {k: (rows[first].get(k), want[first].get(k)) for k in want[first]
                      if rows[first].get(k) != want[first].get(k)}
            shown = ", ".join(f"{k}: mirror {str(a)[:60]!r} redis {str(b)[:60]!r}" for k, (a, b) in fields.items())
            bad.append(f"{table}: {len(differing)} row(s) differ, e.g. {first} ({shown})")
    slots = {(str(r[0]), str(r[1])) for r in conn.execute("SELECT loop_id, scheduled_for FROM loop_runs")}
    executed = {tuple(line.split()[:2]) for line in ledger.read_text().splitlines() if line.strip()}
    lost = sorted(executed - slots)
    if lost:
        bad.append(f"{len(lost)} executed slot(s) have no loop run in the mirror, e.g. {lost[0]}")
    conn.close()
    return bad, len(archived)


def _roundtrip(conn: sqlite3.Connection, table: str, entity: dict) -> dict:  # type: ignore[type-arg]
    """An entity as the mirror stores it (through a scratch in-memory table with the same schema)."""
    from loopsq.mirror.apply import entity_to_params

    params = entity_to_params(table, entity)
    return {k: params.get(k) for k in MIRRORED_COLUMNS[table]}


def check_recorded(client: redis.Redis, ledger: Path, killed_pids: set[int], db: Path) -> list[str]:
    """Every execution in the ledger has its attempt recorded terminal with its exit code; abandoned only when its
    worker was killed on purpose; no exit code only when it was replaced by a newer slot (its group killed)."""
    from loopsq.state.workflow_runs import WorkflowRunStore

    def died(worker_id: str | None) -> bool:
        parts = (worker_id or "").split(":")  # worker:<host>:<pid>:<random>
        return len(parts) >= 3 and parts[-2].isdigit() and int(parts[-2]) in killed_pids

    def attempt_of(run: LoopRun, attempt: int) -> dict[str, object] | None:
        if run.attempt == attempt:
            return {"status": run.status, "exitCode": run.exit_code, "error": run.error, "workerId": run.worker_id}
        return next((a for a in run.previous_attempts or [] if a.get("attempt") == attempt), None)

    def acceptable(end: dict[str, object] | None, worker_id: object) -> bool:
        if end is None or end.get("status") not in rules.TERMINAL:
            return False
        if end.get("status") == "abandoned":
            return died(str(end.get("workerId") or worker_id or ""))
        if end.get("exitCode") is not None:
            return True
        return str(end.get("error") or "").startswith(rules.REPLACED_ERROR)

    store, wf_store = RunStore(client, KEYS), WorkflowRunStore(client, KEYS)
    conn = open_db(db)
    bad = []
    for line in sorted({line.strip() for line in ledger.read_text().splitlines() if line.strip()}):
        parts = line.split()
        loop_id, slot, attempt, step = parts[0], parts[1], int(parts[2]), (parts[3] if len(parts) > 3 else None)
        run_id = client.hget(KEYS.slots(loop_id), slot)
        run = store.get(str(run_id)) if run_id else None
        archived = run is None and (run := archived_run(conn, loop_id, slot)) is not None
        if run is None:
            bad.append(f"executed but no run recorded: {line}")
            continue
        end = attempt_of(run, attempt)
        if step is None:
            if not acceptable(end, run.worker_id):
                bad.append(f"executed but not recorded with its exit code: {line} -> {end}")
            continue
        if end is not None and end.get("status") == "abandoned" and died(str(end.get("workerId") or "")):
            continue  # its worker was killed: the workflow run failed with its loop run
        spec_id = json.loads(client.get(KEYS.loop(loop_id)) or "{}").get("target", {}).get("workflowId")
        wf_run_id = wf_store.by_idempotency(str(spec_id), f"{loop_id}:{slot}:attempt:{attempt}")
        state = wf_store.load(wf_run_id) if wf_run_id else None
        step_run = state.steps.get(step) if state else None
        if step_run is None and (archived or state is None):  # its workflow run left Redis with its window
            step_run = archived_step(conn, f"{loop_id}:{slot}:attempt:{attempt}", step)
        if step_run is None or step_run.get("status") in ("pending", "running") or (
                step_run.get("exitCode") is None and step_run.get("status") != "cancelled"):
            bad.append(f"step executed but not recorded with its exit code: {line} -> {step_run}")
    conn.close()
    return bad


def archived_run(conn: sqlite3.Connection, loop_id: str, slot: str) -> LoopRun | None:
    """The mirror's row of a slot whose run was trimmed from Redis (``--keep-runs``), as a ``LoopRun``."""
    from loopsq.mirror import queries

    row = conn.execute("SELECT id FROM loop_runs WHERE loop_id = ? AND scheduled_for = ?", (loop_id, slot)).fetchone()
    entity = queries.get_run(conn, str(row[0])) if row else None
    return LoopRun.from_dict(dict(entity)) if entity else None


def archived_step(conn: sqlite3.Connection, idempotency_key: str, step: str) -> dict[str, object] | None:
    """The mirror's row of a step whose workflow run was trimmed from Redis: its status and exit code."""
    row = conn.execute(
        "SELECT s.status, s.exit_code FROM workflow_step_runs s JOIN workflow_runs w ON s.workflow_run_id = w.id "
        "WHERE w.idempotency_key = ? AND s.step_id = ?", (idempotency_key, step)).fetchone()
    return {"status": row[0], "exitCode": row[1]} if row else None


@dataclasses.dataclass
class Progress:
    """What became of the active loops after the last failover (``check_stranded``)."""

    #: Loops with nothing recorded for a slot after it within ``STRANDED_WAIT_S + LATE_WAIT_S``: violations.
    stranded: list[str]
    #: Loops whose first record after it came after ``STRANDED_WAIT_S`` (lateness: a backlog, not a stuck
    #: state), and the latest such record's delay in seconds.
    late: int = 0
    late_max_s: float = 0.0
    late_names: list[str] = dataclasses.field(default_factory=list)
    #: Loops whose slots after it were all recorded missed (a loaded machine: no free worker), none executed.
    starved: int = 0


def check_stranded(client: redis.Redis, ledger: Path, since: float, timeout: float, late: float) -> Progress:
    """Every loop active throughout records a slot scheduled after ``since`` (epoch seconds): an execution (its
    ledger line) or a record (a run, a skip, a missed streak reaching past ``since``). One with none within
    ``timeout`` is waited for ``late`` seconds more: recorded then, it was late (a backlog heals); still nothing,
    it is stranded, named with what holds it. A loop that left ``active`` meanwhile (its circuit breaker, say)
    is not waited for."""
    runs = RunStore(client, KEYS)
    loops = {loop.id: loop for loop in LoopStore(client, KEYS).all() if loop.status == "active"}
    began = time.time()
    executed: set[str] = set()
    recorded: dict[str, float] = {}  # loop id -> when its first record after ``since`` was seen

    def newest_record_ms(loop_id: str) -> int:
        ids = client.zrange(KEYS.loop_runs(loop_id), -3, -1)
        ends = [timeutil.from_iso(r.missed_last or r.scheduled_for) for r in runs.get_many(ids)]
        return int(max(ends).timestamp() * 1000) if ends else 0

    def waiting() -> set[str]:
        for line in ledger.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 2 and parts[0] in loops and timeutil.from_iso(parts[1]).timestamp() > since:
                executed.add(parts[0])
                recorded.setdefault(parts[0], time.time())
        for loop_id in set(loops) - set(recorded):
            if newest_record_ms(loop_id) > since * 1000:
                recorded[loop_id] = time.time()
        active = {loop.id for loop in LoopStore(client, KEYS).get_many(list(loops)) if loop.status == "active"}
        return active - set(recorded)

    wait_until(lambda: not waiting(), timeout + late, step=1.0)
    left = sorted(waiting())
    delays = [at - began for at in recorded.values() if at - began > timeout]
    late_names = sorted(loops[i].name for i, at in recorded.items() if at - began > timeout)
    return Progress(
        [f"loop {loops[i].name} stranded: nothing recorded for a slot after the last failover within "
         f"{timeout + late:.0f}s ({_holds(client, loops[i].id)})" for i in left],
        late=len(delays), late_max_s=max(delays, default=0.0), starved=len(set(recorded) - executed),
        late_names=late_names)


def _holds(client: redis.Redis, loop_id: str) -> str:
    """What a stranded loop's timer, runs and maintenance watch look like, for the report."""
    job_id = client.get(KEYS.timer(loop_id)) or ""
    job = client.hmget(timers.job_key(job_id), ["status", "origin", "enqueued_at"]) if job_id else [None] * 3
    queued = timers.queued_in_place(timers.raw_from(client), job_id) if job_id else None
    active = sorted(client.smembers(KEYS.loop_active(loop_id)))
    loop = json.loads(client.get(KEYS.loop(loop_id)) or "{}")
    watch = client.zscore(KEYS.loop_watch, loop_id)
    watch_at = timeutil.to_iso(timeutil.from_ms(int(watch))) if watch is not None else "-"
    return (f"timer={job_id or '-'} status={job[0]} origin={job[1]} enqueued_at={job[2]} in_place={queued} "
            f"active_runs={active} nextRunAt={loop.get('nextRunAt')} retryAt={loop.get('retryAt')} "
            f"watch={watch_at}")


def snapshot_stranded(client: redis.Redis, group: SentinelGroup | None, fleet: Fleet, work: Path) -> None:
    """When loops are found stranded: who leads (the scheduler lock), every scheduler's thread stacks (SIGUSR2,
    into its log), and a copy of the master's data as it is now (``work/at-stranded/dump.rdb``)."""
    import shutil

    print(f"  scheduler lock held by {client.get(KEYS.scheduler_lock)!r} "
          f"(ttl {client.pttl(KEYS.scheduler_lock)} ms); scheduler pids "
          f"{ {n: p.pid for n, p in fleet.procs.items() if n.startswith('scheduler')} }")
    for name, proc in fleet.procs.items():
        if name.startswith("scheduler") and proc.poll() is None:
            os.kill(proc.pid, signal.SIGUSR2)
    if group is None:
        return
    master = group.server(group.master_port())
    try:
        master.direct(socket_timeout=10).save()
        (work / "at-stranded").mkdir(exist_ok=True)
        shutil.copy(master.dir / "dump.rdb", work / "at-stranded" / "dump.rdb")
        print(f"  the master's data when they were found: {work}/at-stranded/dump.rdb")
    except (redis.RedisError, OSError) as exc:
        print(f"  no snapshot of the master: {exc}")


def check_slots(db: Path, client: redis.Redis) -> tuple[list[str], int, int]:
    """Every slot of every loop (fixed-rate intervals), from its first record to its last, has one in the mirror:
    a run (any attempt), a skip, or a place in a ``missed`` streak; one that fell due while the loop waited for
    or ran a retry of an earlier slot is counted apart (see check 9). Returns the violations, the slots recorded
    missed and the slots passed over for retries."""
    every = {loop.id: loop.schedule.every_ms for loop in LoopStore(client, KEYS).all()}
    conn = open_db(db)
    spans: dict[str, list[tuple[int, int]]] = {}
    retries: dict[str, list[tuple[int, int]]] = {}  # (slot, until: its last attempt's end) of retried slots
    missed = 0

    def ms(text: object) -> int:
        return int(timeutil.from_iso(str(text)).timestamp() * 1000)

    for loop_id, slot, status, last, count, attempt, finished in conn.execute(
            "SELECT loop_id, scheduled_for, status, missed_last, missed_count, attempt, finished_at FROM loop_runs"):
        first = ms(slot)
        end = ms(last) if status == "missed" and last else first
        missed += int(count or 1) if status == "missed" else 0
        spans.setdefault(str(loop_id), []).append((first, end))
        if int(attempt or 1) >= 2:
            retries.setdefault(str(loop_id), []).append((first, ms(finished) if finished else 1 << 62))
    conn.close()
    bad = []
    passed_over = 0
    for loop_id, found in spans.items():
        step = every.get(loop_id)
        if not step:
            continue
        start, stop = min(a for a, _ in found), max(b for _, b in found)
        covered: set[int] = set()
        for a, b in found:
            covered.update(range(a, b + 1, step))
        holes = [ms for ms in range(start, stop + 1, step) if ms not in covered]
        waited = [h for h in holes if any(slot < h <= until for slot, until in retries.get(loop_id, []))]
        passed_over += len(waited)
        holes = [h for h in holes if h not in waited]
        if holes:
            first_hole = timeutil.to_iso(timeutil.from_ms(holes[0]))
            bad.append(f"loop {loop_id}: {len(holes)} slot(s) with no record, the first {first_hole}")
    return bad, missed, passed_over


def check_placement(ledger: Path, gpu_loops: set[str]) -> tuple[list[str], Counter[str]]:
    """Every execution of a loop requiring ``GPU`` ran on a worker carrying it (from the "where" ledger), and one
    ran at least. Returns the violations and the executions per (worker, gpu loop or not)."""
    bad, seen = [], Counter()
    where = Path(f"{ledger}.where")
    for line in where.read_text().splitlines() if where.exists() else []:
        parts = line.split()
        if len(parts) < 5:
            continue
        needs = parts[0] in gpu_loops
        seen[f"{parts[3]}:{'gpu' if needs else 'any'}"] += 1
        if needs and GPU not in parts[4].split(","):
            bad.append(f"a loop requiring {GPU} ran on {parts[3]} (labels {parts[4]}): {line}")
    if gpu_loops and not any(k.endswith(":gpu") for k in seen):
        bad.append(f"no execution of the {len(gpu_loops)} loop(s) requiring {GPU}")
    return bad, seen


def runs_held(client: redis.Redis, pid: int) -> int | None:
    """How many runs the live worker of process ``pid`` holds (its liveness record's ``busy``); None: not live."""
    for wid in client.smembers(KEYS.workers):
        wid = wid.decode() if isinstance(wid, bytes) else str(wid)
        if wid.rsplit(":", 2)[-2] == str(pid):
            raw = client.get(KEYS.worker(wid))
            if raw:
                return int(json.loads(raw).get("busy") or 0)
    return None


def kill_when_busy(fleet: Fleet, client: redis.Redis, victim: str) -> int | None:
    """Wait up to ``BUSY_WAIT_S`` for worker ``victim`` to hold 2 runs or more (with slots); the runs it held when
    it is killed (None: unknown)."""
    pid = fleet.procs[victim].pid
    deadline = time.monotonic() + (BUSY_WAIT_S if (fleet.concurrency or 0) > 1 else 0.0)
    held = None
    while True:
        try:
            held = runs_held(client, pid)
        except redis.RedisError:
            held = None
        if (held or 0) >= 2 or time.monotonic() >= deadline:
            return held
        time.sleep(0.05)


def check_alive(fleet: Fleet) -> list[str]:
    """Every process of the fleet is running (the ones killed on purpose were started again)."""
    return [f"{name} exited with {proc.returncode}" for name, proc in fleet.procs.items() if proc.poll() is not None]


def keep_redis(work: Path, servers: list[RedisServer], sentinels: list[SentinelProcess]) -> None:
    """After a violation or an error: each server's data (``SAVE``d as the fleet stopped) and log, and each
    sentinel's log, copied into ``work/redis-<port>/`` (their own directories go with the cleanup). Start a
    ``redis-server --dir <that dir>`` there to read the state a violation left."""
    import shutil

    for proc in [*servers, *sentinels]:
        dest = work / f"redis-{proc.port}"
        if isinstance(proc, RedisServer) and proc.proc is not None:
            try:
                proc.direct(socket_timeout=10).save()
            except redis.RedisError as exc:
                print(f"  redis on port {proc.port}: SAVE failed: {exc}")
        shutil.copytree(proc.dir, dest, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("appendonlydir", "*.aof", "temp-*"))
    print(f"  Redis data and logs kept in {work}/redis-<port>")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=180.0, help="seconds of faults (default 180)")
    parser.add_argument("--kill-every", type=float, default=None, help="seconds between kills (default ~20, "
                        "or duration/4 for short runs)")
    parser.add_argument("--loops", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--redis-faults", action="store_true",
                        help="also SIGKILL Redis (AOF, appendfsync always) and restart it from its AOF")
    parser.add_argument("--redis-kill-every", type=float, default=None,
                        help="seconds between Redis kills (default ~30; runs under 60 s: one, early enough for "
                             "its recovery grace to be over soon after the faults stop)")
    parser.add_argument("--keep-runs", type=int, default=None, help="every loop's history window (trims throughout)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="slots of every worker (loopsq worker --concurrency N; default: loopsq's)")
    parser.add_argument("--labels", action="store_true",
                        help=f"a mixed fleet: {GPU_WORKER} labelled {GPU}, a share of the loops requiring it")
    parser.add_argument("--sentinel", action="store_true",
                        help="Redis as a master, a replica and three sentinels, with SENTINEL FAILOVER every "
                             "--failover-every seconds and one SIGKILL of the master")
    parser.add_argument("--failover-every", type=float, default=30.0,
                        help="with --sentinel: seconds between failovers (default 30)")
    args = parser.parse_args()
    if args.sentinel and args.redis_faults:
        parser.error("--sentinel and --redis-faults do not go together")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    kill_every = args.kill_every or min(20.0, max(5.0, args.duration / 4))
    redis_kill_every = args.redis_kill_every or (30.0 if args.duration >= 60 else None)
    work = Path(tempfile.mkdtemp(prefix="loopsq-chaos-"))
    group = SentinelGroup().start() if args.sentinel else None
    server = None if group else RedisServer(appendonly=True,
                                            appendfsync="always" if args.redis_faults else "everysec").start()
    url = group.url if group else server.url  # type: ignore[union-attr]
    fleet = Fleet(url, work / "data", work, args.concurrency, {GPU_WORKER: GPU} if args.labels else None)
    client = client_for(url)
    ledger = work / "ledger"
    ledger.touch()
    violations: list[str] = []
    kills: list[tuple[str, float]] = []
    held: list[str] = []  # runs each killed worker held
    killed_pids: set[int] = set()
    outages: list[tuple[float, float]] = []  # (killed at, back at), epoch seconds
    exited: list[str] = []
    failovers: list[str] = []  # "failover" or "kill", one per failover done
    settled_at = 0.0  # when the last failover had settled (epoch seconds)
    ok = False  # (an exception keeps the Redis data and logs too)
    try:
        gpu_loops = create_loops(client, ledger, args.loops, rng, args.keep_runs, args.labels)
        names = ["scheduler.1", "scheduler.2", "worker.1", "worker.2", "worker.3", "mirror.1"]
        for name in names:
            fleet.start(name)
        started, started_wall = time.monotonic(), time.time()
        next_kill = started + kill_every * rng.uniform(0.7, 1.3)
        first_outage = redis_kill_every * rng.uniform(0.7, 1.3) if redis_kill_every else \
            args.duration * rng.uniform(0.2, 0.4)
        next_outage = started + first_outage if args.redis_faults else float("inf")
        # The first half a period in: ``--duration 300 --failover-every 30`` makes 10 (at 15, 45, ... 285 s).
        next_failover = started + args.failover_every / 2 if group else float("inf")
        while time.monotonic() - started < args.duration:
            exited += [f"{n} exited with {p.returncode}" for n, p in fleet.procs.items()
                       if p.poll() is not None and f"{n} exited with {p.returncode}" not in exited]
            if time.monotonic() >= next_outage:
                assert server is not None
                down_at = time.time()
                server.stop(signal.SIGKILL)
                time.sleep(rng.uniform(1.0, 8.0))
                server.start()
                outages.append((down_at, time.time()))
                next_outage = time.monotonic() + redis_kill_every * rng.uniform(0.7, 1.3) if redis_kill_every \
                    else float("inf")
            if time.monotonic() >= next_failover and group is not None:
                # The middle one of the planned failovers is a SIGKILL of the master.
                began = time.monotonic()
                try:
                    if len(failovers) == 1:
                        failovers.append("kill")
                        group.kill_master()
                    else:
                        failovers.append("failover")
                        group.failover(settled=True)
                except RuntimeError as exc:  # a loaded machine: the former master's resync took longer
                    print(f"  note: failover {len(failovers)}: {exc}; waiting longer for the group to settle")
                    group.wait_settled(timeout=180)
                settled_at = time.time()
                next_failover = began + args.failover_every
            if time.monotonic() >= next_kill:
                victim = rng.choice(names[:5])
                if victim.startswith("worker"):
                    n_held = kill_when_busy(fleet, client, victim)
                    held.append("?" if n_held is None else str(n_held))
                killed_pids.add(fleet.procs[victim].pid)
                fleet.kill(victim)
                kills.append((victim, time.time()))
                time.sleep(rng.uniform(0.5, 2.0))
                fleet.start(victim)
                next_kill = time.monotonic() + kill_every * rng.uniform(0.7, 1.3)
            time.sleep(0.2)
        # Faults stop. Let maintenance settle (liveness TTL 5 s + a pass), then check timers and owners; after an
        # outage recovery first waits its grace (OUTAGE_GRACE_MS) for live workers to beat again.
        from loopsq.engine.runtime import OUTAGE_GRACE_MS

        settle_until = max([time.time() + 8] + [back + OUTAGE_GRACE_MS / 1000 + 3 for _, back in outages])
        time.sleep(max(0.0, settle_until - time.time()))
        if args.redis_faults:
            violations += exited + check_alive(fleet)
        violations += check_timers(client)
        violations += check_leases(client)
        progress = Progress([])
        if group is not None:
            progress = check_stranded(client, ledger, max(settled_at, started_wall), STRANDED_WAIT_S, LATE_WAIT_S)
            if progress.stranded:
                snapshot_stranded(client, group, fleet, work)
            violations += progress.stranded
        # Quiesce: pause every loop, wait for every run to end and the mirror to catch up.
        store = LoopStore(client, KEYS)
        for loop in store.all():
            if loop.status == "active":
                store.pause(loop.id, timeutil.now())
        runs = RunStore(client, KEYS)
        if not wait_until(lambda: not runs.running_ids(), 60):
            violations.append(f"{len(runs.running_ids())} run(s) still running 60 s after pausing every loop")
        db = work / "data" / "loops.db"
        conn = open_db(db)
        if not wait_until(lambda: mirror_lag(client, KEYS, conn) == 0, 30):
            violations.append(f"mirror still {mirror_lag(client, KEYS, conn)} change(s) behind after 30 s")
        # The fleet still runs (a fire job of a paused loop, maintenance): a row written between the two reads of
        # one comparison differs for a moment. Compared again until equal, for MIRROR_SETTLE_S at most: a
        # difference that lasts is a violation, one that heals is lateness (counted in the summary).
        compared_at, comparisons = time.monotonic(), 0
        while True:
            mirror_bad, archived = check_mirror(client, db, ledger)
            comparisons += 1
            if not mirror_bad or time.monotonic() - compared_at > MIRROR_SETTLE_S:
                break
            time.sleep(1.0)
            wait_until(lambda: mirror_lag(client, KEYS, conn) == 0, 10)
        mirror_note = f" mirror_comparisons={comparisons} ({time.monotonic() - compared_at:.0f}s)"
        conn.close()
        violations += mirror_bad
        executed, dupes = check_ledger(ledger)
        violations += dupes
        if args.redis_faults:
            violations += check_recorded(client, ledger, killed_pids, db)
        sentinel_note = ""
        if group is not None:
            holes, missed_slots, passed_over = check_slots(db, client)
            violations += holes
            repaired = ",".join(f"{k}={v}" for k, v in sorted(client.hgetall(KEYS.repaired_counts).items()))
            sentinel_note = (f" failovers={len(failovers)} (master_kills={failovers.count('kill')}) "
                             f"duplicates={len(dupes)} stranded={len(progress.stranded)} late={progress.late} "
                            f"(max {progress.late_max_s:.0f}s) starved={progress.starved} "
                            f"slots_without_record={len(holes)} "
                             f"missed_slots={missed_slots} passed_over_for_retries={passed_over} repaired=[{repaired}]")
        placement = ""
        if args.labels:
            bad, where = check_placement(ledger, gpu_loops)
            violations += bad
            placement = (f" gpu_loops={len(gpu_loops)} executions_by_worker="
                         f"{','.join(f'{k}={v}' for k, v in sorted(where.items()))}")
        all_runs = runs.get_many([i.decode() if isinstance(i, bytes) else i for i in client.zrange(KEYS.runs, 0, -1)])
        by_status = Counter(r.status for r in all_runs)
        recoveries = []
        for run in all_runs:
            if run.status == "abandoned" and run.finished_at and run.worker_id:
                died = [t for name, t in kills if name.startswith("worker")]
                fin = timeutil.from_iso(run.finished_at).timestamp()
                before = [t for t in died if t <= fin]
                if before:
                    recoveries.append(fin - max(before))
        wf_runs = client.zcard(KEYS.wf_runs)
        statuses = " ".join(f"{k}={v}" for k, v in sorted(by_status.items()))
        rec = f" recovery_max={max(recoveries):.1f}s recovery_median={sorted(recoveries)[len(recoveries) // 2]:.1f}s" \
            if recoveries else ""
        faults = f" redis_outages={len(outages)} ({sum(b - a for a, b in outages):.0f}s down)" \
            if args.redis_faults else ""
        fleet_note = f" concurrency={args.concurrency}" if args.concurrency else ""
        fleet_note += f" runs_held_by_killed_workers=[{','.join(held)}]" if held else ""
        print(f"chaos: seed={seed} duration={args.duration:.0f}s loops={args.loops} kills={len(kills)}{faults} "
              f"runs={len(all_runs)} ({statuses}) workflow_runs={wf_runs} archived={archived} executions={executed}{rec}"
              f"{fleet_note}{placement}{sentinel_note}{mirror_note} violations={len(violations)}")
        if progress.late_names:
            print(f"  late (recorded after {STRANDED_WAIT_S:.0f}s): {', '.join(progress.late_names[:10])}")
        if (args.concurrency or 0) > 1 and held and not any(h.isdigit() and int(h) >= 2 for h in held):
            print("  note: no worker was killed while holding 2 runs or more")
        for violation in violations[:20]:
            print(f"  violation: {violation}")
        if violations:
            print(f"  logs and ledger kept in {work}")
        ok = not violations
        return 0 if ok else 1
    finally:
        fleet.stop_all()
        client.close()
        if not ok:
            keep_redis(work, [s for s in [server, *(group.servers if group else [])] if s is not None],
                       group.sentinels if group else [])
        if server is not None:
            server.cleanup()
        if group is not None:
            group.cleanup()


if __name__ == "__main__":
    sys.exit(main())
