"""One mirror follower per data dir: ``<data-dir>/mirror.lock``, held with ``flock`` by the process that follows.

A data dir's follower reads the change stream through a consumer group of its own. Two followers of one data dir
(``loopsq mirror`` beside a ``loopsq web`` that follows, or two ``loopsq mirror``) would join that group under one
consumer name and split the stream between them, each applying only the part it received. So a follower takes
this lock first and one that cannot does not follow. The kernel drops the lock when its holder dies, however it
dies (kill -9 included), so a stale file never blocks the next follower. The file holds the holder's pid and what
it is (``1234 loopsq web``), for the message of the one refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path

from loopsq.system import config

MIRROR_ROLE = "loopsq mirror"
WEB_ROLE = "loopsq web"


@dataclass(frozen=True)
class Holder:
    """The process that follows a data dir, as its lock file says (``pid`` None when it says nothing yet)."""

    pid: int | None
    role: str

    def __str__(self) -> str:
        return f"pid {self.pid if self.pid is not None else 'unknown'}, {self.role or 'unknown'}"


def following(data_dir: Path, holder: Holder) -> str:
    """Who follows ``data_dir``, in words: ``another mirror follows <dir> (pid 1234, loopsq web)``."""
    return f"another mirror follows {data_dir} ({holder})"


def busy_message(data_dir: Path, holder: Holder) -> str:
    """The one line a refused follower gives: who follows, and the ways out."""
    out = " or restart it with --no-mirror" if holder.role == WEB_ROLE else ""
    return f"{following(data_dir, holder)}; stop it{out}, or use another --data-dir"


class FollowerLock:
    """``<data-dir>/mirror.lock`` for one process (``role``: ``loopsq mirror``, ``loopsq web``)."""

    def __init__(self, data_dir: Path, role: str) -> None:
        self.data_dir = data_dir
        self.role = role
        self.path = data_dir / config.MIRROR_LOCK_FILENAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self, wait_s: float = 0.5) -> Holder | None:
        """Take the lock: None when taken (idempotent), else the process that holds it.

        It retries for ``wait_s``: ``probe`` (``loopsq up``'s check) holds the lock for an instant, and a new holder
        writes its pid an instant after taking it.

        Raises:
            OSError: when the data dir or the lock file cannot be created or opened.
        """
        if self._fd is not None:
            return None
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    holder = _read_holder(fd)
                    os.close(fd)
                    return holder
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.role}\n".encode(), 0)
        self._fd = fd
        return None

    def release(self) -> None:
        """Give the lock up (closing the descriptor releases the flock)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def probe(data_dir: Path) -> Holder | None:
    """The process that follows ``data_dir`` now, or None (the lock is taken and given back at once)."""
    path = data_dir / config.MIRROR_LOCK_FILENAME
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return _read_holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_holder(fd: int) -> Holder:
    text = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    pid, _, role = text.partition(" ")
    return Holder(int(pid) if pid.isdigit() else None, role.strip())
