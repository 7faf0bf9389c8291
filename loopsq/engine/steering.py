"""The control file of one run: a fresh path in the process's private directory, handed to the target as
``$LOOPS_CONTROL_FILE``, read once the target has ended, and removed.

Reading never fails the run: an unreadable or malformed file becomes the run's ``controlWarning``
(``domain.control.parse_control``), and nothing of it applies.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from loopsq.domain.control import MAX_CONTROL_BYTES, Control, parse_control
from loopsq.domain.usage import parse_usage
from loopsq.executor import ExecutorResult, RunMetadata, execute_target

log = logging.getLogger(__name__)

FILE_NAME = "control.json"


_private_dir: str | None = None
_dir_lock = threading.Lock()


def _directory() -> str:
    """This process's private directory (mode 0700) for control files, made once: a directory per run would cost
    a mkdtemp and an rmtree on every run's hot path."""
    global _private_dir
    with _dir_lock:
        if _private_dir is None or not os.path.isdir(_private_dir):
            _private_dir = tempfile.mkdtemp(prefix=f"loopsq-control-{os.getpid()}-")
        return _private_dir


@dataclass
class ControlFile:
    """A run's control file: ``path`` for the target, ``read()`` afterwards, ``remove()`` at the end."""

    path: str

    @classmethod
    def create(cls, run_id: str) -> ControlFile:
        """A fresh path in this process's private directory; the file itself is the target's to create."""
        return cls(path=os.path.join(_directory(), f"{run_id[:32]}-{secrets.token_hex(6)}.json"))

    def read(self) -> Control:
        """What the target wrote (an empty ``Control`` when it wrote nothing)."""
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(MAX_CONTROL_BYTES + 1)
        except FileNotFoundError:
            return Control()
        except OSError as exc:
            return Control(warning=f"control file ignored: cannot read it ({exc.strerror or exc})")
        if len(data) > MAX_CONTROL_BYTES:
            return parse_control(None, truncated=True)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return Control(warning="control file ignored: not UTF-8")
        return parse_control(text)

    def remove(self) -> None:
        """Remove the file (a directory the target made there instead, too)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(self.path, ignore_errors=True)
        except OSError as exc:
            log.warning("cannot remove control file %s: %s", self.path, exc)


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
