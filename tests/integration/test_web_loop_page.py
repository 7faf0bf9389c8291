"""The dashboard's loop page, run lists with filters and keyset pages, and its CSRF-checked actions, in-process
(a real Redis, the app under Starlette's test client). The browser tests are in ``test_web_browser.py``."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from loopsq.domain import timeutil
from loopsq.domain.loop_spec import new_loop
from loopsq.domain.upcoming import fire_times
from loopsq.state.keys import Keys
from loopsq.state.loops import LoopStore
from loopsq.web import WebSettings, create_app
from tests.integration.test_web_api import AUTH, TOKEN, loop_body, put_run, redis_state
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

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


@pytest.fixture
def cookie_client(settings: WebSettings) -> Iterator[TestClient]:
    """A browser-like client: logged in with the session cookie, no bearer header."""
    with TestClient(create_app(settings), headers=BROWSER, base_url="http://testserver") as client:
        login = client.post("/login", data={"token": TOKEN, "next": "/"}, follow_redirects=False)
        assert login.status_code == 303
        yield client


def cron_loop(client: redis.Redis, name: str = "nightly", **extra: object) -> str:
    body = loop_body(name, schedule={"type": "cron", "expression": "30 9 * * 1-5"}, timezone="Europe/Paris", **extra)
    return LoopStore(client).create(new_loop(body, timeutil.now())).id


def test_the_loops_list_links_each_loop_to_its_page(client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis)
    page = client.get("/")
    assert f'<a class="loop-link" href="/loops/{loop_id}" title="{loop_id}">nightly</a>' in page.text


def test_a_loop_page_shows_schedule_fire_times_in_both_zones_policies_and_the_redacted_definition(
        client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis, maxAttempts=3, retryDelayMs=60_000,
                        target={"type": "command", "command": "echo hi", "shell": True, "env": {"SECRET": "hunter2"}})
    page = client.get("/loops/nightly")
    assert page.status_code == 200
    text = page.text
    assert "<dd id=\"schedule\">on cron &#39;30 9 * * 1-5&#39; in Europe/Paris</dd>" in text
    loop = client.get(f"/api/loops/{loop_id}").json()
    expected = [(t.local, t.utc) for t in fire_times(loop)]
    assert len(expected) == 10
    shown = re.findall(r'<td class="mono local">([^<]+)</td><td class="mono utc">([^<]+)</td>', text)
    assert shown == expected
    assert expected[0][0].endswith(("+01:00", "+02:00")) and expected[0][1].endswith("Z")
    assert '<dd id="policy-retry">up to 3 attempts, 1m apart (fixed)</dd>' in text
    assert "hunter2" not in text and "[redacted]" in text
    assert '<dd id="failure-streak">0 (the circuit breaker pauses the loop at 5)</dd>' in text


def test_a_loop_page_shows_the_pause_reason_the_streak_and_the_history_with_reasons(
        client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis)
    put_run(real_redis, "r1", loop_id, "2026-01-01T00:01:00.000Z", loopName="nightly", status="failed",
            durationMs=1500, error="Executable not found in PATH: claude")
    put_run(real_redis, "r2", loop_id, "2026-01-01T00:02:00.000Z", loopName="nightly", status="skipped",
            error="overlap: run r1 still running")
    page = client.get(f"/loops/{loop_id}")
    rows = re.findall(r'<tr data-run="(\w+)" data-status="(\w+)">.*?<td class="reason[^"]*">([^<]*)</td>',
                      page.text, re.S)
    assert rows == [("r2", "skipped", "overlap: run r1 still running"),
                    ("r1", "failed", "Executable not found in PATH: claude")]
    bars = re.findall(r'<rect class="bar" data-run="(\w+)" data-status="(\w+)"', page.text)
    assert bars == [("r1", "failed"), ("r2", "skipped")]
    assert "1500 ms" in page.text


def test_the_run_history_pages_by_keyset_and_filters_by_status_and_time(
        client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis)
    for i in range(30):
        put_run(real_redis, f"r{i:02d}", loop_id, f"2026-01-01T00:{i:02d}:00.000Z", loopName="nightly",
                status="failed" if i % 3 == 0 else "succeeded")
    first = client.get(f"/loops/{loop_id}")
    ids = re.findall(r'<tr data-run="(\w+)"', first.text)
    assert ids == [f"r{i:02d}" for i in range(29, 4, -1)]
    older = html.unescape(re.search(r'<a id="older" href="([^"]+)"', first.text).group(1))  # type: ignore[union-attr]
    assert "offset" not in older
    second = client.get(older)
    assert re.findall(r'<tr data-run="(\w+)"', second.text) == [f"r{i:02d}" for i in range(4, -1, -1)]
    failed = client.get("/runs", params={"loop": "nightly", "status": "failed", "since": "2026-01-01T00:10:00Z",
                                         "until": "2026-01-01T00:20:00Z"})
    assert re.findall(r'<tr data-run="(\w+)"', failed.text) == ["r18", "r15", "r12"]


@pytest.mark.parametrize(("query", "message"), [
    ({"status": "bogus"},
     "status must be one of running, succeeded, failed, timed_out, abandoned, skipped, missed, got \"bogus\""),
    ({"since": "yesterday"}, "since must be an ISO 8601 time (e.g. 2026-12-01T09:00:00Z), got \"yesterday\""),
    ({"cursor": "zzz"}, "cursor is not a cursor from a previous page, got \"zzz\""),
    ({"limit": "0"}, "limit must be an integer from 1 to 1000, got \"0\""),
])
def test_a_bad_run_filter_is_one_400_naming_the_parameter_and_value(
        client: TestClient, query: dict[str, str], message: str) -> None:
    response = client.get("/runs", params=query, headers={"Accept": "application/json"})
    assert response.status_code == 400
    assert response.json() == {"error": {"status": 400, "code": "bad_request", "message": message}}


def test_the_loops_list_filters_by_name_and_status(client: TestClient, real_redis: redis.Redis) -> None:
    cron_loop(real_redis, "alpha-nightly")
    cron_loop(real_redis, "beta-nightly")
    LoopStore(real_redis).pause("beta-nightly", timeutil.now())
    names = re.findall(r'class="loop-link"[^>]*>([^<]+)</a>', client.get("/", params={"name": "NIGHT"}).text)
    assert names == ["alpha-nightly", "beta-nightly"]
    paused = client.get("/", params={"name": "nightly", "status": "paused"}).text
    assert re.findall(r'class="loop-link"[^>]*>([^<]+)</a>', paused) == ["beta-nightly"]
    bad = client.get("/", params={"status": "sleeping"}, headers={"Accept": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == "status must be one of active, paused, stopped, expired, got \"sleeping\""


# -- actions and their CSRF token ----------------------------------------------------------------------------
def csrf_of(page_html: str) -> str:
    tokens = set(re.findall(r'name="csrf" value="([0-9a-f]+)"', page_html))
    assert len(tokens) == 1
    return tokens.pop()


@pytest.mark.parametrize("token", [None, "", "0" * 64])
def test_an_action_without_the_sessions_token_is_403_and_changes_nothing(
        cookie_client: TestClient, real_redis: redis.Redis, token: str | None) -> None:
    loop_id = cron_loop(real_redis)
    before = redis_state(real_redis)
    for path in (f"/loops/{loop_id}/pause", f"/loops/{loop_id}/stop", f"/loops/{loop_id}/trigger",
                 f"/loops/{loop_id}/run-now", "/runs/nope/cancel", "/workflow-runs/nope/cancel",
                 "/workflow-runs/nope/recover"):
        data = {} if token is None else {"csrf": token}
        response = cookie_client.post(path, data=data, follow_redirects=False,
                                      headers={"Accept": "application/json"})
        assert response.status_code == 403, path
        expected = "missing CSRF token" if not token else "invalid CSRF token"
        assert response.json()["error"]["message"].startswith(expected)
        assert response.json()["error"]["code"] == "forbidden"
    assert redis_state(real_redis) == before


def test_a_token_of_another_session_is_refused(settings: WebSettings, cookie_client: TestClient,
                                                real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis)
    with TestClient(create_app(settings), headers=BROWSER) as other:
        other.post("/login", data={"token": TOKEN, "next": "/"}, follow_redirects=False)
        theirs = csrf_of(other.get(f"/loops/{loop_id}").text)
    mine = csrf_of(cookie_client.get(f"/loops/{loop_id}").text)
    assert theirs != mine
    refused = cookie_client.post(f"/loops/{loop_id}/pause", data={"csrf": theirs}, follow_redirects=False)
    assert refused.status_code == 403
    assert LoopStore(real_redis).require(loop_id).status == "active"


def test_pause_resume_stop_and_trigger_work_with_the_pages_token(
        cookie_client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis)
    token = csrf_of(cookie_client.get(f"/loops/{loop_id}").text)
    store = LoopStore(real_redis)
    for verb, status in (("pause", "paused"), ("resume", "active"), ("stop", "stopped"), ("resume", "active")):
        response = cookie_client.post(f"/loops/{loop_id}/{verb}", data={"csrf": token}, follow_redirects=False)
        assert response.status_code == 303, response.text
        assert response.headers["location"] == f"/loops/{loop_id}?done={verb}"
        assert store.require(loop_id).status == status
    triggered = cookie_client.post(f"/loops/{loop_id}/trigger", data={"csrf": token}, follow_redirects=False)
    assert triggered.status_code == 303
    run_id = triggered.headers["location"].rsplit("run=", 1)[1]
    page = cookie_client.get(triggered.headers["location"])
    assert f'<p class="notice" id="notice">Triggered run {run_id}.</p>' in page.text
    header = cookie_client.post(f"/loops/{loop_id}/pause", headers={"X-CSRF-Token": token}, follow_redirects=False)
    assert header.status_code == 303 and store.require(loop_id).status == "paused"


def test_a_refused_action_is_the_apis_status_and_message(cookie_client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis)
    token = csrf_of(cookie_client.get(f"/loops/{loop_id}").text)
    missing = cookie_client.post("/runs/nope/cancel", data={"csrf": token}, headers={"Accept": "application/json"})
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "run not found: nope"


# -- rq-dashboard ---------------------------------------------------------------------------------------------
def test_rq_dashboard_opens_on_loopsqs_queue_and_links_back(settings: WebSettings) -> None:
    from dataclasses import replace

    with TestClient(create_app(replace(settings, rq_dashboard=True)), headers={**AUTH, **BROWSER}) as client:
        home = client.get("/rq/", follow_redirects=False)
        assert home.status_code == 302
        assert home.headers["location"] == "/rq/0/view/jobs/loopsq/queued/8/asc/1"
        page = client.get(home.headers["location"])
        assert page.status_code == 200 and "<title>RQ dashboard</title>" in page.text
        assert '<a href="/" style="color:#fff;text-decoration:none">&larr; loopsq dashboard</a>' in page.text
        assert 'id="select-queue" title="Queue name" value="loopsq"' in page.text
        assert "all the queued jobs on queue <strong>loopsq</strong>" in page.text
        overview = client.get("/rq/0/view/queues")
        assert overview.status_code == 200 and 'id="loopsq-back"' in overview.text



def test_a_namespaces_dashboard_shows_its_own_loops_and_opens_rq_dashboard_on_its_own_queue(
        settings: WebSettings, real_redis: redis.Redis) -> None:
    from dataclasses import replace

    cron_loop(real_redis)  # the default namespace's
    LoopStore(real_redis, Keys("team-a")).create(new_loop(loop_body("theirs"), timeutil.now()))
    app = create_app(replace(settings, rq_dashboard=True, keys=Keys("team-a")))
    with TestClient(app, headers={**AUTH, **BROWSER}) as client:
        page = client.get("/").text
        assert ">theirs</a>" in page and "nightly" not in page
        home = client.get("/rq/", follow_redirects=False)
        assert (home.status_code, home.headers["location"]) == (302, "/rq/0/view/jobs/team-a/queued/8/asc/1")


# -- stored and live output -----------------------------------------------------------------------------------
def test_a_finished_runs_page_shows_its_earlier_attempts_with_their_reasons_redacted_when_hidden(
        client: TestClient, real_redis: redis.Redis) -> None:
    attempts = [{"attempt": 1, "status": "failed", "exitCode": 2, "finishedAt": "2026-01-01T00:00:05.000Z",
                 "error": "process exited with code 2", "stdout": "first try\n"}]
    put_run(real_redis, "r1", "l1", "2026-01-01T00:00:00.000Z", attempt=2, status="failed",
            error="Executable not found in PATH: claude", previousAttempts=attempts)
    page = client.get("/runs/r1?showOutput=false").text
    assert '<dd class="error" id="reason">Executable not found in PATH: claude</dd>' in page
    row = re.search(r'<tr data-attempt="1" data-status="failed">(.*?)</tr>', page, re.S)
    assert row is not None and "process exited with code 2" in row.group(1) and "<td>2</td>" in row.group(1)
    assert '<pre class="attempt-stdout">[redacted 10 chars]</pre>' in page and "first try" not in page
    assert '<pre class="attempt-stdout">first try\n</pre>' in client.get("/runs/r1").text


def sse(client: TestClient, path: str) -> list[tuple[str, dict[str, object]]]:
    with client.stream("GET", path) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    found = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in fields:
            found.append((fields["event"], json.loads(fields["data"])))
    return found


def test_the_live_stream_of_a_running_run_is_sent_as_events_with_escapes_shown_or_redacted_when_hidden(
        client: TestClient, real_redis: redis.Redis) -> None:
    put_run(real_redis, "r1", "l1", "2026-01-01T00:00:00.000Z", status="running")
    key = Keys().live("r1")
    real_redis.xadd(key, {"s": "stdout", "d": "hello\n"})
    page = client.get("/runs/r1?showOutput=true").text
    assert '<pre id="stdout" data-source="" data-stream="stdout" data-chars="6">hello\n</pre>' in page
    after = html.unescape(re.search(r'data-after="([^"]+)"', page).group(1))  # type: ignore[union-attr]
    real_redis.xadd(key, {"s": "stderr", "d": "later \xe2\x9c".encode("latin-1")})
    real_redis.xadd(key, {"s": "stderr", "d": "\x93 done\x1b]52;c;ZXZpbA==\x07\n".encode("latin-1")})
    real_redis.xadd(key, {"s": "eof", "d": "succeeded"})
    shown_events = sse(client, f"/runs/r1/live?showOutput=true&after={after}")
    assert shown_events == [("chunk", {"source": "", "stream": "stderr", "text": "later "}),
                            ("chunk", {"source": "", "stream": "stderr", "text": "\u2713 done\\x1b]52;c;ZXZpbA==\\x07\n"}),
                            ("end", {"source": ""}), ("done", {})]
    redacted_events = sse(client, "/runs/r1/live")
    assert [e for e in redacted_events if e[0] == "chunk"] == [
        ("chunk", {"source": "", "stream": "stdout", "chars": 6}),
        ("chunk", {"source": "", "stream": "stderr", "chars": 6}),
        ("chunk", {"source": "", "stream": "stderr", "chars": 23})]
    assert "hello" not in json.dumps(redacted_events)
    bad = client.get("/runs/r1/live?after=nope", headers={"Accept": "application/json"})
    assert bad.status_code == 400


# -- the API's filters and keyset pages -----------------------------------------------------------------------
def test_the_api_pages_runs_by_cursor_and_filters_them_by_time(client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis)
    for i in range(7):
        put_run(real_redis, f"r{i}", loop_id, f"2026-01-01T00:0{i}:00.000Z", loopName="nightly")
    first = client.get("/api/runs", params={"limit": 3}).json()
    assert [r["id"] for r in first["items"]] == ["r6", "r5", "r4"] and first["nextOffset"] == 3
    second = client.get("/api/runs", params={"limit": 3, "cursor": first["nextCursor"]}).json()
    assert [r["id"] for r in second["items"]] == ["r3", "r2", "r1"]
    last = client.get("/api/runs", params={"limit": 3, "cursor": second["nextCursor"]}).json()
    assert ([r["id"] for r in last["items"]], last["nextCursor"], last["nextOffset"]) == (["r0"], None, None)
    ranged = client.get("/api/runs", params={"loop": "nightly", "since": "2026-01-01T00:02:00Z",
                                             "until": "2026-01-01T00:04:00Z"}).json()
    assert [r["id"] for r in ranged["items"]] == ["r3", "r2"]
    assert [r["id"] for r in client.get("/api/runs", params={"limit": 2, "offset": 5}).json()["items"]] == ["r1", "r0"]
    bad = client.get("/api/runs", params={"until": "soon"})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == 'until must be an ISO 8601 time (e.g. 2026-12-01T09:00:00Z), got "soon"'
    reversed_range = client.get("/api/runs", params={"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"})
    assert reversed_range.json()["error"]["message"] == (
        'since must be before until, got since="2026-01-02T00:00:00Z" until="2026-01-01T00:00:00Z"')


def test_the_api_lists_loops_by_part_of_their_name(client: TestClient, real_redis: redis.Redis) -> None:
    for name in ("b-nightly", "a-nightly", "weekly"):
        cron_loop(real_redis, name)
    first = client.get("/api/loops", params={"name": "NIGHT", "limit": 1}).json()
    assert [x["name"] for x in first["items"]] == ["a-nightly"]
    rest = client.get("/api/loops", params={"name": "NIGHT", "limit": 1, "cursor": first["nextCursor"]}).json()
    assert ([x["name"] for x in rest["items"]], rest["nextCursor"]) == (["b-nightly"], None)
    assert "nextCursor" not in client.get("/api/loops").json()


# -- what a newcomer trips on (the dashboard) ----------------------------------------------------------------------
LOG_OUT = '<form method="post" action="/logout"><button type="submit">Log out</button></form>'


def test_the_login_page_has_no_log_out_button_and_its_only_submit_is_log_in(settings: WebSettings) -> None:
    with TestClient(create_app(settings), headers=BROWSER) as anonymous:
        for page in (anonymous.get("/login"), anonymous.post("/login", data={"token": "guess", "next": "/"})):
            assert "Log out" not in page.text
            assert page.text.count('type="submit"') == 1 and '<button type="submit">Log in</button>' in page.text


def test_a_logged_in_page_and_its_error_pages_keep_the_log_out_button(cookie_client: TestClient) -> None:
    assert LOG_OUT in cookie_client.get("/").text
    missing = cookie_client.get("/loops/no-such-loop")
    assert missing.status_code == 404 and LOG_OUT in missing.text


def test_the_login_page_says_where_up_keeps_the_token(settings: WebSettings) -> None:
    with TestClient(create_app(settings), headers=BROWSER) as anonymous:
        text = anonymous.get("/login").text
    assert ("<code>loopsq up</code> keeps the one it made in <code>&lt;data dir&gt;/api.token</code>\n"
            '    (by default <code id="token-file">~/.loopsq/api.token</code>).') in text


def action_buttons(page_html: str) -> list[str]:
    return re.findall(r'<button type="submit" data-action="([a-z-]+)">', page_html)


def test_a_loop_page_shows_only_the_actions_that_apply_to_the_loops_status(
        client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis)
    store, now = LoopStore(real_redis), timeutil.now()
    assert action_buttons(client.get(f"/loops/{loop_id}").text) == ["pause", "stop", "run-now", "trigger"]
    store.pause(loop_id, now)
    assert action_buttons(client.get(f"/loops/{loop_id}").text) == ["resume", "stop", "run-now", "trigger"]
    store.stop(loop_id, now)
    assert action_buttons(client.get(f"/loops/{loop_id}").text) == ["resume", "run-now", "trigger"]
    store.update(loop_id, "expired", now, lambda loop: loop.with_changes(status="expired"))
    assert action_buttons(client.get(f"/loops/{loop_id}").text) == ["resume", "run-now", "trigger"]
    past = timeutil.to_iso(now - timedelta(hours=1))
    store.update(loop_id, "expired", now, lambda loop: loop.with_changes(expires_at=past))
    assert action_buttons(client.get(f"/loops/{loop_id}").text) == ["run-now", "trigger"]
    archived = cron_loop(real_redis, name="shelved")
    store.archive(archived, now)
    text = client.get(f"/loops/{archived}").text
    assert action_buttons(text) == []
    assert ('<span class="muted" id="no-actions">Archived: unarchive it (<code>loopsq unarchive</code>) to act on it.'
            '</span>') in text


def test_a_loop_that_is_not_active_shows_no_next_run(client: TestClient, real_redis: redis.Redis) -> None:
    store, now = LoopStore(real_redis), timeutil.now()
    paused, stopped = cron_loop(real_redis, name="held"), cron_loop(real_redis, name="ended")
    archived, active = cron_loop(real_redis, name="shelved"), cron_loop(real_redis, name="going")
    store.pause(paused, now)
    store.stop(stopped, now)
    store.archive(archived, now)
    assert store.get(paused).next_run_at  # kept for catch-up on resume, but not when it runs
    page = client.get("/").text

    def row(loop_id: str) -> str:
        rest = page[page.index(f'<tr data-loop="{loop_id}">'):]
        return rest[:rest.index("</tr>")]

    assert '<td class="mono next-run">—</td>' in row(paused) and '<td class="mono next-run">—</td>' in row(stopped)
    assert f'<td class="mono next-run">{store.get(active).next_run_at}</td>' in row(active)
    assert '<p class="muted" id="fire-times-none">No upcoming fire times (the loop is paused).</p>' in client.get(
        f"/loops/{paused}").text
    assert ('<p class="muted" id="fire-times-none">No upcoming fire times (the loop is paused, archived).</p>'
            in client.get(f"/loops/{archived}").text)


def test_a_jittered_loop_shows_its_jitter_and_offset_where_its_next_run_is_shown(
        client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis, jitterMs=300_000)
    stored = LoopStore(real_redis).get(loop_id)
    offset = stored.schedule.offset_ms
    assert stored.jitter_ms == 300_000 and offset and 0 < offset < 300_000
    words = (f"{offset // 60_000}m" if offset >= 60_000 else "") + \
        f"{offset % 60_000 // 1000}.{offset % 1000:03d}".rstrip("0").rstrip(".") + "s"
    listing = client.get("/").text
    assert (f'<td class="mono next-run">{stored.next_run_at}<div class="muted jitter" title="jitterMs 300000; this '
            f"loop's slots are offsetMs {offset} later than the schedule says (included above)\">jitter 5m · "
            f"+{words}</div></td>") in listing
    page = client.get(f"/loops/{loop_id}").text
    assert (f'<dd id="jitter">5m (<span class="mono">jitterMs 300000</span>): every slot of this loop is {words} '
            f'(<span class="mono">offsetMs {offset}</span>) later than the schedule says</dd>') in page
    assert (f"<p class=\"muted\" id=\"fire-times-jitter\">With this loop's jitter: each time is {words} after "
            "the schedule's slot.</p>") in page
    plain = client.get(f"/loops/{cron_loop(real_redis, name='plain')}").text
    assert 'id="jitter"' not in plain and 'class="muted jitter"' not in client.get("/", params={"name": "plain"}).text


def test_a_cancelled_loop_run_is_shown_cancelled_with_the_workflow_runs_badge_and_stays_failed(
        client: TestClient, real_redis: redis.Redis) -> None:
    loop_id = cron_loop(real_redis)
    put_run(real_redis, "rc", loop_id, "2026-01-01T00:01:00.000Z", loopName="nightly", status="failed",
            error="cancelled by user: wrong prompt", durationMs=1500)
    put_run(real_redis, "rf", loop_id, "2026-01-01T00:02:00.000Z", loopName="nightly", status="failed",
            error="exit code 1")
    badge = '<span class="badge s-cancelled" title="stored as failed">cancelled</span>'
    history = client.get(f"/loops/{loop_id}").text
    row = history[history.index('<tr data-run="rc" data-status="failed">'):]
    assert f"<td>{badge}</td>" in row[:row.index("</tr>")]
    failed = history[history.index('<tr data-run="rf" data-status="failed">'):]
    assert '<td><span class="badge s-failed">failed</span></td>' in failed[:failed.index("</tr>")]
    assert 'data-run="rc" data-status="cancelled"' in history and "<title>cancelled · 1500ms" in history
    assert f"<td>{badge}</td>" in client.get("/runs").text
    run_page = client.get("/runs/rc").text
    assert ('<span class="badge s-cancelled" data-status="failed" title="stored as failed">cancelled</span>'
            in run_page)
    assert '<a class="s-cancelled" data-status="failed" href="/runs/rc"\n            title="cancelled' in client.get(
        "/").text
    assert client.get("/api/runs/rc").json()["status"] == "failed"


def test_the_loops_list_shows_tags_and_filters_by_them(client: TestClient, real_redis: redis.Redis) -> None:
    store = LoopStore(real_redis)
    store.create(new_loop(loop_body("etl", tags={"team": "data", "env": "prod"}), timeutil.now()))
    store.create(new_loop(loop_body("web", tags={"team": "web", "env": "prod"}), timeutil.now()))
    page = client.get("/").text
    assert '<a class="tag" href="/?tag=team%3Adata">team:data</a>' in page
    names = re.findall(r'class="loop-link"[^>]*>([^<]+)</a>', client.get("/", params={"tag": "env:prod"}).text)
    assert names == ["etl", "web"]
    both = client.get("/", params={"tag": " env:prod  team:web "}).text
    assert re.findall(r'class="loop-link"[^>]*>([^<]+)</a>', both) == ["web"]
    assert 'name="tag" placeholder="team:data env:prod" value="env:prod  team:web"' in both
    bad = client.get("/", params={"tag": "team"}, headers={"Accept": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == (
        'tag must be KEY:VALUE, each of [A-Za-z0-9_./-] (key at most 64, value at most 128 characters), got "team"')


def test_the_runs_page_filters_by_the_tags_of_the_runs_loops(client: TestClient, real_redis: redis.Redis) -> None:
    store = LoopStore(real_redis)
    etl = store.create(new_loop(loop_body("etl", tags={"team": "data", "env": "prod"}), timeutil.now()))
    web = store.create(new_loop(loop_body("web", tags={"team": "web", "env": "prod"}), timeutil.now()))
    for index, loop in enumerate((etl, web, etl)):
        put_run(real_redis, f"r{index}", loop.id, f"2026-12-01T00:00:0{index}.000Z", loopName=loop.name)

    def run_ids(**params: str) -> list[str]:
        return re.findall(r'<a href="/runs/(r\d)">', client.get("/runs", params=params).text)

    assert run_ids() == ["r2", "r1", "r0"]
    assert run_ids(tag="team:data") == ["r2", "r0"]
    assert run_ids(tag=" env:prod  team:web ") == ["r1"]
    assert run_ids(tag="env:prod team:nobody") == []
    page = client.get("/runs", params={"tag": "team:data", "limit": "1"}).text
    assert 'name="tag" placeholder="team:data env:prod" value="team:data"' in page
    older = html.unescape(re.findall(r'<a id="older" href="([^"]+)"', page)[0])
    assert "tag=team%3Adata" in older
    assert re.findall(r'<a href="/runs/(r\d)">', client.get(older).text) == ["r0"]
    bad = client.get("/runs", params={"tag": "team"}, headers={"Accept": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["error"]["message"] == (
        'tag must be KEY:VALUE, each of [A-Za-z0-9_./-] (key at most 64, value at most 128 characters), got "team"')
