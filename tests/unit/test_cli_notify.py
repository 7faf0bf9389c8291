"""``loopsq notify add|list|remove|log`` and the signing rule: exact output, exact one-line errors, exit codes,
bad input writes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from loopsq.domain import notify as domain
from loopsq.state.keys import Keys
from loopsq.state.notify import LOG_SIZE, NotifyStore
from tests.notify_receiver import verify
from tests.unit.cli_helpers import Cli, make_cli

LABEL = "[a-z0-9][a-z0-9._:/-]{0,63}"
EVENTS = "failed, recovered, missed, paused, overdue"


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cli:
    return make_cli(tmp_path, monkeypatch)


def test_signature_matches_the_standard_webhooks_reference_example() -> None:
    secret, msg_id, timestamp, body = ("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek",
                                       1614265330, '{"test": 2432232314}')
    assert domain.sign(secret, msg_id, timestamp, body) == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = domain.headers(secret, msg_id, timestamp, body)
    assert (headers["webhook-id"], headers["webhook-timestamp"]) == (msg_id, "1614265330")
    assert verify(secret, headers, body.encode())
    assert not verify(secret, headers, b'{"test": 2432232315}')


def test_a_new_secret_is_whsec_base64_of_24_bytes_and_signs() -> None:
    secret = domain.new_secret()
    assert re.fullmatch(r"whsec_[A-Za-z0-9+/]{32}", secret)
    assert secret != domain.new_secret()
    assert verify(secret, domain.headers(secret, "msg_1", 1, "{}"), b"{}")


def test_backoff_doubles_from_the_minimum_up_to_the_cap() -> None:
    assert [domain.backoff_ms(n, 5_000, 600_000) for n in (1, 2, 3, 4, 7, 8, 100)] == [
        5_000, 10_000, 20_000, 40_000, 320_000, 600_000, 600_000]


def test_body_is_typed_json_with_a_slack_text_line() -> None:
    body = json.loads(domain.event_body("failed", "2026-01-01T00:00:00.000Z", {
        "loop": "nightly", "run": "abc", "status": "failed", "exitCode": 3, "error": "exited 3"}))
    assert body == {"type": "loop.failed", "timestamp": "2026-01-01T00:00:00.000Z",
                    "data": {"loop": "nightly", "run": "abc", "status": "failed", "exitCode": 3, "error": "exited 3"},
                    "text": "loopsq: loop nightly failed (run abc, failed, exit 3): exited 3"}


def test_add_shows_the_secret_once_and_list_never(cli: Cli) -> None:
    out = cli.ok("notify", "add", "ops", "--webhook", "https://hooks.example.com/x")
    first, second = out.splitlines()
    assert first == "ops  https://hooks.example.com/x  on=failed,recovered,missed,paused"
    secret = NotifyStore(cli.redis, Keys()).get("ops").secret  # type: ignore[union-attr]
    assert second == f"secret: {secret}  (shown once: receivers verify webhook-signature with it)"
    # Changed: settings replaced, secret kept and not shown again.
    out = cli.json("notify", "add", "ops", "--webhook", "http://127.0.0.1:9/h", "--on", "overdue,failed",
                   "--tag", "team:data", "--alert-after", "2h")
    assert out == {"name": "ops", "webhook": "http://127.0.0.1:9/h", "on": ["failed", "overdue"],
                   "tags": {"team": "data"}, "alertAfterMs": 7_200_000, "createdAt": "2026-01-01T00:00:00.000Z"}
    assert NotifyStore(cli.redis, Keys()).get("ops").secret == secret  # type: ignore[union-attr]
    assert cli.ok("notify", "list") == (
        "ops  http://127.0.0.1:9/h  on=failed,overdue  alert-after=2h  tags=team:data  pending=0\n")
    assert cli.json("notify", "ls") == [{**out, "pending": 0}]
    assert secret not in cli.ok("notify", "list") + json.dumps(cli.json("notify", "list"))
    assert [f["type"] for _id, f in cli.redis.xrange(Keys().changes)] == ["notify_set"] * 2
    assert secret not in json.dumps(cli.redis.xrange(Keys().changes))


def test_remove_drops_the_endpoint_and_its_keys(cli: Cli) -> None:
    cli.ok("notify", "add", "ops", "--webhook", "https://h.example.com/x")
    store = NotifyStore(cli.redis, Keys())
    store.enqueue("ops", "msg_1", "{}", 0)
    store.log_attempt("ops", {"id": "msg_1"})
    assert cli.ok("notify", "remove", "ops") == "ops removed\n"
    assert [k for k in cli.redis.keys("*") if ":notify:" in k] == []
    result = cli.run("notify", "rm", "ops")
    assert (result.exit_code, result.stderr, result.stdout) == (1, "error: notification not found: ops\n", "")


def test_log_shows_the_newest_attempts_first_and_is_bounded(cli: Cli) -> None:
    cli.ok("notify", "add", "ops", "--webhook", "https://h.example.com/x")
    store = NotifyStore(cli.redis, Keys())
    for n in range(LOG_SIZE + 5):
        store.log_attempt("ops", {"at": "2026-01-01T00:00:00.000Z", "id": f"msg_{n}", "type": "loop.failed",
                                  "attempt": 1, "status": 204, "ok": True})
    assert cli.redis.llen(Keys().notify_log("ops")) == LOG_SIZE
    assert cli.ok("notify", "log", "ops", "--limit", "2") == (
        f"2026-01-01T00:00:00.000Z  ops  loop.failed  msg_{LOG_SIZE + 4}  attempt=1  status=204  ok\n"
        f"2026-01-01T00:00:00.000Z  ops  loop.failed  msg_{LOG_SIZE + 3}  attempt=1  status=204  ok\n")
    assert len(cli.json("notify", "log")) == 20
    result = cli.run("notify", "log", "nope")
    assert (result.exit_code, result.stderr) == (1, "error: notification not found: nope\n")


@pytest.mark.parametrize(("args", "message"), [
    (("--webhook", "ftp://h.example.com/x"), '--webhook must be an http(s) URL, got "ftp://h.example.com/x"'),
    (("--webhook", "h.example.com"), '--webhook must be an http(s) URL, got "h.example.com"'),
    (("--webhook", "http://"), '--webhook must be an http(s) URL, got "http://"'),
    (("--webhook", "http://a b/"), '--webhook must be an http(s) URL, got "http://a b/"'),
    (("--webhook", "https://h.example.com", "--on", "failed,exploded"), f'--on takes {EVENTS}, got "exploded"'),
    (("--webhook", "https://h.example.com", "--on", ""), f'--on takes {EVENTS}, got ""'),
    (("--webhook", "https://h.example.com", "--tag", "team"), '--tag must be key:value, got "team"'),
    (("--webhook", "https://h.example.com", "--alert-after", "soon"),
     '--alert-after must be a duration greater than zero such as 2h, got "soon"'),
    (("--webhook", "https://h.example.com", "--alert-after", "0s"),
     '--alert-after must be a duration greater than zero such as 2h, got "0s"'),
    (("--on", "failed"), "Missing option '--webhook'."),
])
def test_bad_input_gets_one_line_exit_2_and_writes_nothing(cli: Cli, args: tuple[str, ...], message: str) -> None:
    cli.ok("notify", "add", "ops", "--webhook", "https://h.example.com/x")
    before = cli.state()
    for name in ("ops", "new"):
        result = cli.run("notify", "add", name, *args)
        assert (result.exit_code, result.stderr, result.stdout) == (2, f"error: {message}\n", "")
    assert cli.state() == before


@pytest.mark.parametrize("args", [("add", "Bad Name", "--webhook", "https://h.example.com"), ("remove", "a b"),
                                  ("log", "X")])
def test_a_bad_name_is_bad_input(cli: Cli, args: tuple[str, ...]) -> None:
    result = cli.run("notify", *args)
    assert result.exit_code == 2
    assert re.fullmatch(rf'error: notification name must be a label \({re.escape(LABEL)}\), got ".*"\n',
                        result.stderr)


def test_log_limit_is_checked(cli: Cli) -> None:
    result = cli.run("notify", "log", "--limit", "0")
    assert (result.exit_code, result.stderr) == (2, "error: --limit must be a positive integer, got '0'\n")
