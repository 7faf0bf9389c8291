"""A worker's fleet settings from its flags and environment: how many slots (``--concurrency``,
``LOOPSQ_WORKER_CONCURRENCY``) and which declared labels (``--label``, ``LOOPSQ_WORKER_LABELS``).

A flag wins over its variable. Bad values are bad input (``ValidationError``: exit 2, nothing started).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from loopsq.domain.labels import LABEL_PATTERN
from loopsq.domain.text import shown
from loopsq.engine.slots import DEFAULT_CONCURRENCY, MAX_CONCURRENCY
from loopsq.errors import ValidationError

CONCURRENCY_ENV = "LOOPSQ_WORKER_CONCURRENCY"
LABELS_ENV = "LOOPSQ_WORKER_LABELS"


def worker_concurrency(flag: str | None, env: Mapping[str, str]) -> int:
    """The slots a worker holds: ``--concurrency``, else ``LOOPSQ_WORKER_CONCURRENCY``, else the default."""
    name, text = ("--concurrency", flag) if flag is not None else (CONCURRENCY_ENV, env.get(CONCURRENCY_ENV))
    if text is None or (flag is None and not text.strip()):
        return DEFAULT_CONCURRENCY
    value = text.strip()
    if not value.isascii() or not value.isdigit() or not 1 <= int(value) <= MAX_CONCURRENCY:
        raise ValidationError(f"{name} must be a whole number from 1 to {MAX_CONCURRENCY}, got {_q(text)}")
    return int(value)


def worker_declared_labels(flags: Iterable[str], env: Mapping[str, str]) -> list[str]:
    """The labels a worker declares: every ``--label``, else ``LOOPSQ_WORKER_LABELS`` (comma-separated)."""
    given = list(flags)
    if given:
        return sorted({_label(label, "--label") for label in given})
    text = env.get(LABELS_ENV, "")
    return sorted({_label(label.strip(), LABELS_ENV) for label in text.split(",") if label.strip()})


def _label(value: str, name: str) -> str:
    if not re.fullmatch(LABEL_PATTERN, value):
        raise ValidationError(f"{name} must be a label ({LABEL_PATTERN}), got {_q(value)}")
    return value


def _q(value: str) -> str:
    """A flag's value as the CLI's messages quote it (``'value'``, short and escaped)."""
    return "'" + shown(value).replace("'", "\\'") + "'"
