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
    """Reads the layout every ``GUARD_EVERY_S`` (and in full after each Redis outage the process lived through);
    calls ``on_refusal`` with the line when this release can no longer use it (by default: exit 2)."""

    def __init__(self, rt: Runtime, stop: threading.Event, *,
                 on_refusal: Callable[[str], None] = _exit, every_s: float = GUARD_EVERY_S) -> None:
        super().__init__(name="loopsq-layout-guard", daemon=True)
        self.rt, self.stop, self.on_refusal, self.every_s = rt, stop, on_refusal, every_s
        self._outages = rt.outage.outages

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                line = self.check()
            except redis.RedisError:
                continue  # an outage: the process's own calls report it; checked in full once it is over
            if line is not None:
                self.on_refusal(line)
                return

    def check(self) -> str | None:
        """The refusal line, or None while this release may go on."""
        outages = self.rt.outage.outages
        if outages != self._outages or self.rt.outage.down:
            if self.rt.outage.down:
                return None
            self._outages = outages
            found = layout.read(self.rt.direct, self.rt.keys)  # after a reconnect: another Redis, maybe
        else:
            stamped = layout.from_meta(self.rt.direct.hgetall(self.rt.keys.meta))
            if stamped is None:
                return None  # (a flushed or new Redis: the check after the next reconnect tells)
            found = stamped
        return found.refusal()
