"""Where ``loopsq web`` listens: the flags, else ``0.0.0.0:$PORT`` (Heroku-style platforms, honcho, foreman), else
``127.0.0.1:8080``; a taken port or a bad ``PORT`` is one error line with loopsq's exit status, not uvicorn's 3."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from loopsq.cli import cli
from loopsq.cli.web_cmd import listen_address


@pytest.fixture
def web_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSQ_API_TOKEN", "t" * 32)
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LOOPSQ_REDIS_URL", "redis://127.0.0.1:9/0")  # never reached: these fail before
    monkeypatch.delenv("PORT", raising=False)


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("port_env", "flags", "expected"),
    [
        (None, (None, None), ("127.0.0.1", 8080)),
        ("5000", (None, None), ("0.0.0.0", 5000)),
        (" 5000 ", (None, None), ("0.0.0.0", 5000)),
        ("", (None, None), ("127.0.0.1", 8080)),
        ("5000", ("127.0.0.1", None), ("127.0.0.1", 5000)),
        ("5000", (None, 9000), ("127.0.0.1", 9000)),
        (None, ("0.0.0.0", 9000), ("0.0.0.0", 9000)),
    ],
)
def test_web_listens_on_port_from_the_platform_else_on_loopback_8080(
        monkeypatch: pytest.MonkeyPatch, port_env: str | None, flags: tuple[str | None, int | None],
        expected: tuple[str, int]) -> None:
    if port_env is None:
        monkeypatch.delenv("PORT", raising=False)
    else:
        monkeypatch.setenv("PORT", port_env)
    assert listen_address(*flags) == expected


@pytest.mark.parametrize("value", ["abc", "0", "65536", "-1", "80.5"])
def test_a_bad_port_variable_is_one_error_line_with_exit_2(web_env: None, monkeypatch: pytest.MonkeyPatch,
                                                          value: str) -> None:
    monkeypatch.setenv("PORT", value)
    result = CliRunner().invoke(cli, ["web"], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", f"error: PORT must be a TCP port (1-65535), got '{value}'\n")


def test_a_taken_port_is_one_error_line_naming_it_and_the_way_out_with_exit_1(web_env: None, taken: int) -> None:
    result = CliRunner().invoke(cli, ["web", "--port", str(taken)], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (
        1, "", f"error: cannot listen on 127.0.0.1:{taken}: Address already in use; pass --port (or set PORT) "
               "to use another port\n")


def test_a_taken_platform_port_is_reported_on_the_address_it_was_tried(web_env: None, taken: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", str(taken))
    result = CliRunner().invoke(cli, ["web", "--host", "127.0.0.1"], catch_exceptions=False)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot listen on 127.0.0.1:{taken}: Address already in use;")


@pytest.mark.parametrize("value", ["yes", "true", "2"])
def test_a_bad_per_loop_metrics_switch_is_one_error_line_with_exit_2(web_env: None, monkeypatch: pytest.MonkeyPatch,
                                                                     value: str) -> None:
    monkeypatch.setenv("LOOPSQ_METRICS_PER_LOOP", value)
    result = CliRunner().invoke(cli, ["web"], catch_exceptions=False)
    assert (result.exit_code, result.stdout, result.stderr) == (
        2, "", f"error: LOOPSQ_METRICS_PER_LOOP must be 1 or 0, got '{value}'\n")
