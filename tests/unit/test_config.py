"""Where commands find Redis: the flag, LOOPSQ_REDIS_URL, REDIS_URL, a running ``loopsq up``'s redis.url, and
no default at all; and the data directory."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.domain.redis_url import RedisUrlError
from loopsq.errors import RedisNotConfiguredError, ValidationError
from loopsq.system import config

NOT_CONFIGURED = "no Redis configured: start 'loopsq up' or set LOOPSQ_REDIS_URL"

EMBEDDED = "redis://:secret@127.0.0.1:40001/0"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("LOOPSQ_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOOPSQ_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def up_running(data_dir: Path) -> Iterator[Path]:
    """A data dir as a running ``loopsq up`` leaves it: redis.url written and up.lock held."""
    (data_dir / "redis.url").write_text(EMBEDDED + "\n")
    fd = os.open(data_dir / "up.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield data_dir
    finally:
        os.close(fd)


def test_the_flag_wins_over_every_other_source(monkeypatch: pytest.MonkeyPatch, up_running: Path) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", "redis://loopsq-env:6379/0")
    monkeypatch.setenv("REDIS_URL", "redis://generic-env:6379/0")
    assert config.resolve_redis_url("redis://flag:6379/0", up_running) == "redis://flag:6379/0"


def test_loopsq_redis_url_wins_over_redis_url_and_the_embedded_one(monkeypatch: pytest.MonkeyPatch,
                                                                   up_running: Path) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", "redis://loopsq-env:6379/0")
    monkeypatch.setenv("REDIS_URL", "redis://generic-env:6379/0")
    assert config.resolve_redis_url(None, up_running) == "redis://loopsq-env:6379/0"


def test_redis_url_wins_over_the_embedded_one(monkeypatch: pytest.MonkeyPatch, up_running: Path) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://generic-env:6379/0")
    assert config.resolve_redis_url(None, up_running) == "redis://generic-env:6379/0"


def test_a_running_up_s_redis_url_is_used_when_nothing_is_configured(up_running: Path) -> None:
    assert config.resolve_redis_url(None, up_running) == EMBEDDED


def test_the_data_dir_defaults_to_the_resolved_one_when_not_passed(up_running: Path) -> None:
    assert config.resolve_redis_url() == EMBEDDED


def test_a_redis_url_file_left_by_a_killed_up_is_ignored(data_dir: Path) -> None:
    (data_dir / "redis.url").write_text(EMBEDDED + "\n")
    (data_dir / "up.lock").write_text("12345\n")
    assert config.resolve_redis(None, data_dir) is None
    with pytest.raises(RedisNotConfiguredError) as info:
        config.resolve_redis_url(None, data_dir)
    assert info.value.message == NOT_CONFIGURED
    assert info.value.exit_code == 3


def test_without_any_source_there_is_no_redis_and_no_default(data_dir: Path) -> None:
    assert config.resolve_redis(None, data_dir) is None
    with pytest.raises(RedisNotConfiguredError) as info:
        config.resolve_redis_url(None, data_dir)
    assert info.value.message == NOT_CONFIGURED
    assert not hasattr(config, "DEFAULT_REDIS_URL")


def test_an_empty_redis_url_file_counts_as_absent(up_running: Path) -> None:
    (up_running / "redis.url").write_text("\n")
    assert config.resolve_redis(None, up_running) is None


def test_empty_environment_variables_count_as_unset(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_URL", "")
    monkeypatch.setenv("REDIS_URL", "redis://generic-env:6379/0")
    assert config.resolve_redis_url(None, data_dir) == "redis://generic-env:6379/0"
    monkeypatch.setenv("REDIS_URL", "")
    assert config.resolve_redis(None, data_dir) is None


def test_an_empty_flag_is_an_error_not_unset(data_dir: Path) -> None:
    with pytest.raises(RedisUrlError) as info:
        config.resolve_redis("", data_dir)
    assert info.value.message == "invalid Redis URL '' (from --redis-url): it is empty"
    assert info.value.exit_code == 2


def test_a_bad_url_names_its_source_with_the_password_masked(monkeypatch: pytest.MonkeyPatch,
                                                             up_running: Path) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:hunter22@127.0.0.1:/0")
    with pytest.raises(RedisUrlError) as info:
        config.resolve_redis(None, up_running)
    assert info.value.message == ("invalid Redis URL 'redis://:***@127.0.0.1:/0' (from REDIS_URL): "
                                  "the port is empty in '127.0.0.1:'")


def test_the_embedded_url_is_named_by_its_file(up_running: Path) -> None:
    setting = config.resolve_redis(None, up_running)
    assert setting is not None
    assert (setting.source, setting.masked) == (str(up_running / "redis.url"), "redis://:***@127.0.0.1:40001/0")


def test_the_cert_reqs_setting_applies_to_tls_urls_without_their_own(monkeypatch: pytest.MonkeyPatch,
                                                                     data_dir: Path) -> None:
    monkeypatch.setenv("LOOPSQ_REDIS_SSL_CERT_REQS", "none")
    monkeypatch.setenv("REDIS_URL", "rediss://:pw@redis.example:6380")
    setting = config.resolve_redis(None, data_dir)
    assert setting is not None and setting.target.options == {"ssl_cert_reqs": "none"}
    own = config.resolve_redis("rediss://:pw@redis.example:6380?ssl_cert_reqs=required", data_dir)
    assert own is not None and own.target.options == {"ssl_cert_reqs": "required"}
    plain = config.resolve_redis("redis://redis.example:6379", data_dir)
    assert plain is not None and plain.target.options == {}
    monkeypatch.setenv("LOOPSQ_REDIS_SSL_CERT_REQS", "maybe")
    with pytest.raises(ValidationError) as info:
        config.resolve_redis(None, data_dir)
    assert info.value.message == "LOOPSQ_REDIS_SSL_CERT_REQS must be one of none, optional, required, got 'maybe'"


def test_probing_the_lock_does_not_keep_it(data_dir: Path) -> None:
    (data_dir / "up.lock").write_text("")
    assert not config.up_is_running(data_dir)
    fd = os.open(data_dir / "up.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise if the probe had kept a shared lock
    finally:
        os.close(fd)


def test_configured_redis_url_ignores_the_embedded_one(up_running: Path) -> None:
    assert config.configured_redis_url(None) is None


def test_the_data_dir_comes_from_the_flag_then_the_environment_then_home(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    assert config.resolve_data_dir("~/x") == Path.home() / "x"
    assert config.resolve_data_dir() == tmp_path / "data"
    monkeypatch.delenv("LOOPSQ_DATA_DIR")
    assert config.resolve_data_dir() == Path.home() / ".loopsq"
