"""The dashboard in a real browser against real processes: Playwright drives Debian's ``/usr/bin/chromium``
(``playwright install`` is never run) against a ``loopsq web`` process, with ``loopsq worker`` processes and the
session's private redis-server.

- the loop page's fire times are the ones ``loopsq next`` prints;
- a running run's page shows a line the command printed after the page loaded, within 3 s;
- a workflow run's page shows a step's output, live while it runs and stored once it ended;
- each action works with the page's CSRF token, and without it is refused (403) with nothing changed;
- the Fleet page, reached from the nav, shows each worker's slots and marks a queue no worker serves.

Each page is saved as a screenshot under pytest's ``tmp_path`` and copied to ``tests/artifacts/`` (ignored by
git) as ``<test>-<page>.png``. The tests skip, saying so, only when the Chromium binary is missing (under
``CI=true`` a skip fails the run).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from loopsq.state.workflow_runs import WorkflowRunStore
from tests.integration.processes import Cluster, open_cluster
from tests.integration.test_web_api import TOKEN
from tests.redis_server import RedisServer, free_port
from tests.tools import needs_tool

pytestmark = [pytest.mark.integration, needs_tool("/usr/bin/chromium", "chromium")]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@dataclass
class Stack:
    cluster: Cluster
    url: str
    web: subprocess.Popen[bytes]
    shots: Path
    name: str

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Authorization": f"Bearer {TOKEN}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def screenshot(self, page: Any, what: str) -> None:
        path = self.shots / f"{self.name}-{what}.png"
        page.screenshot(path=str(path), full_page=True)
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(path, ARTIFACTS / path.name)


@pytest.fixture
def stack(redis_server: RedisServer, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Stack]:
    for cluster in open_cluster(redis_server.url, tmp_path):
        cluster.env["LOOPSQ_API_TOKEN"] = TOKEN
        cluster.start_all(workers=2)
        port = free_port()
        log = (tmp_path / "web.log").open("wb")
        web = subprocess.Popen([sys.executable, "-m", "loopsq", "web", "--host", "127.0.0.1", "--port", str(port)],
                               env=cluster.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               cwd=tmp_path)
        url = f"http://127.0.0.1:{port}"

        def healthy(url: str = url, web: subprocess.Popen[bytes] = web) -> bool:
            try:
                with urllib.request.urlopen(f"{url}/api/health", timeout=1) as response:
                    return response.status == 200
            except OSError:
                assert web.poll() is None, (tmp_path / "web.log").read_text()
                return False

        cluster.wait_until(healthy, 30, "loopsq web to answer")
        try:
            yield Stack(cluster, url, web, tmp_path, request.node.name)
        finally:
            web.send_signal(signal.SIGTERM)
            try:
                web.wait(15)
            except subprocess.TimeoutExpired:
                web.kill()
            log.close()
            print((tmp_path / "web.log").read_text()[-4000:])


@pytest.fixture
def page(stack: Stack) -> Iterator[Any]:
    """A logged-in Chromium page (the token exchanged for the session cookie at the login form)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            tab = browser.new_page()
            problems: list[str] = []
            tab.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
            tab.goto(f"{stack.url}/")
            tab.fill("#token", TOKEN)
            tab.click("form[action='/login'] button")
            tab.wait_for_url(f"{stack.url}/")
            yield tab
            assert [p for p in problems if "403" not in p] == []
        finally:
            browser.close()


def refused_without_token(page: Any, path: str) -> int:
    """POST ``path`` from the page (its session cookie) without the CSRF token: the status."""
    status: int = page.evaluate(
        "async p => (await fetch(p, {method: 'POST', headers: {'Content-Type': 'application/x-www-form-urlencoded'},"
        " body: 'reason=x', redirect: 'manual'})).status", path)
    return status


def test_the_loop_page_shows_the_fire_times_the_cli_prints(stack: Stack, page: Any) -> None:
    stack.cluster.create("nightly", "echo hi", "--cron", "30 9 * * 1-5", "--timezone", "Europe/Paris")
    page.goto(f"{stack.url}/")
    page.click("a.loop-link:has-text('nightly')")
    page.wait_for_selector("#fire-times")
    stack.screenshot(page, "loop")
    shown = page.locator("#fire-times tbody tr").evaluate_all(
        "rows => rows.map(r => [r.querySelector('.local').textContent, r.querySelector('.utc').textContent])")
    cli = json.loads(stack.cluster.cli("next", "nightly", "--json").stdout)
    assert shown == [[t["local"], t["utc"]] for t in cli["fireTimes"]]
    assert len(shown) == 10
    assert page.locator("#schedule").text_content() == "on cron '30 9 * * 1-5' in Europe/Paris"
    human = stack.cluster.cli("next", "nightly").stdout.splitlines()
    assert human[1:] == [f"  {local}  {utc}" for local, utc in shown]


def test_a_running_runs_page_shows_a_line_printed_after_it_loaded_within_3s(stack: Stack, page: Any) -> None:
    gate = stack.shots / "go"
    stack.cluster.create("tail", f"echo started; while [ ! -e {gate} ]; do sleep 0.05; done; echo printed-later;"
                                 " sleep 60", "--every", "1h")
    triggered = stack.cluster.cli("trigger", "tail").stdout.split()[0]
    stack.cluster.wait_until(lambda: (r := stack.cluster.run(triggered)) is not None and r.status == "running", 20,
                             "the triggered run to start")
    page.goto(f"{stack.url}/runs/{triggered}")  # output is shown by default (scrubbed when stored)
    page.wait_for_selector("#live[data-state='open']", state="attached")
    expect(page.locator('#stdout')).to_contain_text('started', timeout=5000)
    assert "printed-later" not in (page.text_content("#stdout") or "")
    gate.touch()
    printed = time.monotonic()
    expect(page.locator('#stdout')).to_contain_text('printed-later', timeout=3000)
    assert time.monotonic() - printed < 3.0
    stack.screenshot(page, "run-live")
    # Hidden when asked: the same page with showOutput=false shows only the size, live too.
    page.goto(f"{stack.url}/runs/{triggered}?showOutput=false")
    assert page.text_content("#stdout") == "[redacted 22 chars]"
    # Cancel: refused without the token (the run goes on), then done with the page's button.
    assert refused_without_token(page, f"/runs/{triggered}/cancel") == 403
    time.sleep(0.5)
    run = stack.cluster.run(triggered)
    assert run is not None and run.status == "running"
    page.fill("form[action$='/cancel'] input[name=reason]", "from the browser")
    page.click("button[data-action=cancel]")
    page.wait_for_selector("h1 .badge[data-status=failed]", timeout=15_000)
    assert page.text_content("#reason") == "cancelled by user: from the browser"
    stack.screenshot(page, "run-cancelled")


SPEC = {"name": "twostep", "steps": [
    {"id": "build", "target": {"type": "command", "command": "echo compiled", "shell": True}},
    {"id": "wait", "target": {"type": "command", "shell": True,
                              "command": "echo waiting; while [ ! -e \"$GATE\" ]; do sleep 0.05; done; echo released"},
     "dependsOn": ["build"]},
]}


def test_a_workflow_runs_page_shows_each_steps_output_live_then_stored(stack: Stack, page: Any) -> None:
    gate = stack.shots / "wf-go"
    spec = json.loads(json.dumps(SPEC))
    spec["steps"][1]["target"]["env"] = {"GATE": str(gate)}
    spec_file = stack.shots / "spec.json"
    spec_file.write_text(json.dumps(spec))
    stack.cluster.cli("workflows", "create", str(spec_file))
    run_id = stack.api("POST", "/api/workflows/twostep/runs")["runId"]
    store = WorkflowRunStore(stack.cluster.client)

    def wait_running() -> bool:
        state = store.load(run_id)
        return state is not None and state.steps.get("wait", {}).get("status") == "running"

    stack.cluster.wait_until(wait_running, 20, "the wait step to run")
    page.goto(f"{stack.url}/workflow-runs/{run_id}")
    page.wait_for_selector("#live[data-state='open']", state="attached")
    live = "section[data-step=wait] pre.stdout"
    expect(page.locator(live)).to_contain_text('waiting', timeout=5000)
    assert page.text_content("section[data-step=build] pre.stdout") == "compiled\n"
    stack.screenshot(page, "workflow-live")
    gate.touch()
    page.wait_for_selector("h1 .badge[data-status=succeeded]", timeout=15_000)  # reloaded once it ended
    assert page.text_content(live) == "waiting\nreleased\n"
    assert page.locator("#live").count() == 0
    stack.screenshot(page, "workflow-stored")
    page.goto(f"{stack.url}/workflow-runs/{run_id}?showOutput=false")
    assert page.text_content(live) == "[redacted 17 chars]"


def test_workflow_cancel_and_recover_work_with_the_token_and_are_refused_without(stack: Stack, page: Any) -> None:
    spec = json.loads(json.dumps(SPEC))
    spec["name"] = "stuck"
    spec["steps"][1]["target"]["env"] = {"GATE": str(stack.shots / "never")}
    spec_file = stack.shots / "stuck.json"
    spec_file.write_text(json.dumps(spec))
    stack.cluster.cli("workflows", "create", str(spec_file))
    store = WorkflowRunStore(stack.cluster.client)

    def running_step(run_id: str) -> dict[str, Any] | None:
        state = store.load(run_id)
        step = state.steps.get("wait", {}) if state else {}
        return step if step.get("status") == "running" and step.get("pid") else None

    first = stack.api("POST", "/api/workflows/stuck/runs")["runId"]
    stack.cluster.wait_until(lambda: running_step(first), 20, "the wait step to run")
    page.goto(f"{stack.url}/workflow-runs/{first}")
    assert refused_without_token(page, f"/workflow-runs/{first}/cancel") == 403
    state = store.load(first)
    assert state is not None and not state.terminal
    page.click("button[data-action=cancel]")
    page.wait_for_selector("h1 .badge[data-status=cancelled]", timeout=15_000)
    stack.screenshot(page, "workflow-cancelled")
    # Recover: the worker and its step process die (kill -9); the page's Recover resets the step.
    second = stack.api("POST", "/api/workflows/stuck/runs")["runId"]
    step = stack.cluster.wait_until(lambda: running_step(second), 20, "the wait step to run")
    for proc in stack.cluster.procs:
        if proc.alive():
            proc.kill9()
    os.killpg(int(step["pid"]), signal.SIGKILL)
    stack.cluster.wait_until(lambda: not os.path.exists(f"/proc/{step['pid']}"), 10, "the step process to die")
    page.goto(f"{stack.url}/workflow-runs/{second}")
    assert refused_without_token(page, f"/workflow-runs/{second}/recover") == 403
    assert running_step(second) is not None
    page.click("button[data-action=recover]")
    page.wait_for_selector("section[data-step=wait][data-status=pending]", timeout=15_000)
    assert page.locator("#events tr[data-event=recovered]").count() == 1
    stack.screenshot(page, "workflow-recovered")


def test_loop_actions_work_with_the_token_and_are_refused_without(stack: Stack, page: Any) -> None:
    loop_id = stack.cluster.create("acts", "echo acted", "--every", "1h")
    base = f"{stack.url}/loops/{loop_id}"
    page.goto(base)
    before = stack.cluster.loop("acts")
    for verb in ("pause", "resume", "stop", "run-now", "trigger"):
        assert refused_without_token(page, f"/loops/{loop_id}/{verb}") == 403, verb
    assert stack.cluster.loop("acts") == before and stack.cluster.runs("acts") == []
    for verb, status in (("pause", "paused"), ("resume", "active"), ("stop", "stopped"), ("resume", "active")):
        page.click(f"button[data-action={verb}]")
        page.wait_for_url(f"{base}?done={verb}")
        assert page.locator("h1 .badge").get_attribute("data-status") == status
        assert stack.cluster.loop("acts")["status"] == status
    page.click("button[data-action=run-now]")
    page.wait_for_url(f"{stack.url}/runs/*")
    run_id = page.url.rsplit("/", 1)[1]
    stack.cluster.wait_until(lambda: (r := stack.cluster.run(run_id)) is not None and r.status == "succeeded", 20,
                             "the run-now run to succeed")
    page.goto(base)
    page.click("button[data-action=trigger]")
    page.wait_for_url(f"{base}?done=trigger&run=*")
    triggered = page.url.rsplit("run=", 1)[1]
    stack.cluster.wait_until(lambda: (r := stack.cluster.run(triggered)) is not None and r.status == "succeeded", 20,
                             "the triggered run to succeed")
    page.goto(base)
    assert page.locator("#runs tbody tr[data-status=succeeded]").count() == 2
    assert page.locator("#run-chart rect.bar").count() == 2
    stack.screenshot(page, "loop-actions")


def test_the_fleet_page_from_the_nav_shows_slots_and_the_queue_no_worker_serves(stack: Stack, page: Any) -> None:
    from loopsq.engine import timers
    from loopsq.state.keys import Keys

    raw = timers.raw_from(stack.cluster.client)
    timers.enqueue(raw, "worker.jobs.run_now", "nope", "req", queue_name="loopsq+nvme", keys=Keys())
    page.goto(f"{stack.url}/")
    page.click("header a[href='/fleet']")
    page.wait_for_url(f"{stack.url}/fleet")
    assert page.locator("#workers tbody tr").count() == 2
    assert page.locator("#workers meter").count() == 2  # the slots in use, drawn without a script
    row = page.locator("#queues tr[data-queue='loopsq+nvme']")
    assert row.get_attribute("data-unserved") == "true"
    assert row.locator(".why").text_content() == "no live worker has labels nvme"
    assert page.locator("#queues tr[data-queue='loopsq']").get_attribute("data-unserved") == "false"
    warning = page.locator("#unserved-warning")
    assert warning.is_visible() and "loopsq+nvme" in (warning.text_content() or "")
    assert page.locator("#unserved-warning").evaluate("e => getComputedStyle(e).backgroundColor") == "rgb(255, 235, 233)"
    stack.screenshot(page, "fleet")
