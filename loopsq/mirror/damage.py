"""Telling a malformed mirror file from other SQLite failures, and the one message every read then gives.

SQLite answers a read of a damaged page with ``database disk image is malformed`` (``file is not a database``
when the header itself is gone). Such a file cannot heal by itself: every read names the command that repairs it.
"""

from __future__ import annotations

import os
import sqlite3

from loopsq.errors import LoopsqError

#: The command that repairs a malformed mirror (``loopsq/mirror/repair.py``).
REBUILD_COMMAND = "loopsq mirror --rebuild"

_MARKERS = ("malformed", "not a database", "database corruption", "file is encrypted")


def is_malformed(exc: BaseException) -> bool:
    """Whether ``exc`` says the database file is damaged (not merely locked, busy or missing a table)."""
    return isinstance(exc, sqlite3.DatabaseError) and any(marker in str(exc).lower() for marker in _MARKERS)


def malformed_cause(exc: BaseException) -> BaseException | None:
    """The SQLite error saying the file is damaged, found in ``exc`` or the errors it was raised from, or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if is_malformed(current):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def malformed_error(path: str | os.PathLike[str], exc: BaseException) -> LoopsqError:
    """The error of any read or write of a malformed mirror: it names the file, SQLite's words and the repair."""
    return LoopsqError(f"the mirror database {os.fspath(path)} is malformed ({exc}); repair it with: {REBUILD_COMMAND}")
