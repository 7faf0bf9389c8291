"""Dashboard sessions in Redis: one key per open session, with the session's lifetime as its TTL.

Opening a session sets the key, closing it (logout) deletes it, and a session is open exactly while its key
exists, so a logout is revoked server-side at once on every web process, and nothing outlives its TTL.
Sessions are not part of the loops' state: they append no change and mirrors never see them.
"""

from __future__ import annotations

import redis

from loopsq.state.keys import Keys


class SessionStore:
    """Open dashboard sessions of one deployment."""

    def __init__(self, client: redis.Redis, keys: Keys | None = None) -> None:
        self.client = client
        self.keys = keys or Keys()

    def open(self, session_id: str, ttl_ms: int) -> None:
        """Record ``session_id`` as open for ``ttl_ms``."""
        self.client.set(self.keys.web_session(session_id), "1", px=ttl_ms)

    def is_open(self, session_id: str) -> bool:
        """Whether ``session_id`` is open (opened, not closed, not expired)."""
        return bool(self.client.exists(self.keys.web_session(session_id)))

    def close(self, session_id: str) -> None:
        """Close ``session_id`` (idempotent)."""
        self.client.delete(self.keys.web_session(session_id))
