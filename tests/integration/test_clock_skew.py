"""One clock, with real processes (issue #27, point 6): of two schedulers and two workers, one of each runs on a
host clock 30 s fast (then 30 s slow) under libfaketime. Judged on Redis's clock, no run starts before its slot
(by the recorded times, and by a real clock read in the run itself), no slot is missed, the recorded start lag
is the true one, and ``status`` and ``doctor`` show the skewed processes' offset, ``doctor`` with a warning.

Before loopsq judged time on Redis's clock, the +30 s case started runs ~29 s before their slot and missed
hundreds of slots while the recorded lag looked normal; the -30 s case missed dozens.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.timeutil import from_iso, to_ms
from tests.integration.processes import Cluster, gaps, open_cluster
from tests.redis_server import RedisServer
from tests.tools import needs_tool

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
SHIM = Path(__file__).parent / "faketime_shim"
LOOPS = [f"skew{i}" for i in range(6)]
EVERY_MS = 1000
#: Each loop runs at least this many slots while the skewed processes take their share.
SLOTS = 12
#: The run itself reads the real time (``date`` without libfaketime) in epoch ms: the ground truth for its start.
LEDGER = ('echo "$LOOPS_SCHEDULED_FOR $LOOPS_RUN_ID $(env -u LD_PRELOAD -u FAKETIME date +%s%3N)" '
          '>> {ledger}/ledger-$LOOPS_LOOP_NAME')

pytestmark = [pytest.mark.integration, needs_tool(LIBFAKETIME, "faketime")]


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def skewed_env(cluster: Cluster, skew: str) -> dict[str, str]:
    """A process whose host clock is off by ``skew`` (libfaketime's relative form, which keeps time running);
    the monotonic clock left true, ``time.sleep`` on ``select`` (``faketime_shim``)."""
    path = os.pathsep.join(p for p in (str(SHIM), cluster.env.get("PYTHONPATH", "")) if p)
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": skew, "FAKETIME_DONT_FAKE_MONOTONIC": "1", "PYTHONPATH": path}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("skew", ["+30s", "-30s"])
def test_a_skewed_scheduler_and_worker_run_nothing_early_miss_nothing_and_record_true_lag(
        cluster: Cluster, skew: str) -> None:
    skew_ms = int(skew[:-1]) * 1000
    env = skewed_env(cluster, skew)
    # The skew is real: the host clock a skewed process reads is off by it (and the process runs).
    probe = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.01); print(time.time())"],
                           env={**cluster.env, **env}, capture_output=True, text=True, timeout=30, check=True)
    assert abs(float(probe.stdout) - time.time() - skew_ms / 1000) < 5, probe.stdout
    procs = [cluster.start("scheduler", name="scheduler-skewed", env=env, wait=False),
             cluster.start("scheduler", name="scheduler-true", wait=False),
             cluster.start("worker", name="worker-skewed", env=env, wait=False),
             cluster.start("worker", name="worker-true", wait=False)]
    cluster.wait_started(*procs)
    ids = {p.name: cluster.worker_id(p) for p in procs}
    ledger = cluster.ledger_cmd().split(">>")[1].split("/ledger-")[0].strip()
    for name in LOOPS:
        cluster.create_fast(name, LEDGER.format(ledger=ledger), EVERY_MS)

    def enough() -> bool:
        runs = [r for name in LOOPS for r in cluster.runs(name)]
        both = {r.worker_id for r in runs if r.status == "succeeded"} >= {ids["worker-skewed"], ids["worker-true"]}
        return both and all(len(cluster.ledger(name)) >= SLOTS for name in LOOPS)

    # Not a wait that fails on its own: if the slots do not come, the checks below say what went wrong instead.
    deadline = time.monotonic() + 60
    while not enough() and time.monotonic() < deadline:
        time.sleep(0.2)

    # What status and doctor say while every process lives (checked last, after the runs).
    status = cluster.cli("status").stdout
    report = json.loads(cluster.cli("doctor", "--json", check=False).stdout)
    cluster.stop_all()

    for proc in cluster.procs:
        assert proc.popen.returncode == 0, f"{proc.name} exited {proc.popen.returncode}\n{cluster.logs()}"
    problems: list[str] = []
    true_lags: list[int] = []
    for name in LOOPS:
        entries = cluster.ledger(name)
        slots = [e[0] for e in entries]
        twice = sorted(s for s, n in Counter(slots).items() if n > 1)
        missing = gaps(slots, EVERY_MS)
        runs = cluster.runs(name)
        missed = [r.scheduled_for for r in runs if r.status == "missed"]
        if twice or missing or missed:
            problems.append(f"{name}: executed twice {twice}, ledger gaps {missing}, missed records {missed}")
        by_id = {r.id: r for r in runs}
        for slot, run_id, real_ms in entries:
            run = by_id[run_id]
            slot_ms, started_ms = to_ms(from_iso(slot)), to_ms(from_iso(str(run.started_at)))
            # No run starts before its slot: by the times recorded (Redis's clock) and by the real clock.
            if started_ms < slot_ms or int(real_ms) < slot_ms:
                problems.append(f"{name}: run {run_id} of slot {slot} started early: recorded {run.started_at}, "
                                f"really at {real_ms} ({int(real_ms) - slot_ms} ms), by {run.worker_id}")
            # The recorded start is the true one: before the command ran, and not by much (a skew would show as
            # 30 s; the bound is loose for a loaded machine).
            if not -200 <= int(real_ms) - started_ms <= 10_000:
                problems.append(f"{name}: run {run_id} recorded started {run.started_at}, ran at {real_ms}, "
                                f"by {run.worker_id}")
            true_lags.append(started_ms - slot_ms)
    assert not problems, "\n".join(problems) + "\n" + cluster.logs()
    ran_by = Counter(r.worker_id for name in LOOPS for r in cluster.runs(name) if r.status == "succeeded")
    assert ran_by[ids["worker-skewed"]] and ran_by[ids["worker-true"]], (ran_by, ids)
    true_lags.sort()
    assert true_lags and true_lags[0] >= 0 and true_lags[len(true_lags) // 2] < 5_000, true_lags

    # Status and doctor show each skewed process's offset; doctor warns, naming it.
    shown: dict[str, float] = {}
    for name, pid in ids.items():
        line = next((ln for ln in status.splitlines() if ln.strip().startswith(pid)), "")
        found = re.search(r"clock=([+-]\d+\.\d+) s", line)
        assert found, f"no clock offset for {name} in status:\n{status}"
        shown[name] = float(found.group(1)) * 1000
    for name in ids:
        expected = skew_ms if name.endswith("skewed") else 0
        assert abs(shown[name] - expected) < 1000, (name, shown, status)
    clock_checks = {c["id"]: c for c in report["checks"] if c["id"].startswith("clock")}
    assert set(clock_checks) == {f"clock:{ids['scheduler-skewed']}", f"clock:{ids['worker-skewed']}"}, clock_checks
    for name in ("scheduler-skewed", "worker-skewed"):
        check = clock_checks[f"clock:{ids[name]}"]
        assert check["status"] == "warn"
        assert re.fullmatch(rf"{re.escape(ids[name])} clock is {re.escape(skew[0])}(29\.\d|30\.\d) s off Redis's "
                            r"\(over 1 s\); fix the time sync of host \S+", check["message"]), check
