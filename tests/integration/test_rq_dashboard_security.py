"""rq-dashboard under ``/rq`` held to the web app's rules (``loopsq/web/rq_guard.py``): a job carrying HTML runs
no script in Chromium (Debian's ``/usr/bin/chromium`` through Playwright), every ``/rq`` response carries the
security headers, a POST without the session's CSRF token is 403 and changes nothing, and its errors are the one
JSON error body."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import rq
import uvicorn
from fastapi.testclient import TestClient

from loopsq.web import WebSettings, create_app, csrf
from loopsq.web.rq_guard import HEADERS
from tests.integration.test_web_api import AUTH, TOKEN, redis_state
from tests.redis_server import RedisServer, free_port
from tests.tools import needs_tool

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
#: A loop name with HTML, as the README's RQ example would enqueue it.
HOSTILE = '<img src=x onerror="window.pwned=1;alert(1)"><script>window.pwned2=1;alert(2)</script>'
BEARER_CSRF = csrf.token_of(TOKEN, "bearer")


@pytest.fixture
def settings(redis_server: RedisServer, real_redis: redis.Redis, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> WebSettings:
    monkeypatch.setenv("TZ", "UTC")
    return WebSettings(redis_url=redis_server.url, data_dir=tmp_path / "data", token=TOKEN, follow_mirror=False)


@pytest.fixture
def api(settings: WebSettings) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers=AUTH) as client:
        yield client


def hostile_job(real_redis: redis.Redis) -> str:
    """The README's RQ trigger with a loop name carrying HTML, left queued (no worker runs here)."""
    job = rq.Queue("loopsq", connection=real_redis).enqueue("worker.jobs.trigger", HOSTILE,
                                                              idempotency_key=HOSTILE)
    return str(job.id)


def assert_secured(response: Any) -> None:
    csp = response.headers["content-security-policy"]
    script_src = re.search(r"script-src ([^;]*)", csp)
    assert script_src is not None and "'unsafe-inline'" not in script_src.group(1), csp
    assert re.fullmatch(r"'self' 'nonce-[A-Za-z0-9_-]{24}' 'unsafe-eval'", script_src.group(1)), csp
    assert "frame-ancestors 'none'" in csp and "default-src 'none'" in csp
    assert {k: response.headers.get(k) for k in HEADERS} == HEADERS


def test_every_rq_response_carries_the_security_headers(api: TestClient, real_redis: redis.Redis) -> None:
    job_id = hostile_job(real_redis)
    page = api.get(f"/rq/0/view/job/{job_id}")
    assert page.status_code == 200
    assert_secured(page)
    nonce = re.search(r"'nonce-([^']+)'", page.headers["content-security-policy"])
    assert nonce is not None
    # The one inline block carries the nonce (and the CSRF header default); no other inline script has it.
    assert page.text.count(f'nonce="{nonce.group(1)}"') == 1
    assert f'$.ajaxSetup({{headers: {{"X-CSRF-Token": "{BEARER_CSRF}"}}}});' in page.text
    other = api.get(f"/rq/0/view/job/{job_id}").headers["content-security-policy"]
    assert other != page.headers["content-security-policy"]  # a fresh nonce per response
    for path in ("/rq/0/data/queues.json", f"/rq/0/data/job/{job_id}.json", "/rq/static/js/jquery-3.5.1.min.js",
                 "/rq/0/view/queues", "/rq/no/such/page", "/rq/requeue/loopsq"):
        assert_secured(api.get(path))


def test_the_job_templates_escape_what_they_insert(api: TestClient, real_redis: redis.Redis) -> None:
    job_id = hostile_job(real_redis)
    page = api.get(f"/rq/0/view/job/{job_id}").text
    assert "<%= d.description %>" not in page and "<%- d.description %>" in page
    # The two places that escaped already (with jQuery) are left alone, so nothing is escaped twice.
    jobs = api.get("/rq/0/view/jobs/loopsq/queued/8/asc/1").text
    assert "<%= $('<div/>').text(d.description).html() %>" in jobs


@pytest.mark.parametrize("path", ["/rq/requeue/loopsq", "/rq/queue/loopsq/compact", "/rq/queue/loopsq/failed/empty",
                                  "/rq/job/abc/requeue", "/rq/job/abc/delete"])
def test_a_post_to_rq_without_the_csrf_token_is_403_and_changes_nothing(
        api: TestClient, real_redis: redis.Redis, path: str) -> None:
    hostile_job(real_redis)
    before = redis_state(real_redis)
    missing = api.post(path)
    assert (missing.status_code, missing.json()) == (403, {"error": {
        "status": 403, "code": "forbidden", "message": "missing CSRF token: reload the page and submit its form again"}})
    wrong = api.post(path, headers={"X-CSRF-Token": csrf.token_of(TOKEN, "session:other")})
    assert (wrong.status_code, wrong.json()) == (403, {"error": {
        "status": 403, "code": "forbidden", "message": "invalid CSRF token: reload the page and submit its form again"}})
    assert_secured(missing)
    assert redis_state(real_redis) == before


def test_a_post_to_rq_with_the_csrf_token_works(api: TestClient) -> None:
    answer = api.post("/rq/requeue/loopsq", headers={"X-CSRF-Token": BEARER_CSRF})
    assert (answer.status_code, answer.json()) == (200, {"status": "OK", "count": 0})


def test_rq_errors_are_the_one_json_error_body(api: TestClient, real_redis: redis.Redis,
                                               redis_server: RedisServer) -> None:
    missing = api.get("/rq/no/such/page")
    assert (missing.status_code, missing.json()) == (404, {"error": {
        "status": 404, "code": "not_found", "message": "no such page: /rq/no/such/page"}})
    for path in ("/rq/0/view/job/nope", "/rq/0/data/job/nope.json"):
        job = api.get(path)
        assert (job.status_code, job.json()) == (404, {"error": {
            "status": 404, "code": "not_found", "message": "no such job: nope"}}), path
    real_redis.set("rq:job:broken", "not a hash")  # rq-dashboard's job view raises on it (WRONGTYPE)
    broken = api.get("/rq/0/data/job/broken.json")
    assert broken.headers["content-type"] == "application/json"
    assert broken.status_code == 500 and broken.json()["error"]["code"] == "internal_error"
    assert broken.json()["error"]["message"].startswith("internal error: ")
    assert_secured(broken)


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
        thread.join(15)


@needs_tool(CHROMIUM, "chromium")  # Debian's: Playwright cannot download browsers here
def test_a_job_carrying_html_runs_no_script_on_rq_dashboards_pages(served: str, real_redis: redis.Redis) -> None:
    from playwright.sync_api import sync_playwright

    job_id = hostile_job(real_redis)
    dialogs: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.goto(f"{served}/")
            page.fill("#token", TOKEN)
            page.click("form[action='/login'] button")
            page.wait_for_url(f"{served}/")
            views = {f"/rq/0/view/job/{job_id}": "#job-data .description-scroll",
                     "/rq/0/view/jobs/loopsq/queued/8/asc/1": f"tr[data-job-id='{job_id}'] .description"}
            for view, filled in views.items():
                page.goto(f"{served}{view}")
                # rq-dashboard's own script filled the page from its JSON, and every image on it (an injected one
                # included) has loaded or failed, its error handlers fired.
                page.wait_for_selector(filled, timeout=15_000)
                page.wait_for_function("Array.from(document.images).every(i => i.complete)")
                page.evaluate("() => new Promise(done => setTimeout(done, 100))")
                assert page.evaluate("[window.pwned, window.pwned2]") == [None, None], view
                assert HOSTILE[:50] in page.inner_text(filled), view  # rq shortens long arguments
                # Past the escaping, the policy itself refuses an injected handler: the image fails, no script runs.
                page.evaluate("""() => new Promise(done => {
                    const box = document.createElement('div');
                    box.innerHTML = '<img id="probe" src="/rq/nope.png" onerror="window.pwned=3">';
                    document.body.appendChild(box);
                    box.querySelector('#probe').addEventListener('error', () => setTimeout(done, 50));
                })""")
                assert page.evaluate("window.pwned") is None, view
            # Its own POSTs carry the session's CSRF token: requeue-all through rq-dashboard's jQuery works.
            status = page.evaluate("""() => new Promise(done =>
                $.post('/rq/requeue/loopsq').always((_, __, xhr) => done(xhr.status || _.status)))""")
            assert status == 200
            refused = page.evaluate("async () => (await fetch('/rq/requeue/loopsq', {method: 'POST'})).status")
            assert refused == 403
            assert dialogs == []
        finally:
            browser.close()
