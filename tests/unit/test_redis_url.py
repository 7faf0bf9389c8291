"""Redis URLs: every accepted form parses, every malformed one is refused by name, every password is masked; and
with no Redis configured every command, the SDK and ``install`` refuse without connecting anywhere."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.domain.redis_url import RedisUrl, RedisUrlError, mask_in, mask_url, parse_redis_url
from loopsq.errors import RedisNotConfiguredError
from loopsq.state.connection import client_for, unavailable

NOT_CONFIGURED = "error: no Redis configured: start 'loopsq up' or set LOOPSQ_REDIS_URL\n"

# -- masking ------------------------------------------------------------------------------------------------------

MASKED = [
    ("redis://:hunter22@db.example:6379/0", "redis://:***@db.example:6379/0"),
    ("redis://alice:hunter22@db.example:6379/0", "redis://alice:***@db.example:6379/0"),
    ("rediss://:hunter22@db.example:6380", "rediss://:***@db.example:6380"),
    ("redis://db.example:6379/0?password=hunter22", "redis://db.example:6379/0?password=***"),
    ("redis://db.example:6379/0?db=1&password=hunter22&socket_timeout=2",
     "redis://db.example:6379/0?db=1&password=***&socket_timeout=2"),
    # The case: a bad port, and the password in the query.
    ("redis://host:p/0?password=hunter22", "redis://host:p/0?password=***"),
    ("redis+sentinel://:hunter22@s1:26379,s2:26380/mymaster/0?sentinel_password=sentinelpw",
     "redis+sentinel://:***@s1:26379,s2:26380/mymaster/0?sentinel_password=***"),
    ("unix://:hunter22@/run/redis.sock?db=2", "unix://:***@/run/redis.sock?db=2"),
    # Unescaped reserved characters in a password can only widen what is masked.
    ("redis://:pa/ss@db.example:6379/0", "redis://:***@db.example:6379/0"),
    ("redis://:pa?ss@db.example:6379/0", "redis://:***@db.example:6379/0"),
    ("redis://:p@ss@db.example:6379/0", "redis://:***@db.example:6379/0"),
    ("redis://hunter22@db.example:6379/0", "redis://***@db.example:6379/0"),
    ("redis://db.example:6379/0", "redis://db.example:6379/0"),
]


@pytest.mark.parametrize(("url", "masked"), MASKED)
def test_every_password_in_every_url_form_is_masked(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_a_library_message_quoting_the_url_or_the_password_is_masked_too() -> None:
    url = "redis://:hunter22@db.example:6379/0?password=other-secret"
    text = f"Error connecting to {url}: bad password hunter22 / other-secret"
    assert mask_in(text, url) == ("Error connecting to redis://:***@db.example:6379/0?password=***: "
                                  "bad password *** / ***")


def test_the_unreachable_error_masks_the_url_and_the_reason() -> None:
    url = "redis+sentinel://:hunter22@s1:26379/mymaster"
    error = unavailable(url, ConnectionError("No master found for 'mymaster' (auth hunter22)"))
    assert error.message == ("cannot reach Redis at redis+sentinel://:***@s1:26379/mymaster: "
                             "No master found for 'mymaster' (auth ***)")
    assert error.exit_code == 3


def test_a_parsed_url_never_shows_its_password_in_its_repr() -> None:
    parsed = parse_redis_url("redis+sentinel://:hunter22@s1/m?sentinel_password=sentinelpw")
    assert repr(parsed) == "RedisUrl('redis+sentinel://:***@s1/m?sentinel_password=***')"


# -- parsing ------------------------------------------------------------------------------------------------------


def test_the_sentinel_form_gives_hosts_service_db_and_options() -> None:
    parsed = parse_redis_url("redis+sentinel://app:pw@10.0.0.1:26379,10.0.0.2,[::1]:26381/mymaster/3"
                             "?sentinel_password=spw&min_other_sentinels=1&socket_timeout=0.5")
    assert parsed == RedisUrl(
        parsed.url, "redis+sentinel", hosts=(("10.0.0.1", 26379), ("10.0.0.2", 26379), ("::1", 26381)),
        service_name="mymaster", db=3, username="app", password="pw",
        options={"sentinel_password": "spw", "min_other_sentinels": 1, "socket_timeout": 0.5})


@pytest.mark.parametrize(("url", "host", "port", "db"), [
    ("redis://db.example", "db.example", 6379, 0),
    ("redis://db.example:6380/", "db.example", 6380, 0),
    ("redis://db.example:6380/7", "db.example", 6380, 7),
    ("redis://db.example:6380/7?db=2", "db.example", 6380, 2),
    ("rediss://:p%40ss@db.example:6380", "db.example", 6380, 0),
    ("redis://[::1]:6381/1", "::1", 6381, 1),
])
def test_plain_and_tls_forms_parse_with_redis_py_s_defaults(url: str, host: str, port: int, db: int) -> None:
    parsed = parse_redis_url(url)
    assert (parsed.hosts, parsed.db) == (((host, port),), db)


def test_a_percent_encoded_password_is_decoded() -> None:
    assert parse_redis_url("rediss://:p%40ss@db.example:6380").password == "p@ss"


BAD = [
    ("", "it is empty"),
    ("redis://127.0.0.1:/0", "the port is empty in '127.0.0.1:'"),
    ("redis://:6379/0", "the host is empty in ':6379'"),
    ("redis:///0", "the host is empty"),
    ("redis://db.example:0/0", "the port '0' is not a TCP port (1-65535)"),
    ("redis://db.example:65536/0", "the port '65536' is not a TCP port (1-65535)"),
    ("redis://:hunter22@db.example:p/0?password=x2", "the port 'p' is not a TCP port (1-65535)"),
    ("redis://db.example:6379/zero", "the database 'zero' is not a whole number >= 0"),
    ("redis://db.example:6379/0/1", "unexpected path '/0/1' (only /db)"),
    ("http://db.example:6379", "unknown scheme 'http' (use redis://, rediss://, unix:// or redis+sentinel://)"),
    ("db.example:6379", "not a URL (use redis://, rediss://, unix:// or redis+sentinel://)"),
    (" redis://db.example:6379", "it contains spaces or control characters"),
    ("redis://db.example:6379/0#x", "a fragment ('#…') is not allowed"),
    ("redis://hunter22@db.example:6379", "a user without a password (use user:password@ or :password@)"),
    ("redis://db.example:6379/0?timeout=1", "unknown option 'timeout'; known: client_name, db, "
     "health_check_interval, password, socket_connect_timeout, socket_timeout, username"),
    ("redis://db.example:6379/0?ssl_cert_reqs=none", "unknown option 'ssl_cert_reqs' (only for rediss://); known: "
     "client_name, db, health_check_interval, password, socket_connect_timeout, socket_timeout, username"),
    ("rediss://db.example:6379/0?ssl_cert_reqs=sometimes",
     "the option ssl_cert_reqs='sometimes' must be one of none, optional, required"),
    ("redis://db.example:6379/0?socket_timeout=-1", "the option socket_timeout='-1' must be a number of seconds > 0"),
    ("redis://db.example:6379/0?db=1&db=2", "the option 'db' is given twice"),
    ("redis://db.example:6379/0?password", "the query 'password' is malformed (name=value&…)"),
    ("redis+sentinel://s1:26379", "the service name is missing "
     "(redis+sentinel://host:port[,host:port…]/service_name[/db])"),
    ("redis+sentinel://s1:26379,/mymaster", "the host is empty"),
    ("redis+sentinel://s1:,s2:26379/mymaster", "the port is empty in 's1:'"),
    ("redis+sentinel://s1/mymaster/x", "the database 'x' is not a whole number >= 0"),
    ("redis+sentinel://s1/mymaster?min_other_sentinels=many",
     "the option min_other_sentinels='many' must be a whole number >= 0"),
    ("unix://db.example/run/redis.sock",
     "a unix:// URL takes a socket path, not a host ('db.example'): unix:///path/to/redis.sock"),
    ("unix://", "the socket path is empty"),
    ("redis://[::1/0", "the host '[::1' is not a valid IPv6 address in brackets"),
    ("redis://::1:6379/0", "the host '::1:6379' has more than one ':' (an IPv6 address goes in brackets)"),
]


@pytest.mark.parametrize(("url", "reason"), BAD)
def test_a_malformed_url_is_one_line_naming_the_masked_value_and_the_source(url: str, reason: str) -> None:
    with pytest.raises(RedisUrlError) as info:
        parse_redis_url(url, "LOOPSQ_REDIS_URL")
    assert info.value.message == f"invalid Redis URL '{mask_url(url)}' (from LOOPSQ_REDIS_URL): {reason}"
    assert "hunter22" not in info.value.message and "x2" not in info.value.message.split("password=")[-1]
    assert info.value.exit_code == 2


def test_a_bad_password_option_value_is_not_quoted() -> None:
    with pytest.raises(RedisUrlError) as info:
        parse_redis_url("redis://db.example/0?password=hunter22&password=again")
    assert "hunter22" not in info.value.message


NEVER_PRINTED = [
    # A password holding an unescaped '?': what follows it looked like the query, and was quoted.
    ("redis://:secretPW?123@db.example:6379/0",
     "invalid Redis URL 'redis://:***@db.example:6379/0': an '@' after a '?' or '#': percent-encode '?', '#', '/' "
     "and '@' in a password (%3F, %23, %2F, %40)"),
    ("redis://:sec#retPW123@db.example:6379/0",
     "invalid Redis URL 'redis://:***@db.example:6379/0': an '@' after a '?' or '#': percent-encode '?', '#', '/' "
     "and '@' in a password (%3F, %23, %2F, %40)"),
    # A misspelt password option: its value is masked like a password's.
    ("redis://db.example:6379/0?pasword=secretPW123",
     "invalid Redis URL 'redis://db.example:6379/0?pasword=***': unknown option 'pasword'; known: client_name, db, "
     "health_check_interval, password, socket_connect_timeout, socket_timeout, username"),
    ("redis+sentinel://s1/mymaster?sentinel_passwd=secretPW123",
     "invalid Redis URL 'redis+sentinel://s1/mymaster?sentinel_passwd=***': unknown option 'sentinel_passwd'; "
     "known: client_name, db, health_check_interval, min_other_sentinels, password, sentinel_password, "
     "sentinel_username, socket_connect_timeout, socket_timeout, username"),
]


@pytest.mark.parametrize(("url", "message"), NEVER_PRINTED)
def test_no_part_of_a_password_is_ever_printed(url: str, message: str) -> None:
    with pytest.raises(RedisUrlError) as info:
        parse_redis_url(url)
    assert info.value.message == message
    for part in ("secret", "PW", "123"):
        assert part not in info.value.message


def test_a_password_with_a_question_mark_gets_one_masked_line_from_the_cli(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["--redis-url", "redis://:secretPW?123@db.example:6379/0", "list"],
                                env={"LOOPSQ_DATA_DIR": str(tmp_path)})
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == ("error: invalid Redis URL 'redis://:***@db.example:6379/0' (from --redis-url): an '@' "
                             "after a '?' or '#': percent-encode '?', '#', '/' and '@' in a password (%3F, %23, "
                             "%2F, %40)\n")


def test_tls_options_reach_the_connection() -> None:
    client = client_for("rediss://:pw@db.example:6380/2?ssl_cert_reqs=none&ssl_check_hostname=false")
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class.__name__ == "SSLConnection"
    assert (kwargs["host"], kwargs["port"], kwargs["db"], kwargs["password"]) == ("db.example", 6380, 2, "pw")
    assert (kwargs["ssl_cert_reqs"], kwargs["ssl_check_hostname"]) == ("none", False)


def test_the_cert_reqs_variable_reaches_a_tls_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_SSL_CERT_REQS", "none")
    kwargs = client_for("rediss://:pw@db.example:6380").connection_pool.connection_kwargs
    assert kwargs["ssl_cert_reqs"] == "none"
    assert "ssl_cert_reqs" not in client_for("redis://db.example:6379").connection_pool.connection_kwargs


def test_a_sentinel_url_gives_a_sentinel_client_with_its_options() -> None:
    client = client_for("redis+sentinel://:pw@s1:26379,s2:26380/mymaster/4?sentinel_password=spw"
                        "&min_other_sentinels=1&socket_timeout=0.7")
    pool = client.connection_pool
    manager = pool.sentinel_manager
    assert (pool.service_name, pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (
        "mymaster", 4, "pw")
    assert pool.connection_kwargs["socket_timeout"] == 0.7
    assert manager.min_other_sentinels == 1
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"],
             s.connection_pool.connection_kwargs["password"]) for s in manager.sentinels] == [
        ("s1", 26379, "spw"), ("s2", 26380, "spw")]


# -- no silent default --------------------------------------------------------------------------------------------


@pytest.fixture
def nothing_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """No flag, no variable, no running ``up``; any socket connection is recorded (and refused)."""
    for name in ("LOOPSQ_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LOOPSQ_API_TOKEN", "a-token-of-sixteen-chars-or-more")
    attempts: list[Any] = []

    def refuse(self: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise ConnectionRefusedError(f"test: no connection allowed ({address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


NEEDS_REDIS = [
    ("list",), ("show", "x"), ("pause", "x"), ("resume", "x"), ("stop", "x"), ("remove", "x"),
    ("create", "command", "n", "--every", "1m", "--cmd", "true"), ("workflows", "list"), ("workflows", "show", "w"),
    ("workflows", "run", "w"), ("workflows", "runs"), ("workflows", "cancel", "r"), ("runs",), ("trigger", "x"),
    ("run-now", "x"), ("tick",), ("doctor",), ("status",), ("mirror", "--once"), ("logs", "r"), ("scheduler",),
    ("worker", "--burst"), ("web", "--port", "1"), ("install", "systemd"), ("install", "launchd"),
]


@pytest.mark.parametrize("args", NEEDS_REDIS, ids=" ".join)
def test_with_nothing_configured_every_command_refuses_without_connecting(nothing_configured: list[Any],
                                                                         args: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (3, "", NOT_CONFIGURED)
    assert nothing_configured == []


def test_a_command_that_needs_no_redis_runs_with_none_configured(nothing_configured: list[Any],
                                                                 tmp_path: Path) -> None:
    spec = tmp_path / "wf.json"
    spec.write_text('{"name": "w", "steps": [{"id": "a", "target": {"type": "command", "command": "true"}}]}')
    result = CliRunner().invoke(cli, ["workflows", "validate", str(spec)], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "valid workflow w steps=1\n", "")
    assert nothing_configured == []


@pytest.mark.parametrize(("env", "flag", "shown"), [
    ({"LOOPSQ_REDIS_URL": "redis://127.0.0.1:/0"}, None,
     "invalid Redis URL 'redis://127.0.0.1:/0' (from LOOPSQ_REDIS_URL): the port is empty in '127.0.0.1:'"),
    ({"REDIS_URL": "redis://:hunter22@host:p/0?password=hunter22"}, None,
     "invalid Redis URL 'redis://:***@host:p/0?password=***' (from REDIS_URL): the port 'p' is not a TCP port "
     "(1-65535)"),
    ({}, "memcached://cache:11211",
     "invalid Redis URL 'memcached://cache:11211' (from --redis-url): unknown scheme 'memcached' (use redis://, "
     "rediss://, unix:// or redis+sentinel://)"),
])
def test_a_malformed_url_gets_one_line_exit_2_and_connects_nowhere(nothing_configured: list[Any],
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   env: dict[str, str], flag: str | None,
                                                                   shown: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = (["--redis-url", flag] if flag else []) + ["list"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (2, "", f"error: {shown}\n")
    assert nothing_configured == []


def test_up_with_a_malformed_url_refuses_before_starting_anything(nothing_configured: list[Any],
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", "redis://:hunter22@db.example:/0")
    result = CliRunner().invoke(cli, ["up", "--no-web"], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", "error: invalid Redis URL 'redis://:***@db.example:/0' (from LOOPSQ_REDIS_URL): the port is empty "
               "in 'db.example:'\n")
    assert not (tmp_path / "data").exists()
    assert nothing_configured == []


def test_the_sdk_refuses_with_nothing_configured_and_validates_a_given_url(nothing_configured: list[Any]) -> None:
    from loopsq.sdk import LoopsClient

    with pytest.raises(RedisNotConfiguredError) as info:
        LoopsClient()
    assert info.value.message == NOT_CONFIGURED.removeprefix("error: ").rstrip("\n")
    with pytest.raises(RedisUrlError) as bad:
        LoopsClient("redis://:hunter22@db.example:/0")
    assert bad.value.message == ("invalid Redis URL 'redis://:***@db.example:/0' (from LoopsClient(redis_url)): "
                                 "the port is empty in 'db.example:'")
    assert nothing_configured == []
