"""What a deployment's namespace may be (``LOOPSQ_NAMESPACE``, ``--namespace``): the prefix of every key loopsq
writes and the name of its RQ queues (``state.keys.Keys``)."""

from __future__ import annotations

import re

from loopsq.domain.text import quoted
from loopsq.errors import ValidationError

#: The namespace of a deployment that chooses none: today's key names (``loopsq:...``) and RQ queue (``loopsq``).
DEFAULT_NAMESPACE = "loopsq"
#: What a namespace may be: 1 to 32 ASCII letters, digits, ``_`` and ``-``, starting with a letter or a digit. No
#: ``:`` (the key separator), no ``+`` (which joins a queue's labels), no glob character (doctor SCANs ``<ns>:*``).
NAMESPACE_PATTERN = "[A-Za-z0-9][A-Za-z0-9_-]{0,31}"
_NAMESPACE_RE = re.compile(NAMESPACE_PATTERN)
#: Namespaces that would spell another program's keys: RQ's and rq-scheduler's all start with ``rq:``.
RESERVED_NAMESPACES = frozenset({"rq"})


def check_namespace(value: str, source: str) -> str:
    """``value`` if it may be a namespace; else ``ValidationError`` naming ``source`` (``--namespace``,
    ``LOOPSQ_NAMESPACE``) and the value.

    Example: ``check_namespace("team-a", "--namespace") == "team-a"``.
    """
    if not _NAMESPACE_RE.fullmatch(value) or value.lower() in RESERVED_NAMESPACES:
        raise ValidationError(f"{source} must be 1-32 letters, digits, '_' or '-' starting with a letter or a "
                              f"digit, and not 'rq' ({NAMESPACE_PATTERN}), got {quoted(value)}")
    return value
