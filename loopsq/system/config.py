"""Where loopsq finds Redis and its data directory: flags, environment, a running ``loopsq up``, defaults."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
MIRROR_FILENAME = "loops.db"
#: Written by ``loopsq up`` (mode 0600) while its embedded Redis runs: the URL, password included.
REDIS_URL_FILENAME = "redis.url"
#: Held (``flock``) by a running ``loopsq up`` for as long as it runs; holds its pid.
UP_LOCK_FILENAME = "up.lock"


def configured_redis_url(flag: str | None = None) -> str | None:
    """``--redis-url``, else ``LOOPSQ_REDIS_URL``, else ``REDIS_URL``; None when none is set."""
    for value in (flag, os.environ.get("LOOPSQ_REDIS_URL"), os.environ.get("REDIS_URL")):
        if value:
            return value
    return None


def resolve_redis_url(flag: str | None = None, data_dir: Path | None = None) -> str:
    """The Redis URL a command uses.

    ``--redis-url``, else ``LOOPSQ_REDIS_URL``, else ``REDIS_URL``, else the embedded Redis of a ``loopsq up``
    running on ``data_dir`` (``<data-dir>/redis.url``; ``data_dir`` defaults to ``resolve_data_dir()``), else
    the local default.
    """
    configured = configured_redis_url(flag)
    if configured:
        return configured
    return embedded_redis_url(data_dir if data_dir is not None else resolve_data_dir()) or DEFAULT_REDIS_URL


def embedded_redis_url(data_dir: Path) -> str | None:
    """The URL in ``<data-dir>/redis.url`` while a ``loopsq up`` runs there; None otherwise.

    A file left behind by an ``up`` that was killed is ignored: the URL counts only while ``up.lock`` is held.
    """
    try:
        url = (data_dir / REDIS_URL_FILENAME).read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not url or not up_is_running(data_dir):
        return None
    return url


def up_is_running(data_dir: Path) -> bool:
    """Whether a ``loopsq up`` holds the lock of ``data_dir`` (a shared, non-blocking probe of ``up.lock``)."""
    try:
        fd = os.open(data_dir / UP_LOCK_FILENAME, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def resolve_data_dir(flag: str | None = None) -> Path:
    """``--data-dir``, else ``LOOPSQ_DATA_DIR``, else ``~/.loopsq``. Not created here."""
    value = flag or os.environ.get("LOOPSQ_DATA_DIR") or "~/.loopsq"
    return Path(value).expanduser().absolute()


def mirror_path(data_dir: Path) -> Path:
    """The SQLite query mirror inside ``data_dir``."""
    return data_dir / MIRROR_FILENAME
