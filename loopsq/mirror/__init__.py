"""The SQLite query mirror: the reference's schema, fed idempotently from the change stream, read by the CLI.

``schema`` opens and migrates the database, ``apply`` writes changes into it, ``queries`` reads entities back.
``follow`` is the stream consumer that hands changes to ``apply_changes`` (and rebuilds from a Redis snapshot).
May import ``loopsq.state``, ``loopsq.system``, ``loopsq.domain`` and ``loopsq.errors``; never the engine or above.
"""

from __future__ import annotations

from loopsq.mirror.apply import (
    LAST_APPLIED_KEY,
    REDIS_INSTANCE_KEY,
    apply_changes,
    get_meta,
    last_applied_id,
    parse_stream_id,
    replace_all,
    reset,
    row_to_entity,
    set_meta,
)
from loopsq.mirror.schema import MIRRORED_COLUMNS, add_column_if_missing, migrate, open_db

__all__ = [
    "LAST_APPLIED_KEY",
    "MIRRORED_COLUMNS",
    "REDIS_INSTANCE_KEY",
    "add_column_if_missing",
    "apply_changes",
    "get_meta",
    "last_applied_id",
    "migrate",
    "open_db",
    "parse_stream_id",
    "replace_all",
    "reset",
    "row_to_entity",
    "set_meta",
]
