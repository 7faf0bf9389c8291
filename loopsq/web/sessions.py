"""Dashboard session cookies: issued at login, checked on every page, expired after their lifetime, revoked at
logout on the server.

A cookie is ``v2.<session id>.<issued ms>.<mac>``: the mac (an HMAC keyed with the API token) makes a forged or
edited cookie fail without touching Redis, the issue time makes it expire after ``ttl_s`` (default 12 h,
``loopsq web --session-ttl``) even if its holder ignores ``Max-Age``, and the session id must still be open in
Redis (``state.sessions``): logout deletes it there, so a copied cookie stops working everywhere at once. A
changed API token invalidates every cookie.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from loopsq.state.sessions import SessionStore

#: The default session lifetime (12 hours).
DEFAULT_SESSION_TTL_S = 12 * 3600
#: How far in the future an issue time may lie (clocks of several web processes disagree a little).
CLOCK_SKEW_MS = 60_000
_VERSION = "v2"


def _mac(token: str, session_id: str, issued_ms: int) -> str:
    message = f"loopsq dashboard session {_VERSION}|{session_id}|{issued_ms}".encode()
    return hmac.new(token.encode("utf-8", "surrogateescape"), message, hashlib.sha256).hexdigest()


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Sessions:
    """Issue, check and revoke session cookies for one API token."""

    store: SessionStore
    token: str
    ttl_s: int = DEFAULT_SESSION_TTL_S
    clock_ms: Callable[[], int] = field(default=_now_ms)

    def issue(self) -> str:
        """Open a new session and return its cookie value (it never contains the token)."""
        session_id = secrets.token_hex(16)
        issued = self.clock_ms()
        self.store.open(session_id, self.ttl_s * 1000)
        return f"{_VERSION}.{session_id}.{issued}.{_mac(self.token, session_id, issued)}"

    def _parse(self, cookie: str) -> str | None:
        """The session id of a genuine, unexpired cookie, or None (no Redis involved)."""
        parts = cookie.split(".")
        if len(parts) != 4 or parts[0] != _VERSION or not parts[2].isascii() or not parts[2].isdigit():
            return None
        session_id, issued = parts[1], int(parts[2])
        if not hmac.compare_digest(parts[3].encode("utf-8", "surrogateescape"),
                                   _mac(self.token, session_id, issued).encode()):
            return None
        now = self.clock_ms()
        if issued > now + CLOCK_SKEW_MS or now >= issued + self.ttl_s * 1000:
            return None
        return session_id

    def check(self, cookie: str) -> bool:
        """Whether ``cookie`` opens the pages: genuine, unexpired, and its session still open in Redis.

        Raises:
            redis.RedisError: when Redis cannot be asked (the caller answers 503).
        """
        session_id = self._parse(cookie)
        return session_id is not None and self.store.is_open(session_id)

    def revoke(self, cookie: str) -> None:
        """Close the session of a genuine cookie (an expired one too); anything else is ignored."""
        parts = cookie.split(".")
        if len(parts) == 4 and parts[2].isascii() and parts[2].isdigit() and hmac.compare_digest(
                parts[3].encode("utf-8", "surrogateescape"), _mac(self.token, parts[1], int(parts[2])).encode()):
            self.store.close(parts[1])
