"""The name of a data dir's mirror, which names its consumer group on the change stream (``mirror:<name>``).

``LOOPSQ_MIRROR_NAME`` when set; else an id made once and kept in the mirror's ``mirror_meta`` (a rebuild keeps
it), so a follower that restarts on the same data dir, under the same host name or another (a dyno restarted with
its disk), resumes its own group instead of leaving it behind and holding the stream back. A data dir whose
mirror followed before names were kept adopts the group it followed then (``mirror:<hash of host and path>``),
when that group is still on the stream, rather than making a second one.

A new data dir (an ephemeral disk comes back empty) gets a new name and a new group; the old one stops holding
the stream back once it has been silent for ``LOOPSQ_MIRROR_IDLE`` (see ``loopsq.state.stream_trim``).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import sqlite3
from collections.abc import Mapping

import redis

from loopsq.errors import ValidationError
from loopsq.mirror.apply import MIRROR_NAME_KEY, get_meta, set_meta
from loopsq.mirror.schema import transaction
from loopsq.state.keys import Keys
from loopsq.system.procs import hostname

NAME_ENV = "LOOPSQ_MIRROR_NAME"
GROUP_PREFIX = "mirror:"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def configured_name(env: Mapping[str, str] | None = None) -> str | None:
    """``LOOPSQ_MIRROR_NAME``, validated; None when unset or empty.

    Raises:
        ValidationError: when it is not 1 to 64 letters, digits, '.', '_' or '-' starting with a letter or digit.
    """
    text = (os.environ if env is None else env).get(NAME_ENV)
    if not text:
        return None
    if not _NAME.fullmatch(text):
        raise ValidationError(f"{NAME_ENV} must be 1 to 64 letters, digits, '.', '_' or '-', starting with a "
                              f"letter or digit, got '{text}'")
    return text


def group_of(name: str) -> str:
    """The consumer group of the mirror named ``name``."""
    return f"{GROUP_PREFIX}{name}"


def legacy_name(db_path: str) -> str:
    """The name a mirror's group had before names were kept: a hash of the host name and the mirror's path."""
    return hashlib.sha1(f"{hostname()}:{db_path}".encode()).hexdigest()[:12]


def mirror_group(client: redis.Redis, keys: Keys, conn: sqlite3.Connection, db_path: str,
                 env: Mapping[str, str] | None = None) -> str:
    """The consumer group this data dir's follower reads with: ``LOOPSQ_MIRROR_NAME``'s, else the one kept in the
    mirror (made now, once: the group this mirror followed before names were kept if Redis still has it, else a
    new random id).

    Raises:
        ValidationError: ``LOOPSQ_MIRROR_NAME`` is malformed.
    """
    configured = configured_name(env)
    if configured is not None:
        return group_of(configured)
    kept = get_meta(conn, MIRROR_NAME_KEY)
    if kept is not None:
        return group_of(kept)
    legacy = legacy_name(db_path)
    name = legacy if group_of(legacy) in _group_names(client, keys) else secrets.token_hex(6)
    with transaction(conn):
        kept = get_meta(conn, MIRROR_NAME_KEY)  # made meanwhile by another process: the first one stays
        if kept is None:
            set_meta(conn, MIRROR_NAME_KEY, name)
    return group_of(kept or name)


def _group_names(client: redis.Redis, keys: Keys) -> set[str]:
    try:
        groups = client.xinfo_groups(keys.changes)
    except redis.ResponseError:  # no stream yet
        return set()
    return {g["name"].decode() if isinstance(g["name"], bytes) else str(g["name"]) for g in groups}
