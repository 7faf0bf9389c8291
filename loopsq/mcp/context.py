"""What every MCP tool call shares: the deployment's Redis, its key names, this process's mirror and the gate.

Reads go through the SQLite mirror after a catch-up, as the CLI's do (a call sees every write acknowledged before
it started); writes go through the Redis stores. A mirror connection is opened per call, in the worker thread that
serves it (``open_db`` connections belong to one thread); the Redis clients are shared (thread-safe pools).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import redis

from loopsq.domain import timeutil
from loopsq.engine import timers
from loopsq.mirror.follow import catch_up
from loopsq.mirror.schema import open_db
from loopsq.state.connection import connect
from loopsq.state.keys import Keys
from loopsq.system import config

#: The environment variable that must allow mutation tools (the reference's ``LOOPS_MCP_ALLOW_MUTATIONS``).
ALLOW_MUTATIONS_ENV = "LOOPSQ_MCP_ALLOW_MUTATIONS"
#: The values of ``ALLOW_MUTATIONS_ENV`` that allow them (the reference's, compared case-insensitively).
ALLOW_VALUES = frozenset({"1", "true", "yes", "on"})
#: The optional allowlist of mutation tools (comma-separated names), read once at start.
ALLOW_TOOLS_ENV = "LOOPSQ_MCP_ALLOW_TOOLS"


class McpContext:
    """One deployment as the MCP tools see it: its Redis (``redis_url``, password included, only ever shown
    masked), this process's data directory (its mirror is ``<data_dir>/loops.db``) and key names.

    ``client``: a Redis client to share (the web app's); otherwise one is opened, without a ping, so the server
    starts while Redis is down and each call reports the outage. ``allowed_tools``: the mutation tools
    ``LOOPSQ_MCP_ALLOW_TOOLS`` lets run (``server.allowed_tools_from_env``); None: every one.
    """

    def __init__(self, redis_url: str, data_dir: Path, keys: Keys | None = None,
                 client: redis.Redis | None = None, allowed_tools: frozenset[str] | None = None) -> None:
        self.redis_url = redis_url
        self.allowed_tools = allowed_tools
        self.data_dir = data_dir
        self.keys = keys or Keys()
        self._owns_client = client is None
        self.client = client if client is not None else connect(redis_url, check=False)
        self._raw: redis.Redis | None = None
        self._lock = threading.Lock()

    def raw(self) -> redis.Redis:
        """A bytes-responses client (RQ enqueueing, live output chunks)."""
        with self._lock:
            if self._raw is None:
                self._raw = timers.raw_from(self.client)
            return self._raw

    @contextlib.contextmanager
    def mirror(self) -> Iterator[sqlite3.Connection]:
        """A mirror connection for this thread, caught up first (read-your-writes); closed afterwards."""
        conn = open_db(config.mirror_path(self.data_dir))
        try:
            catch_up(self.client, self.keys, conn)
            yield conn
        finally:
            conn.close()

    def now(self) -> datetime:
        """The clock (``loopsq.domain.timeutil.now``, which tests patch)."""
        return timeutil.now()

    @staticmethod
    def mutations_allowed() -> bool:
        """Whether ``LOOPSQ_MCP_ALLOW_MUTATIONS`` allows mutation tools (read at each call)."""
        return os.environ.get(ALLOW_MUTATIONS_ENV, "").strip().lower() in ALLOW_VALUES

    def close(self) -> None:
        """Close the clients this context opened."""
        if self._raw is not None:
            self._raw.close()
            self._raw = None
        if self._owns_client:
            self.client.close()
