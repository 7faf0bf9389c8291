"""The control file of one run: a fresh path in the process's private directory, handed to the target as
``$LOOPS_CONTROL_FILE``, read once the target has ended, and removed.

Reading never fails the run and never waits on the target: only a regular file is read (opened with
``O_NONBLOCK | O_NOFOLLOW``, checked with ``fstat``, at most ``MAX_CONTROL_BYTES`` + 1 bytes within
``READ_SECONDS``). Anything else the target left at the path (a FIFO, whose ``open()`` would block until a writer
came; a symlink; a directory; a socket; a device), an unreadable file or a malformed one becomes the run's
``controlWarning`` (``control file ignored: …``, ``domain.control``), and nothing of it applies. Removal never
follows a symlink either.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import secrets
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from loopsq.domain.control import MAX_CONTROL_BYTES, Control, ignored, parse_control
from loopsq.domain.usage import parse_usage
from loopsq.executor import ExecutorResult, RunMetadata, execute_target

log = logging.getLogger(__name__)

FILE_NAME = "control.json"
#: How the control file is opened: never blocking (a FIFO's open would wait for a writer), never through a symlink,
#: never becoming a controlling terminal, not inherited by the next target.
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
#: How long reading the file may take (it is a regular file by then, so only a stalled filesystem gets near this).
READ_SECONDS = 2.0
_CHUNK = 16_384
_clock = time.monotonic  # patchable
_KINDS = ((stat.S_ISFIFO, "fifo"), (stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "directory"),
          (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"))


_private_dir: str | None = None
_dir_lock = threading.Lock()


def _is_private_dir(path: str) -> bool:
    """True when ``path`` is still our own directory (not a symlink a target put in its place, not another's)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o700


def _directory() -> str:
    """This process's private directory (mode 0700) for control files, made once: a directory per run would cost
    a mkdtemp and an rmtree on every run's hot path. It goes when the process exits (``_remove_directory``)."""
    global _private_dir
    with _dir_lock:
        if _private_dir is None or not _is_private_dir(_private_dir):
            _private_dir = tempfile.mkdtemp(prefix=f"loopsq-control-{os.getpid()}-")
            atexit.register(_remove_directory, _private_dir, os.getpid())
        return _private_dir


def _remove_directory(path: str, owner_pid: int) -> None:
    """Remove a private directory at exit: only in the process that made it (a forked child inherits the hook),
    and only while it is still ours."""
    if os.getpid() == owner_pid and _is_private_dir(path):
        shutil.rmtree(path, ignore_errors=True)


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in the words of a warning (``fifo``, ``symlink``, ``directory``…)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "regular file" if stat.S_ISREG(mode) else f"unknown file type {stat.S_IFMT(mode):o}"


def not_regular(mode: int) -> Control:
    """The warning for a control path that is not a regular file: ``not a regular file (fifo)``."""
    return ignored(f"not a regular file ({file_kind(mode)})")


def _read_bounded(fd: int, limit: int, deadline: float) -> bytes | None:
    """Up to ``limit`` bytes of ``fd``; None when the deadline passed first."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        if _clock() > deadline:
            return None
        chunk = os.read(fd, min(_CHUNK, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


@dataclass
class ControlFile:
    """A run's control file: ``path`` for the target, ``read()`` afterwards, ``remove()`` at the end."""

    path: str

    @classmethod
    def create(cls, run_id: str) -> ControlFile:
        """A fresh path in this process's private directory; the file itself is the target's to create."""
        return cls(path=os.path.join(_directory(), f"{run_id[:32]}-{secrets.token_hex(6)}.json"))

    def read(self) -> Control:
        """What the target wrote (an empty ``Control`` when it wrote nothing). Never raises, never blocks."""
        try:
            return self._read()
        except Exception as exc:  # the run's record matters more than any reason here
            log.exception("control file %s: unexpected error reading it", self.path)
            return ignored(f"cannot read it ({exc.__class__.__name__}: {exc})")

    def _read(self) -> Control:
        try:
            # lstat first: a FIFO, socket or device is never even opened (opening a device can act on it).
            seen = os.lstat(self.path)
        except FileNotFoundError:
            return Control()
        except OSError as exc:
            return ignored(f"cannot read it ({exc.strerror or exc})")
        if not stat.S_ISREG(seen.st_mode):
            return not_regular(seen.st_mode)
        try:
            fd = os.open(self.path, OPEN_FLAGS)
        except FileNotFoundError:
            return Control()
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # made a symlink after the lstat
                return not_regular(stat.S_IFLNK)
            return ignored(f"cannot read it ({exc.strerror or exc})")
        try:
            info = os.fstat(fd)  # what was opened, whatever the path holds by now
            if not stat.S_ISREG(info.st_mode):
                return not_regular(info.st_mode)
            data = _read_bounded(fd, MAX_CONTROL_BYTES + 1, _clock() + READ_SECONDS)
        except OSError as exc:
            return ignored(f"cannot read it ({exc.strerror or exc})")
        finally:
            os.close(fd)
        if data is None:
            return ignored(f"not read within {READ_SECONDS:g} s")
        if len(data) > MAX_CONTROL_BYTES:
            return parse_control(None, truncated=True)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return ignored("not UTF-8")
        return parse_control(text)

    def remove(self) -> None:
        """Remove whatever the target left at the path: a directory with its contents (``rmtree`` works on
        descriptors and never follows a symlink inside it), anything else unlinked (a symlink itself, never its
        target). Never raises."""
        try:
            info = os.lstat(self.path)
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(self.path, ignore_errors=True)
            else:
                os.unlink(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot remove control file %s: %s", self.path, exc)
            return
        if os.path.lexists(self.path):
            log.warning("cannot remove control file %s: something is left there", self.path)


def run_fields(control: Control) -> dict[str, object]:
    """The run fields a control sets: ``outcome``, ``control`` and ``control_warning`` (None ones included, so a
    re-used row is cleared)."""
    return {"outcome": control.outcome, "control": control.to_dict(), "control_warning": control.warning}


def execute_with_control(target: Mapping[str, Any], metadata: RunMetadata,
                         **kwargs: Any) -> tuple[ExecutorResult, dict[str, object]]:
    """``execute_target`` with a fresh control file named in ``$LOOPS_CONTROL_FILE``; returns the result and the
    run fields the file sets (``run_fields``)."""
    control_file = ControlFile.create(metadata.run_id or "run")
    try:
        result = execute_target(target, replace(metadata, control_file=control_file.path), **kwargs)
        control = control_file.read()
    finally:
        control_file.remove()
    if control.warning:
        log.warning("run %s: %s", metadata.run_id, control.warning)
    fields = run_fields(control)
    if target.get("type") == "agent":
        usage = parse_usage(str(target.get("provider")), result.stdout)
        if usage is not None:
            fields.update(usage.to_fields())
    return result, fields
