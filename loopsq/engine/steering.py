"""The control file of one run: a private path handed to the target as ``$LOOPS_CONTROL_FILE``, read once the
target has ended, and removed.

Reading never fails the run: an unreadable or malformed file becomes the run's ``controlWarning``
(``domain.control.parse_control``), and nothing of it applies.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from loopsq.domain.control import MAX_CONTROL_BYTES, Control, parse_control
from loopsq.domain.usage import parse_usage
from loopsq.executor import ExecutorResult, RunMetadata, execute_target

log = logging.getLogger(__name__)

FILE_NAME = "control.json"


@dataclass
class ControlFile:
    """A run's control file: ``path`` for the target, ``read()`` afterwards, ``remove()`` at the end."""

    path: str
    _dir: str = field(repr=False, default="")

    @classmethod
    def create(cls, run_id: str) -> ControlFile:
        """A new, empty private directory (mode 0700) for the run's control file; the file itself is the target's
        to create."""
        directory = tempfile.mkdtemp(prefix=f"loopsq-{run_id[:12]}-")
        return cls(path=os.path.join(directory, FILE_NAME), _dir=directory)

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
        """Remove the directory and whatever the target left in it."""
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


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
