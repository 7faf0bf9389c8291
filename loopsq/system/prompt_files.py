"""Prompt files (reference 0.3.54): a prompt read from a file once, at creation, and stored as the prompt plus
``promptSource: {"type": "file", "path": <absolute path>}``.

``--prompt-file`` paths resolve against the working directory, a spec's ``promptFile`` against the spec file's
directory. Only a regular file is read, with a bound, so a wrong path (a FIFO, ``/dev/zero``, a huge log) fails
fast with one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from loopsq.domain.user_files import open_regular_file
from loopsq.errors import ValidationError

#: The largest prompt file read (bytes).
PROMPT_FILE_MAX_BYTES = 1_048_576


def _q(value: str) -> str:
    return "'" + value.replace("'", "\\'") + "'"


def read_prompt_file(path: str, label: str, base_dir: str | None = None) -> tuple[str, str]:
    """Read one prompt file: ``(text, absolute path)``.

    Args:
        path: the path as given; a relative one resolves against ``base_dir`` (else the working directory).
        label: the field or flag for messages (``--prompt-file``, ``workflow.steps[0].target.promptFile``).
        base_dir: the directory relative paths resolve against.

    Raises:
        ValidationError: ``<label>: cannot read '<path>': <reason>`` (missing, a directory, unreadable, ``not a
            regular file (a FIFO)``), or the file
            is larger than ``PROMPT_FILE_MAX_BYTES``, not UTF-8 text, or empty.
    """
    if not isinstance(path, str) or not path.strip():
        raise ValidationError(f"{label} must be a non-empty path, got {_q(str(path))}")
    full = os.path.abspath(os.path.join(base_dir, path) if base_dir and not os.path.isabs(path) else path)
    try:
        with open_regular_file(full) as handle:  # a FIFO or a device is refused, never waited on or read
            data = handle.read(PROMPT_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise ValidationError(f"{label}: cannot read {_q(path)}: {exc.strerror or exc}") from exc
    except ValueError as exc:  # an embedded NUL in the path
        raise ValidationError(f"{label}: cannot read {_q(path)}: {exc}") from exc
    if len(data) > PROMPT_FILE_MAX_BYTES:
        raise ValidationError(f"{label}: {_q(path)} is larger than {PROMPT_FILE_MAX_BYTES} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{label}: {_q(path)} is not UTF-8 text (byte {exc.start})") from exc
    if not text.strip():
        raise ValidationError(f"{label}: {_q(path)} is empty")
    return text, full


def resolve_prompt_file(target: Any, label: str, base_dir: str | None = None) -> Any:
    """``target`` with its ``promptFile`` read into ``prompt`` and ``promptSource`` (a copy); anything that is not
    an agent target with a ``promptFile`` is returned as it is.

    Raises:
        ValidationError: as ``read_prompt_file``, or ``<label> takes prompt or promptFile, not both``.
    """
    if not isinstance(target, Mapping) or target.get("type") != "agent" or "promptFile" not in target:
        return target
    out = dict(target)
    path = out.pop("promptFile")
    if out.get("prompt") is not None:
        raise ValidationError(f"{label} takes prompt or promptFile, not both, got promptFile {_q(str(path))}")
    out["prompt"], full = read_prompt_file(path, f"{label}.promptFile", base_dir)
    out["promptSource"] = {"type": "file", "path": full}
    return out


def resolve_spec_prompt_files(spec: Any, base_dir: str) -> Any:
    """A decoded workflow spec with every step's ``promptFile`` read, relative to ``base_dir`` (the spec file's
    directory). Malformed specs are returned as they are, for validation to name the problem."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("steps"), list):
        return spec
    steps = []
    for index, step in enumerate(spec["steps"]):
        if isinstance(step, Mapping) and "target" in step:
            label = f"workflow.steps[{index}].target"
            step = {**step, "target": resolve_prompt_file(step["target"], label, base_dir)}
        steps.append(step)
    return {**spec, "steps": steps}
