"""Which layout of loopsq's state a Redis holds, and whether this loopsq may read and write it.

A release that changes what Redis stores (a key's name or type, a value's encoding) raises ``LAYOUT``; the state
says which layout it is in ``keys.meta`` (a hash: ``layout``, ``readableFrom``, and ``migratingTo`` while
``loopsq migrate`` works), so that a process of another release never writes into a layout it does not know:

- layout == ours: read and write.
- layout > ours: allowed only while its ``readableFrom`` <= ours (a newer release that kept our reading valid);
  else refused: ``this Redis holds loopsq state v3; this loopsq reads v2: upgrade it``.
- layout < ours: refused until ``loopsq migrate`` (or a scheduler's start) moves it forward
  (``state.migrations``).

A Redis with no ``keys.meta`` holds either nothing of loopsq (``EMPTY``: the first scheduler or worker stamps the
current layout) or state from before versioning: layout 1 (commit 9923ab3, 0.1.0) when a ``<ns>:slot:*`` key
exists, else layout 2 as today's main wrote it (the same keys, no stamp) which is stamped as it is. A writer does
not stamp unstamped state while a scheduler or worker of a release from before versioning is live on it (its
liveness record names no ``layout``): a 0.1.0 one that has run no slot yet holds no slot key, and would go on
writing a key per slot into a state stamped v2 beside today's processes. The writer is refused instead (exit 2,
restarted by its process manager) until those are gone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from loopsq.errors import LoopsqError
from loopsq.state.keys import Keys

#: The layout this release reads and writes. 1: 0.1.0 (commit 9923ab3), a key per slot (``<ns>:slot:<loop>:<at>``)
#: and JSON rows. 2: 0.2.0, a hash of slots per loop (``keys.slots``) and settled rows compressed (``run_codec``).
LAYOUT = 2
#: The oldest layout this release reads and writes as it is (an older one must be migrated first).
READS_FROM = 2
#: What this release stamps as ``readableFrom``: the oldest release layout that may still use the state it
#: writes (raised by a release whose writes an older release would misread).
READABLE_FROM = 2
#: What ``layout`` reports for a Redis with nothing of loopsq in it.
EMPTY = 0

LAYOUT_FIELD = "layout"
READABLE_FIELD = "readableFrom"
MIGRATING_FIELD = "migratingTo"


#: The field of a process's liveness record naming the layout its release writes (``engine.runtime``): a record
#: without it is of a release from before versioned state.
LIVENESS_LAYOUT_FIELD = "layout"


class StateLayoutError(LoopsqError):
    """The state is in a layout this release must not touch (exit status 2: nothing was changed)."""

    exit_code = 2


@dataclass(frozen=True)
class Layout:
    """What a Redis says of its layout."""

    #: The layout number; ``EMPTY`` (0) when nothing of loopsq is there.
    version: int
    #: The lowest release layout that may read and write it.
    readable_from: int
    #: True when ``keys.meta`` says so; False when guessed from the keys (state from before versioning).
    stamped: bool
    #: The layout a migration in progress moves it to, else None.
    migrating_to: int | None = None

    def refusal(self, ours: int = LAYOUT) -> str | None:
        """The one line that refuses this state to a release of layout ``ours``, or None when it may go on."""
        if self.version == EMPTY:
            return None
        if self.migrating_to is not None:
            return (f"this Redis holds loopsq state v{self.version} being migrated to v{self.migrating_to}; "
                    f"this loopsq reads {reads(ours)}: wait for `loopsq migrate` to finish")
        if self.version > ours:
            if self.readable_from <= ours:
                return None
            return f"this Redis holds loopsq state v{self.version}; this loopsq reads {reads(ours)}: upgrade it"
        if self.version >= min(READS_FROM, ours):
            return None
        return (f"this Redis holds loopsq state v{self.version}; this loopsq reads {reads(ours)}: "
                "run `loopsq migrate` (a scheduler does at its start)")


def reads(ours: int = LAYOUT) -> str:
    """The layouts a release of layout ``ours`` reads, as the refusals spell them (``v2`` or ``v2-v3``)."""
    low = min(READS_FROM, ours)
    return f"v{ours}" if low == ours else f"v{low}-v{ours}"


def _int(value: object, default: int) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return default


def has_keys(client: redis.Redis, pattern: str) -> bool:
    """Whether any key matches ``pattern`` (a SCAN that stops at the first match)."""
    for _ in client.scan_iter(match=pattern, count=1000):
        return True
    return False


def from_meta(meta: Mapping[Any, Any]) -> Layout | None:
    """The layout ``keys.meta``'s fields (an HGETALL's reply) state, or None when there are none."""
    if not meta:
        return None
    text = {str(k.decode() if isinstance(k, bytes) else k): v for k, v in meta.items()}
    version = _int(text.get(LAYOUT_FIELD), 1)
    migrating = _int(text.get(MIGRATING_FIELD), 0)
    return Layout(version, _int(text.get(READABLE_FIELD), version), True, migrating or None)


def read(client: redis.Redis, keys: Keys) -> Layout:
    """The layout of the state under ``keys``' namespace (one HGETALL; a SCAN only for unstamped state)."""
    stamped = from_meta(client.hgetall(keys.meta))
    if stamped is not None:
        return stamped
    if has_keys(client, keys.old_slot_pattern):
        return Layout(1, 1, False)
    if has_keys(client, f"{keys.namespace}:*"):
        return Layout(2, 2, False)
    return Layout(EMPTY, EMPTY, False)


def live_processes(client: redis.Redis, keys: Keys) -> list[str]:
    """The schedulers and workers live on this namespace (their liveness keys), as ``worker:<id>``."""
    return sorted(_text(k)[len(keys.namespace) + 1:] for k in _liveness_keys(client, keys))


def unversioned_processes(client: redis.Redis, keys: Keys) -> list[str]:
    """The live schedulers and workers whose liveness record names no layout: of a release from before versioned
    state (0.1.0, or main before it), as ``worker:<id>``."""
    found = []
    for key in _liveness_keys(client, keys):
        raw = client.get(key)
        if raw is not None and f'"{LIVENESS_LAYOUT_FIELD}":' not in _text(raw):
            found.append(_text(key)[len(keys.namespace) + 1:])
    return sorted(found)


def _liveness_keys(client: redis.Redis, keys: Keys) -> list[Any]:
    return [k for pattern in (f"{keys.namespace}:worker:*", f"{keys.namespace}:scheduler:*")
            for k in client.scan_iter(match=pattern, count=1000)]


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def stamp(client: redis.Redis, keys: Keys, version: int = LAYOUT, readable_from: int = READABLE_FROM) -> None:
    """Write the layout into ``keys.meta`` (the end of a migration, or a fresh or unstamped current state)."""
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.meta, mapping={LAYOUT_FIELD: str(version), READABLE_FIELD: str(readable_from)})
    pipe.hdel(keys.meta, MIGRATING_FIELD)
    pipe.execute()


def check(client: redis.Redis, keys: Keys, *, writer: bool = False) -> Layout:
    """The state's layout when this release may use it; a ``writer`` (a scheduler or worker at its start) stamps an
    empty or unstamped current state first, so that the next release knows what it finds. (CLI commands, the web
    app and the SDK only check: a refused command writes nothing, not even a stamp.)

    Raises:
        StateLayoutError: the state is older (migrate it), newer (upgrade this loopsq) or being migrated.
    """
    layout = read(client, keys)
    why = layout.refusal()
    if why is not None:
        raise StateLayoutError(why)
    if writer and not layout.stamped and layout.version == LAYOUT:
        older = unversioned_processes(client, keys)
        if older:
            shown = ", ".join(older[:3]) + (f" and {len(older) - 3} more" if len(older) > 3 else "")
            raise StateLayoutError(f"{len(older)} loopsq process(es) of a release from before versioned state are "
                                   f"live on this Redis ({shown}); stop them, then start this release")
    if writer and not layout.stamped and layout.version in (EMPTY, LAYOUT):
        # HSETNX: of two writers racing on an empty Redis, neither overwrites a stamp a migration wrote meanwhile.
        pipe = client.pipeline(transaction=True)
        pipe.hsetnx(keys.meta, LAYOUT_FIELD, str(LAYOUT))
        pipe.hsetnx(keys.meta, READABLE_FIELD, str(READABLE_FROM))
        pipe.execute()
        return Layout(LAYOUT, READABLE_FROM, True)
    return layout
