"""Fleet-wide pools: what a pool's name and limit must be (no I/O).

A pool is a named limit shared by every worker (``loopsq pool set claude-acct --limit 3``): at most ``limit`` runs
that name it hold one of its slots at once, fleet-wide. Its name is a label (``labels.LABEL_PATTERN``), its limit a
whole number from 1 to ``limits.MAX_POOL_LIMIT``. The state of a pool (its holders and its fair queue) lives in
``state.pools``.
"""

from __future__ import annotations

from typing import Any

from loopsq.domain.checks import whole
from loopsq.domain.labels import LABEL_PATTERN, check_label
from loopsq.domain.limits import MAX_POOL_LIMIT
from loopsq.domain.text import quoted
from loopsq.errors import ValidationError

#: What a pool name must match (anchored, as JSON Schema reads a ``pattern``).
POOL_NAME_SCHEMA_PATTERN = f"^{LABEL_PATTERN}$"


def check_pool_name(value: Any, field: str = "pool name") -> str:
    """``value`` when it is a label; else ``<field> must be a label (<pattern>), got "<value>"``."""
    return check_label(value, field)


def check_pool_limit(value: Any, field: str = "limit") -> int:
    """``value`` as an int from 1 to ``MAX_POOL_LIMIT`` (JSON's ``3.0`` is 3); else ``<field> must be a positive
    integer, got <value>`` or ``<field> must be at most 10000, got <value>``."""
    value = whole(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError(f"{field} must be a positive integer, got {quoted(value)}")
    if value > MAX_POOL_LIMIT:
        raise ValidationError(f"{field} must be at most {MAX_POOL_LIMIT}, got {quoted(value)}")
    return value
