"""Where commands find Redis: the flag, LOOPSQ_REDIS_URL, REDIS_URL, a running ``loopsq up``'s redis.url, the
default; and the data directory."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from loopsq.system import config

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
    assert config.resolve_redis_url(None, data_dir) == config.DEFAULT_REDIS_URL


def test_without_any_source_the_local_default_is_used(data_dir: Path) -> None:
    assert config.resolve_redis_url(None, data_dir) == "redis://127.0.0.1:6379/0"


def test_an_empty_redis_url_file_counts_as_absent(up_running: Path) -> None:
    (up_running / "redis.url").write_text("\n")
    assert config.resolve_redis_url(None, up_running) == config.DEFAULT_REDIS_URL


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
