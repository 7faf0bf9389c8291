"""The dashboard: server-rendered pages in-process, and the workflow DAG in headless Chromium.

The browser test drives Debian's ``/usr/bin/chromium`` with Playwright (``playwright install`` is never run) and
skips, saying so, only when that binary is missing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import uvicorn
from fastapi.testclient import TestClient

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.engine import timers
from loopsq.engine.runtime import Runtime
from loopsq.engine.workflow_runner import execute_workflow
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.system.procs import hostname, process_start_time
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, PIPELINE, TOKEN, loop_body, put_run
from tests.redis_server import RedisServer, free_port
from tests.tools import needs_tool

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
EXPECTED_STEPS = [("build", "succeeded"), ("test", "failed"), ("lint", "skipped"), ("ship", "skipped")]
BROWSER = {"Accept": "text/html"}


@pytest.fixture
def settings(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> WebSettings:
    monkeypatch.setenv("TZ", "UTC")
    return WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False,
                       rq_dashboard=False)


@pytest.fixture
def client(settings: WebSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers={**AUTH, **BROWSER}) as client:
        yield client


def failed_pipeline_run(client: redis.Redis) -> str:
    """Run the four-step pipeline in this process; its ``test`` step fails, so ``lint`` and ``ship`` are skipped."""
    spec = WorkflowStore(client).create(PIPELINE, timeutil.now())
    with Runtime(client=client, role="manual") as rt:
        return execute_workflow(rt, spec).run_id


def create_loop_with_runs(client: redis.Redis, statuses: list[str]) -> str:
    loop = LoopStore(client).create(new_loop(loop_body(), timeutil.now()))
    for i, status in enumerate(statuses):
        put_run(client, f"r{i}", loop.id, f"2026-01-01T00:0{i}:00.000Z", loopName=loop.name, status=status)
    return loop.id


def nodes(html: str) -> list[tuple[str, str]]:
    return re.findall(r'<g class="node" data-step="([^"]+)" data-status="([^"]+)">', html)


def test_the_loops_page_shows_status_schedule_next_run_and_the_last_runs_oldest_first(
        client: TestClient, real_redis: redis.Redis) -> None:
    create_loop_with_runs(real_redis, ["succeeded", "failed", "timed_out"])
    loop = client.get("/api/loops/hello").json()
    page = client.get("/")
    assert page.status_code == 200
    assert '<span class="badge s-active">active</span>' in page.text
    assert '<td class="mono">every 1h</td>' in page.text
    assert f'<td class="mono next-run">{loop["nextRunAt"]}</td>' in page.text
    strip = re.findall(r'data-status="(\w+)" href="/runs/(\w+)"', page.text)
    assert strip == [("succeeded", "r0"), ("failed", "r1"), ("timed_out", "r2")]
    assert '<meta http-equiv="refresh" content="5">' in page.text


def test_a_run_page_shows_its_output_escaped_and_refreshes_only_while_running(
        client: TestClient, real_redis: redis.Redis) -> None:
    put_run(real_redis, "r1", "l1", "2026-01-01T00:00:00.000Z", stdout="<script>alert(1)</script>\n",
            stderr="a & b", error="exit <3>")
    page = client.get("/runs/r1?showOutput=true")
    assert '<pre id="stdout">&lt;script&gt;alert(1)&lt;/script&gt;\n</pre>' in page.text
    assert '<pre id="stderr">a &amp; b</pre>' in page.text
    assert "exit &lt;3&gt;" in page.text and "<script>" not in page.text
    assert 'http-equiv="refresh"' not in page.text
    put_run(real_redis, "r2", "l1", "2026-01-01T00:01:00.000Z", status="running")
    assert '<meta http-equiv="refresh" content="5">' in client.get("/runs/r2").text


def test_a_run_page_shows_its_scrubbed_output_by_default_and_redacts_it_when_the_viewer_hides_it(
        client: TestClient, real_redis: redis.Redis) -> None:
    put_run(real_redis, "r1", "l1", "2026-01-01T00:00:00.000Z", stdout="built 3 targets\n", stderr="", error="boom")
    page = client.get("/runs/r1").text
    assert '<pre id="stdout">built 3 targets\n</pre>' in page
    assert '<a id="output-toggle" href="/runs/r1?showOutput=false">Hide output</a>' in page
    assert "Output is scrubbed of secrets before it is stored" in page
    hidden = client.get("/runs/r1?showOutput=false").text
    assert '<pre id="stdout">[redacted 16 chars]</pre>' in hidden and "built 3" not in hidden
    assert '<pre id="stderr"></pre>' in hidden and "boom" in hidden  # errors stay visible, as in the CLI
    assert '<a id="output-toggle" href="/runs/r1">Show output</a>' in hidden


def test_a_run_stored_before_scrubbing_is_shown_scrubbed_of_the_secret_shapes(
        client: TestClient, real_redis: redis.Redis) -> None:
    key = "sk-proj-" + "xY9zQ2wE4rT6" * 4
    put_run(real_redis, "r1", "l1", "2026-01-01T00:00:00.000Z", stdout=f"key={key}\n", error=f"bad {key}",
            previousAttempts=[{"attempt": 1, "status": "failed", "stdout": f"old {key}\n"}], attempt=2)
    page = client.get("/runs/r1").text
    assert key not in page and '<pre id="stdout">key=[SCRUBBED]\n</pre>' in page and "bad [SCRUBBED]" in page


def test_a_run_pages_output_shows_terminal_escapes_escaped(client: TestClient, real_redis: redis.Redis) -> None:
    put_run(real_redis, "r1", "l1", "2026-01-01T00:00:00.000Z", stdout="copy\x1b]52;c;ZXZpbA==\x07 done\r\n",
            stderr="\x9b31m red", error="exit \x1b[2J")
    page = client.get("/runs/r1").text
    assert '<pre id="stdout">copy\\x1b]52;c;ZXZpbA==\\x07 done\\x0d\n</pre>' in page
    assert '<pre id="stderr">\\x9b31m red</pre>' in page and "exit \\x1b[2J" in page
    assert "\x1b" not in page and "\x9b" not in page and "\x07" not in page


@pytest.mark.parametrize("path", ["/", "/runs", "/workflow-runs", "/fleet"])
def test_pages_are_sent_with_a_strict_content_security_policy(client: TestClient, path: str) -> None:
    headers = client.get(path).headers
    assert headers["content-security-policy"].startswith("default-src 'none'; style-src 'unsafe-inline';")
    assert (headers["x-content-type-options"], headers["referrer-policy"]) == ("nosniff", "no-referrer")


def live_worker(client: redis.Redis, worker_id: str, **record: Any) -> None:
    """A live worker's registration and liveness record, as ``Runtime`` writes them."""
    body = {"id": worker_id, "role": "worker", "host": "h1", "pid": 1, "startedAt": "2026-12-01T00:00:00.000Z",
            "runs": [], **record}
    client.sadd(Keys().workers, worker_id)
    client.set(Keys().worker(worker_id), json.dumps(body), px=60_000)


def test_the_fleet_page_shows_workers_queues_and_timers_and_warns_of_runs_no_live_worker_can_take(
        client: TestClient, real_redis: redis.Redis) -> None:
    live_worker(real_redis, "w-gpu", labels=["gpu", "host:h1"], slots=3, busy=1, queues=["loopsq+gpu", "loopsq"],
                host="<b>h1</b>")
    raw = timers.raw_from(real_redis)
    timers.enqueue(raw, "worker.jobs.run_now", "l1", "req", queue_name="loopsq+nvme", keys=Keys())
    timers.enqueue(raw, "worker.jobs.run_now", "l2", "req", queue_name="loopsq+gpu", keys=Keys())
    page = client.get("/fleet")
    assert page.status_code == 200
    assert '<a href="/fleet">Fleet</a>' in page.text  # in the nav of every page
    assert '<p id="fleet-summary">1 of 3 slots busy on 1 live worker(s).</p>' in page.text
    assert '<tr data-worker="w-gpu" data-busy="1" data-slots="3">' in page.text
    assert '<td class="mono labels">gpu, host:h1</td>' in page.text
    assert '<meter min="0" max="3" value="1"></meter> 1 / 3' in page.text
    assert "&lt;b&gt;h1&lt;/b&gt;" in page.text and "<b>h1</b>" not in page.text  # escaped
    rows = re.findall(r'<tr data-queue="([^"]+)" data-depth="(\d+)" data-unserved="(\w+)">', page.text)
    assert rows == [("loopsq", "0", "false"), ("loopsq+gpu", "1", "false"), ("loopsq+nvme", "1", "true")]
    assert '<span class="error why">no live worker has labels nvme</span>' in page.text
    warning = re.search(r'<p class="warning" id="unserved-warning" role="alert">(.*?)</p>', page.text, re.S)
    assert warning is not None and " ".join(warning.group(1).split()) == (
        'Runs are waiting that no live worker can take: <span class="mono">loopsq+nvme</span> '
        "(no live worker has labels nvme).")
    assert '<dd id="timers-overdue">0</dd>' in page.text
    assert '<meta http-equiv="refresh" content="5">' in page.text


def test_the_fleet_page_of_an_empty_deployment_says_no_worker_is_live_and_warns_of_nothing_waiting(
        client: TestClient) -> None:
    page = client.get("/fleet").text
    assert '<p class="muted" id="workers-none">No live worker. Start one with <code>loopsq worker</code>.</p>' in page
    assert 'id="unserved-warning"' not in page  # the base queue is unserved, but nothing waits there
    assert '<span class="error why">no live worker is running</span>' in page


def test_a_workflow_run_page_draws_the_dag_with_step_states_edges_and_the_timeline(
        client: TestClient, real_redis: redis.Redis) -> None:
    run_id = failed_pipeline_run(real_redis)
    page = client.get(f"/workflow-runs/{run_id}")
    assert page.status_code == 200
    assert nodes(page.text) == EXPECTED_STEPS
    edges = re.findall(r'<path class="edge" d="[^"]+" data-from="(\w+)" data-to="(\w+)"/>', page.text)
    assert sorted(edges) == [("build", "lint"), ("build", "test"), ("lint", "ship"), ("test", "ship")]
    assert re.findall(r'<tr data-event="(\w+)">', page.text) == [
        "created", "step_started", "step_succeeded", "step_started", "step_failed", "step_skipped", "step_skipped",
        "failed"]
    assert 'http-equiv="refresh"' not in page.text  # the run has ended
    listing = client.get("/workflow-runs")
    assert f'<a href="/workflow-runs/{run_id}">{run_id}</a>' in listing.text


def test_a_missing_page_is_an_html_error_for_browsers_and_the_error_body_otherwise(client: TestClient) -> None:
    page = client.get("/workflow-runs/nope")
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert '<p class="error">workflow run not found: nope</p>' in page.text
    data = client.get("/runs/nope", headers={"Accept": "application/json"})
    assert data.json() == {"error": {"status": 404, "code": "not_found", "message": "run not found: nope"}}


# -- the browser ------------------------------------------------------------------------------------------------
@pytest.fixture
def served(settings: WebSettings) -> Iterator[str]:
    """The app served by uvicorn on a free port in a thread (a browser needs a real socket)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@needs_tool(str(CHROMIUM), "chromium")  # Debian's: Playwright cannot download browsers here
def test_the_browser_draws_the_workflow_dag_with_each_steps_state(served: str, real_redis: redis.Redis) -> None:
    from playwright.sync_api import sync_playwright

    run_id = failed_pipeline_run(real_redis)
    create_loop_with_runs(real_redis, ["succeeded", "failed"])
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
            page.goto(f"{served}/workflow-runs/{run_id}")
            assert page.url.startswith(f"{served}/login?next=")
            page.fill("#token", TOKEN)
            page.click("form[action='/login'] button")
            page.wait_for_url(f"{served}/workflow-runs/{run_id}")
            drawn: list[Any] = page.locator("svg#dag g.node").evaluate_all(
                "gs => gs.map(g => [g.dataset.step, g.dataset.status, getComputedStyle(g.querySelector('rect')).fill])")
            assert [(step, status) for step, status, _ in drawn] == EXPECTED_STEPS
            fills = {status: fill for _, status, fill in drawn}
            assert fills == {"succeeded": "rgb(26, 127, 55)", "failed": "rgb(207, 34, 46)",
                             "skipped": "rgb(175, 184, 193)"}
            assert page.locator("svg#dag path.edge").count() == 4
            box = page.locator("svg#dag").bounding_box()
            assert box is not None and box["width"] > 600 and box["height"] > 100
            assert page.locator("#events tbody tr").count() == 8
            page.goto(f"{served}/")
            strip = page.locator(".strip a").evaluate_all(
                "as => as.map(a => [a.dataset.status, getComputedStyle(a).backgroundColor])")
            assert strip == [["succeeded", "rgb(26, 127, 55)"], ["failed", "rgb(207, 34, 46)"]]
        finally:
            browser.close()
    assert problems == []


def test_a_run_page_shows_its_outcome_usage_and_workspace(client: TestClient, real_redis: redis.Redis) -> None:
    put_run(real_redis, "r9", "l1", "2026-01-01T00:00:00.000Z", outcome="needs_human",
            control={"outcome": "needs_human", "note": "conflict <main>"}, inputTokens=120, outputTokens=30,
            costUsd=0.4, workspace="repo", workspaceFence=7)
    page = client.get("/runs/r9").text
    assert '<dd id="outcome">needs_human · conflict &lt;main&gt;</dd>' in page
    assert '<dd id="usage">in 120 · out 30 tokens · $0.4000</dd>' in page
    assert "repo (fence 7)" in page


def test_a_loop_page_shows_usage_per_run_the_window_totals_and_the_budget(
        client: TestClient, real_redis: redis.Redis) -> None:
    now = timeutil.now()
    body = {**loop_body(), "budgetCost": {"limit": 2.5, "per": "day"}, "budgetRuns": {"limit": 40, "per": "week"}}
    loop = LoopStore(real_redis).create(new_loop(body, now))
    usage = {"day": {"start": "2026-12-01", "runs": 2, "inputTokens": 300, "outputTokens": 70, "costUsd": 0.9},
             "week": {"start": "2026-11-30", "runs": 5, "inputTokens": 800, "outputTokens": 150, "costUsd": 1.75}}
    LoopStore(real_redis).update(loop.id, "loop_updated", now, lambda stored: stored.with_changes(usage=usage))
    put_run(real_redis, "u1", loop.id, "2026-12-01T00:00:00.000Z", loopName=loop.name, inputTokens=120,
            outputTokens=30, costUsd=0.4)
    page = client.get(f"/loops/{loop.id}").text
    assert ('<dd id="usage"><span class="usage-day">day from 2026-12-01: 2 runs · in 300 · out 70 tokens · $0.90</span>; '
            '<span class="usage-week">week from 2026-11-30: 5 runs · in 800 · out 150 tokens · $1.75</span></dd>') in page
    assert '<dd id="budget">40 runs/week; $2.50/day</dd>' in page
    assert '<td class="usage">in 120 · out 30 · $0.4000</td>' in page


RECOVER = 'data-action="recover">Recover</button>'


def test_recover_shows_only_on_a_running_workflow_run_whose_step_process_is_gone(
        client: TestClient, real_redis: redis.Redis) -> None:
    spec = WorkflowStore(real_redis).create({**PIPELINE, "name": "another"}, timeutil.now())
    store = WorkflowRunStore(real_redis)
    done, _ = store.create(spec, timeutil.now())
    assert store.finish_run(done, "succeeded", timeutil.now(), error=None)
    succeeded = client.get(f"/workflow-runs/{done.run_id}").text
    assert 'data-status="succeeded">succeeded</span>' in succeeded and RECOVER not in succeeded
    assert RECOVER not in client.get(f"/workflow-runs/{failed_pipeline_run(real_redis)}").text
    state, _ = store.create(spec, timeutil.now())
    assert RECOVER not in client.get(f"/workflow-runs/{state.run_id}").text  # nothing running yet
    assert store.start_step(state, "build", timeutil.now())
    me = os.getpid()
    store.mark_step_pid(state, "build", timeutil.now(), pid=me, start_time=process_start_time(me), host=hostname())
    alive = client.get(f"/workflow-runs/{state.run_id}").text
    assert RECOVER not in alive and 'data-action="cancel">Cancel workflow run</button>' in alive
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.mark_step_pid(state, "build", timeutil.now(), pid=dead.pid, start_time=None, host=hostname())
    gone = client.get(f"/workflow-runs/{state.run_id}").text
    assert (f'<form class="action" method="post" action="/workflow-runs/{state.run_id}/recover">' in gone
            and RECOVER in gone)
