"""How much history a deployment keeps in Redis, from its environment: the default history window of a loop
(``LOOPSQ_KEEP_RUNS``), of a workflow's runs of their own (``LOOPSQ_KEEP_WORKFLOW_RUNS``), and how long a mirror's
consumer group may stay silent before it stops holding the change stream back (``LOOPSQ_MIRROR_IDLE``).

A bad value is bad input (``ValidationError``, exit 2) naming the variable and quoting the value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from loopsq.domain.durations import duration_setting
from loopsq.errors import ValidationError

KEEP_RUNS_ENV = "LOOPSQ_KEEP_RUNS"
KEEP_WORKFLOW_RUNS_ENV = "LOOPSQ_KEEP_WORKFLOW_RUNS"
MIRROR_IDLE_ENV = "LOOPSQ_MIRROR_IDLE"

DEFAULT_KEEP_RUNS = 100
DEFAULT_KEEP_WORKFLOW_RUNS = 100
DEFAULT_MIRROR_IDLE_MS = 24 * 3600 * 1000


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _positive(name: str, default: int, env: Mapping[str, str] | None) -> int:
    text = _env(env).get(name)
    if text is None or text == "":
        return default
    stripped = text.strip()
    if not stripped.isdigit() or int(stripped) <= 0:
        raise ValidationError(f"{name} must be a positive integer, got '{text}'")
    return int(stripped)


def keep_runs(env: Mapping[str, str] | None = None) -> int:
    """The history window of a loop without its own ``keepRuns``: ``LOOPSQ_KEEP_RUNS``, default 100."""
    return _positive(KEEP_RUNS_ENV, DEFAULT_KEEP_RUNS, env)


def keep_workflow_runs(env: Mapping[str, str] | None = None) -> int:
    """The window of a workflow's runs of their own: ``LOOPSQ_KEEP_WORKFLOW_RUNS``, default 100."""
    return _positive(KEEP_WORKFLOW_RUNS_ENV, DEFAULT_KEEP_WORKFLOW_RUNS, env)


def mirror_idle_ms(env: Mapping[str, str] | None = None) -> int:
    """``LOOPSQ_MIRROR_IDLE`` (a duration such as ``24h``) in ms, default 24 h."""
    return duration_setting(_env(env), MIRROR_IDLE_ENV, DEFAULT_MIRROR_IDLE_MS, "24h")
