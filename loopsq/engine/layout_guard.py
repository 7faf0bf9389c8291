"""The long-running processes' side of the versioned state (``state.layout``): a check at start (a scheduler
migrates first, unless ``--no-migrate``), and a guard that watches the layout while the process runs.

The rolling-deploy policy: a process that finds the state in a layout it cannot read (a newer release migrated
it) stops taking work and exits with status 2 and one line, so that its process manager starts the new release
in its place. It exits at once (``os._exit``), writing nothing more: its running runs are left to recovery (their
leases expire; the new release's worker on the same host kills their processes at its start, as it does for a
killed worker's), which never happens in a layout that process does not know.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

import redis

from loopsq.engine.runtime import Runtime
from loopsq.state import layout, migrations
from loopsq.state.keys import Keys
from loopsq.state.outages import OutageLog

log = logging.getLogger("loopsq.layout")

#: How often the guard reads ``keys.meta`` (one HGETALL).
GUARD_EVERY_S = 2.0
#: How long a scheduler's start waits for another's migration before it gives up (exit 2; restarted).
MIGRATE_WAIT_S = 120.0


def _exit(line: str) -> None:
    """The refusal line on stderr (the one line: the log goes there too), then exit 2 without another write."""
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.flush()
    os._exit(2)


def check_at_start(rt: Runtime, *, migrate: bool = False) -> layout.Layout:
    """Refuse a state this release cannot use (``StateLayoutError``, exit 2); with ``migrate`` (a scheduler),
    move an older one forward first, under the migrate lock.

    Raises:
        StateLayoutError: the state is newer, or older and ``migrate`` is off or refused.
    """
    found = rt.ride(lambda: layout.read(rt.client, rt.keys))
    if migrate and (layout.EMPTY < found.version < layout.LAYOUT or found.migrating_to is not None):
        migrations.migrate(rt.client, rt.keys, wait_s=MIGRATE_WAIT_S, say=lambda line: log.info("%s", line))
    return rt.ride(lambda: layout.check(rt.client, rt.keys, writer=True))


class LayoutGuard(threading.Thread):
    """Reads the layout every ``GUARD_EVERY_S``: the stamp alone, and the whole layout after a Redis outage (one
    the process's ``outage`` log counted, or a read of its own that failed: the Redis that answers now may be
    another); calls ``on_refusal`` with the line when this release can no longer use it (by default: exit 2).
    ``client`` fails at once while Redis is away (a runtime's ``direct``), so the guard never waits on it."""

    def __init__(self, client: redis.Redis, keys: Keys, stop: threading.Event, *, outage: OutageLog | None = None,
                 on_refusal: Callable[[str], None] = _exit, every_s: float = GUARD_EVERY_S) -> None:
        super().__init__(name="loopsq-layout-guard", daemon=True)
        self.client, self.keys, self.stop, self.outage = client, keys, stop, outage
        self.on_refusal, self.every_s = on_refusal, every_s
        self._outages = outage.outages if outage is not None else 0
        self._failed = False

    @classmethod
    def of(cls, rt: Runtime, stop: threading.Event) -> LayoutGuard:
        """The guard of a scheduler's or worker's runtime."""
        return cls(rt.direct, rt.keys, stop, outage=rt.outage)

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            line = self.check()
            if line is not None:
                self.on_refusal(line)
                return

    def check(self) -> str | None:
        """The refusal line, or None while this release may go on (or Redis does not answer)."""
        if self.outage is not None and self.outage.down:
            return None  # (the process's own calls report it; checked in full once it is over)
        outages = self.outage.outages if self.outage is not None else 0
        try:
            if self._failed or outages != self._outages:
                found = layout.read(self.client, self.keys)  # after a reconnect: another Redis, maybe
            else:
                stamped = layout.from_meta(self.client.hgetall(self.keys.meta))
                if stamped is None:
                    return None  # (a flushed or new Redis: the check after the next reconnect tells)
                found = stamped
        except redis.RedisError:
            self._failed = True
            return None
        self._failed, self._outages = False, outages
        return found.refusal()
