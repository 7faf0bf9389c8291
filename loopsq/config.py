"""Where loopsq finds Redis and its data directory: flags, then environment, then defaults."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
MIRROR_FILENAME = "loops.db"


def resolve_redis_url(flag: str | None = None) -> str:
    """``--redis-url``, else ``LOOPSQ_REDIS_URL``, else ``REDIS_URL``, else the local default."""
    for value in (flag, os.environ.get("LOOPSQ_REDIS_URL"), os.environ.get("REDIS_URL")):
        if value:
            return value
    return DEFAULT_REDIS_URL


def resolve_data_dir(flag: str | None = None) -> Path:
    """``--data-dir``, else ``LOOPSQ_DATA_DIR``, else ``~/.loopsq``. Not created here."""
    value = flag or os.environ.get("LOOPSQ_DATA_DIR") or "~/.loopsq"
    return Path(value).expanduser().absolute()


def mirror_path(data_dir: Path) -> Path:
    """The SQLite query mirror inside ``data_dir``."""
    return data_dir / MIRROR_FILENAME
