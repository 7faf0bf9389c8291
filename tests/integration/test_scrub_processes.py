"""On real worker processes: a run's stored output, its live stream and the mirror hold no secret (the loop's env
values and the known shapes are scrubbed as the worker captures and finalizes the run), ``loopsq logs`` prints
the run's escape sequences escaped, and a codewith loop stored for 0.3.60's durable mode runs as one
``codewith exec --json`` on a worker."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.models import Loop
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from tests.integration.processes import Cluster, open_cluster
from tests.redis_server import RedisServer
from tests.unit.test_codewith_exec import DONE, DURABLE_LOOP, EXEC, P
from tests.unit.test_executor_agents import install_fake

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

KEYS = Keys()
KEY = "sk-ant-api03-" + "Ab3dEfGh1" * 10
TOKEN = "ghp_" + "a1B2c3D4e5" * 4
PASSWORD = "hunter2-correct-horse"
PRINT = (f"printf 'key={KEY}\\n'; printf 'pass=%s token={TOKEN}\\n' \"$DB_PASSWORD\"; "
         "printf 'clip\\033]52;c;ZXZpbA==\\007 end\\n'")


@pytest.fixture
def cluster(redis_server: RedisServer, tmp_path: Path) -> Iterator[Cluster]:
    yield from open_cluster(redis_server.url, tmp_path)


def _no_secret(text: str) -> None:
    for secret in (KEY, TOKEN, PASSWORD, KEY[20:], PASSWORD[:10]):
        assert secret not in text, (secret, text)


def test_a_runs_stored_output_live_stream_and_mirror_row_are_scrubbed_and_logs_neutralises_osc_52(
    cluster: Cluster,
) -> None:
    cluster.cli("create", "command", "leaky", "--every", "1h", "--cmd", f"{PRINT}; sleep 1.5; echo done",
                "--env", f"DB_PASSWORD={PASSWORD}")
    cluster.start("worker")
    run_id = cluster.cli("trigger", "leaky").stdout.split()[0]
    live_key = KEYS.live(run_id)
    # while it runs (it sleeps after printing), the live stream holds the printed lines, scrubbed
    live = cluster.wait_until(lambda: [f["d"] for _id, f in cluster.client.xrange(live_key) if f["s"] == "stdout"],
                              20, "the run's live output")
    _no_secret("".join(live))
    run = cluster.wait_until(lambda: (r := cluster.run(run_id)) is not None and r.status != "running" and r, 30,
                             "the run to end")
    expected = ("key=[SCRUBBED]\npass=[SCRUBBED] token=[SCRUBBED]\nclip\x1b]52;c;ZXZpbA==\x07 end\ndone\n")
    assert (run.status, run.stdout) == ("succeeded", expected)
    mirrored = json.loads(cluster.cli("--json", "runs", "leaky", "--show-output").stdout)
    assert mirrored[0]["stdout"] == expected
    changes = json.dumps([c for c in cluster.changes() if str(c["type"]).startswith("run_")])
    _no_secret(changes)
    logs = cluster.cli("logs", run_id).stdout
    assert logs == expected.replace("\x1b", "\\x1b").replace("\x07", "\\x07")
    assert "\x1b" not in logs


def test_a_codewith_loop_stored_for_the_durable_mode_runs_as_one_exec_on_a_worker(cluster: Cluster) -> None:
    bin_dir = cluster.tmp / "bin"
    install_fake(bin_dir, "codewith", "fake_provider.py")
    record = cluster.tmp / "rec"
    record.mkdir()
    stdout = cluster.tmp / "events.jsonl"
    stdout.write_text(DONE)
    LoopStore(cluster.client).create(Loop.from_json(DURABLE_LOOP))  # as 0.3.60 stored it, read back as is
    cluster.start("worker", env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_RECORD_DIR": str(record),
                                 "FAKE_STDOUT_FILE": str(stdout)})
    cluster.cli("run-now", "nightly-fix", check=False)
    [run] = cluster.wait_until(lambda: [r for r in cluster.runs("nightly-fix") if r.status != "running"], 30,
                               "the codewith run to end")
    assert (run.status, run.error, run.input_tokens, run.output_tokens) == ("succeeded", None, 1200, 80)
    calls = [json.loads(line)["argv"] for line in (record / "codewith.jsonl").read_text().splitlines()]
    # one process (the worker's `codewith --version` probe aside): no agent start, read, logs or stop
    assert [argv for argv in calls if argv != ["--version"]] == [
        ["--auth-profile", "work", *EXEC, "--add-dir", "/srv/shared", "--", P]]
