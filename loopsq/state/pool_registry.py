"""Whether the fleet's pools that a loop, a workflow or a step names exist: a read of the ``keys.pools`` hash.

``loopsq pool set`` writes that hash (``state.pools``); the creates read it here, so that naming a pool that does
not exist is bad input, refused before anything is written. ``expect_pools`` turns what was read into guards of
the create's own transition, so a pool removed between the check and the write fails the write instead of leaving
a loop that names no pool.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis

from loopsq.domain.text import quoted, shown
from loopsq.errors import ValidationError
from loopsq.state.commit import Tx
from loopsq.state.keys import Keys


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else None if value is None else str(value)


def pool_exists(client: redis.Redis, keys: Keys, name: str) -> bool:
    """Whether a pool named ``name`` exists."""
    return bool(client.hexists(keys.pools, name))


def unknown_pool(field: str, name: str, quote: Callable[[str], str] = quoted) -> ValidationError:
    """The error for ``field`` naming a pool that does not exist, quoted as the interface quotes values."""
    return ValidationError(f"{field} {quote(name)} does not exist "
                           f"(create it with: loopsq pool set {shown(name)} --limit N)")


def require_named_pools(client: redis.Redis, keys: Keys, named: Iterable[tuple[str, str]],
                        quote: Callable[[str], str] = quoted) -> dict[str, str]:
    """The stored record (JSON text) of each pool in ``named`` (``(field, pool name)`` pairs), read in one
    command; empty when ``named`` is.

    Raises:
        ValidationError: ``<field> "<name>" does not exist (create it with: loopsq pool set <name> --limit N)``
            for the first pair, in order, whose pool does not exist.
    """
    pairs = list(named)
    names = list(dict.fromkeys(name for _, name in pairs))
    if not names:
        return {}
    records = dict(zip(names, (_text(raw) for raw in client.hmget(keys.pools, names)), strict=True))
    for field, name in pairs:
        if records[name] is None:
            raise unknown_pool(field, name, quote)
    return {name: record for name, record in records.items() if record is not None}


def require_pools(client: redis.Redis, keys: Keys, names: Iterable[str | None], field: str,
                  quote: Callable[[str], str] = quoted) -> dict[str, str]:
    """``require_named_pools`` for pools that one field names (None entries are skipped)."""
    return require_named_pools(client, keys, [(field, name) for name in names if name is not None], quote)


def expect_pools(tx: Tx, keys: Keys, records: Mapping[str, str]) -> Tx:
    """Guard ``tx``: each pool still has the record that was read (not removed, not changed meanwhile)."""
    for name, record in records.items():
        tx.expect_field(keys.pools, name, record)
    return tx
