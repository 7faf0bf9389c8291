"""Worker labels and run requirements: what a run needs of the worker that executes it, and the RQ queue that
routes it there.

A worker carries labels (automatic ``provider:<name>`` for each agent CLI on its targets' PATH and
``host:<name>``; declared ones such as ``gpu`` or ``repo:web``). A loop, a workflow or a workflow step may
``require`` labels: all of them must be on the worker. An agent target requires ``provider:<its provider>``
unless its ``requires`` names a ``provider:`` label itself (``provider:any`` lifts it).

A requirement set (sorted, without duplicates) names one RQ queue: ``loopsq`` for the empty set (every worker
listens there), ``loopsq+<label>+<label>…`` otherwise (``+`` is not a label character, so names never collide). A
worker listens on every queue whose requirement set its labels satisfy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from loopsq.domain.text import quoted
from loopsq.errors import ValidationError

#: A label, as workers declare and loops require them.
LABEL_PATTERN = r"[a-z0-9][a-z0-9._:/-]{0,63}"
_LABEL = re.compile(LABEL_PATTERN)
#: How many labels one requirement set (or one worker) may carry.
MAX_LABELS = 32
#: The queue of runs that require nothing.
BASE_QUEUE = "loopsq"
QUEUE_SEPARATOR = "+"
PROVIDER_PREFIX = "provider:"
HOST_PREFIX = "host:"
#: ``requires: [provider:any]`` lifts an agent target's implied provider requirement.
ANY_PROVIDER = "provider:any"


def check_label(value: Any, field: str) -> str:
    """``value`` if it is a label; else ``ValidationError`` naming ``field`` and the value."""
    if not isinstance(value, str) or not _LABEL.fullmatch(value):
        raise ValidationError(f"{field} must be a label ({LABEL_PATTERN}), got {quoted(value)}")
    return value


def check_labels(values: Any, field: str) -> list[str]:
    """A list of labels, sorted and without duplicates; ``ValidationError`` naming ``field`` otherwise."""
    if values is None:
        return []
    if isinstance(values, str | Mapping) or not isinstance(values, Iterable):
        raise ValidationError(f"{field} must be a list of labels, got {quoted(values)}")
    items = list(values)
    if len(items) > MAX_LABELS:
        raise ValidationError(f"{field} must have at most {MAX_LABELS} labels, got {len(items)}")
    return sorted({check_label(item, field) for item in items})


def provider_label(provider: str) -> str:
    """The label a worker carries when ``provider``'s CLI is on its targets' PATH."""
    return f"{PROVIDER_PREFIX}{provider}"


def host_label(host: str) -> str:
    """The label every worker carries for its host (lower-cased, cut to a label's length; other characters
    become ``-``)."""
    text = re.sub(r"[^a-z0-9._:/-]", "-", host.lower()) or "unknown"
    if not text[0].isalnum():
        text = "h" + text
    return (HOST_PREFIX + text)[:64]


def requirement_set(target: Mapping[str, Any] | None, requires: Iterable[str] | None) -> tuple[str, ...]:
    """What a run of ``target`` needs of its worker: ``requires`` plus ``provider:<p>`` for an agent target,
    unless ``requires`` names a provider (``provider:any``: none). Sorted, without duplicates."""
    labels = set(requires or ())
    names_provider = any(label.startswith(PROVIDER_PREFIX) for label in labels)
    if target is not None and target.get("type") == "agent" and not names_provider and target.get("provider"):
        labels.add(provider_label(str(target["provider"])))
    labels.discard(ANY_PROVIDER)
    return tuple(sorted(labels))


def queue_name(requirements: Iterable[str], base: str = BASE_QUEUE) -> str:
    """The RQ queue of runs with these requirements (``base``, the namespace's base queue, for none)."""
    labels = sorted(set(requirements))
    return QUEUE_SEPARATOR.join((base, *labels)) if labels else base


def queue_base(name: str) -> str:
    """The base queue (the namespace) a queue name of loopsq's starts with: ``a`` of ``a+gpu``."""
    return name.partition(QUEUE_SEPARATOR)[0]


def queue_requirements(name: str, base: str = BASE_QUEUE) -> tuple[str, ...] | None:
    """The requirement set a queue name stands for; None when ``name`` is not one of the queues under ``base``."""
    if name == base:
        return ()
    head, sep, rest = name.partition(QUEUE_SEPARATOR)
    if head != base or not sep:
        return None
    labels = tuple(rest.split(QUEUE_SEPARATOR))
    return labels if all(_LABEL.fullmatch(label) for label in labels) else None


def satisfies(labels: Iterable[str], requirements: Iterable[str]) -> bool:
    """Whether a worker with ``labels`` may run what needs ``requirements``."""
    return set(requirements) <= set(labels)


def missing(labels: Iterable[str], requirements: Iterable[str]) -> list[str]:
    """The requirements a worker with ``labels`` lacks, sorted."""
    return sorted(set(requirements) - set(labels))
