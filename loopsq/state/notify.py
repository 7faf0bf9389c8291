"""Notification endpoints, their outboxes and their delivery logs in Redis.

An endpoint's definition is a field of ``keys.notify_endpoints`` (with its secret, which signs; it is shown once,
when made). ``set`` and ``delete`` are transitions with their change-stream event (``notify_set``,
``notify_removed``; only the name in the change's ``detail``: a webhook URL may itself be a secret, as Slack's are).

Each endpoint has an outbox: ``keys.notify_outbox(E)`` (event id -> next attempt, ms) and ``keys.notify_events(E)``
(event id -> ``{body, attempts, firstAt}``). ``enqueue`` is idempotent per event id (``HSETNX``), so an event
derived twice from one change (a notifier that crashed before it acknowledged the change) is still one event with
one id. ``keys.notify_log(E)`` keeps the last ``LOG_SIZE`` attempts. Everything goes with its endpoint.
"""

from __future__ import annotations

import builtins
import json
from dataclasses import dataclass
from typing import Any

import redis

from loopsq.domain import timeutil
from loopsq.domain.notify import Endpoint, check_endpoint_name
from loopsq.domain.text import shown
from loopsq.domain.timeutil import to_iso
from loopsq.errors import ConflictError, NotFoundError
from loopsq.state.commit import Committer, Tx
from loopsq.state.keys import Keys

#: Delivery attempts kept per endpoint for ``notify log``.
LOG_SIZE = 1_000
MAX_RETRIES = 20


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Pending:
    """An undelivered event: its id, body, attempts so far and when it was made (ms)."""

    id: str
    body: str
    attempts: int
    first_at_ms: int


class NotifyStore:
    """Notification endpoints and their outboxes on one Redis connection."""

    def __init__(self, client: redis.Redis, keys: Keys, committer: Committer | None = None) -> None:
        self.client = client
        self.keys = keys
        self.committer = committer or Committer(client, keys)

    # -- endpoints -------------------------------------------------------------------------------------------
    def set(self, endpoint: Endpoint) -> tuple[Endpoint, bool]:
        """Create or replace ``endpoint`` (one ``notify_set`` transition; none when nothing changes). A replaced
        endpoint keeps its secret and creation time. Returns the stored endpoint and whether it is new."""
        for _ in range(MAX_RETRIES):
            raw = self.client.hget(self.keys.notify_endpoints, endpoint.name)
            current = None if raw is None else Endpoint.from_json(endpoint.name, _s(raw))
            stored = Endpoint(endpoint.name, endpoint.url, endpoint.events, endpoint.tags, endpoint.alert_after_ms,
                              secret=current.secret if current else endpoint.secret,
                              created_at=current.created_at if current else to_iso(timeutil.now()))
            if current == stored:
                return stored, False
            tx = (Tx("notify_set", to_iso(timeutil.now()))
                  .expect_field(self.keys.notify_endpoints, endpoint.name, None if raw is None else _s(raw))
                  .hset(self.keys.notify_endpoints, endpoint.name, stored.to_json())
                  .describe(notification=endpoint.name))
            if "overdue" not in stored.events:
                tx.delete_key(self.keys.notify_due(stored.name)).delete_key(self.keys.notify_overdue(stored.name))
            if self.committer.commit(tx).ok:
                return stored, current is None
        raise ConflictError(f"notification {endpoint.name} changed concurrently {MAX_RETRIES} times; try again")

    def get(self, name: str) -> Endpoint | None:
        """Endpoint ``name``, or None."""
        raw = self.client.hget(self.keys.notify_endpoints, name)
        return None if raw is None else Endpoint.from_json(name, _s(raw))

    def list(self) -> builtins.list[Endpoint]:
        """Every endpoint, by name."""
        found = self.client.hgetall(self.keys.notify_endpoints)
        return sorted((Endpoint.from_json(_s(k), _s(v)) for k, v in found.items()), key=lambda e: e.name)

    def delete(self, name: str) -> bool:
        """Remove endpoint ``name`` with its outbox, log and overdue index (one ``notify_removed`` transition);
        False when there is none."""
        name = check_endpoint_name(name)
        for _ in range(MAX_RETRIES):
            raw = self.client.hget(self.keys.notify_endpoints, name)
            if raw is None:
                return False
            tx = (Tx("notify_removed", to_iso(timeutil.now()))
                  .expect_field(self.keys.notify_endpoints, name, _s(raw))
                  .hdel(self.keys.notify_endpoints, name)
                  .describe(notification=name))
            for key in (self.keys.notify_outbox(name), self.keys.notify_events(name), self.keys.notify_log(name),
                        self.keys.notify_due(name), self.keys.notify_overdue(name)):
                tx.delete_key(key)
            if self.committer.commit(tx).ok:
                return True
        raise ConflictError(f"notification {name} changed concurrently {MAX_RETRIES} times; try again")

    # -- outbox ----------------------------------------------------------------------------------------------
    def enqueue(self, name: str, event_id: str, body: str, now_ms: int) -> bool:
        """Queue event ``event_id`` for endpoint ``name``, due now; False when it was queued already."""
        record = json.dumps({"body": body, "attempts": 0, "firstAt": now_ms}, separators=(",", ":"))
        if not self.client.hsetnx(self.keys.notify_events(name), event_id, record):
            return False
        self.client.zadd(self.keys.notify_outbox(name), {event_id: now_ms}, nx=True)
        return True

    def due(self, name: str, now_ms: int, count: int) -> builtins.list[Pending]:
        """Up to ``count`` events of ``name`` whose next attempt is due, oldest first."""
        ids = [_s(i) for i in self.client.zrangebyscore(self.keys.notify_outbox(name), "-inf", now_ms,
                                                         start=0, num=count)]
        if not ids:
            return []
        records = self.client.hmget(self.keys.notify_events(name), ids)
        out: builtins.list[Pending] = []
        for event_id, raw in zip(ids, records, strict=True):
            if raw is None:  # delivered meanwhile by another notifier
                self.client.zrem(self.keys.notify_outbox(name), event_id)
                continue
            data = json.loads(_s(raw))
            out.append(Pending(event_id, str(data["body"]), int(data["attempts"]), int(data["firstAt"])))
        return out

    def pending_count(self, name: str) -> int:
        """How many events of ``name`` wait for delivery."""
        return int(self.client.zcard(self.keys.notify_outbox(name)))

    def done(self, name: str, event_id: str) -> None:
        """Delivered (or given up): the event leaves the outbox."""
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(self.keys.notify_outbox(name), event_id)
        pipe.hdel(self.keys.notify_events(name), event_id)
        pipe.execute()

    def retry_at(self, name: str, event: Pending, at_ms: int) -> None:
        """A failed attempt: count it and move the next one to ``at_ms`` (only while the event is queued)."""
        record = json.dumps({"body": event.body, "attempts": event.attempts + 1, "firstAt": event.first_at_ms},
                            separators=(",", ":"))
        if self.client.hexists(self.keys.notify_events(name), event.id):
            pipe = self.client.pipeline(transaction=True)
            pipe.hset(self.keys.notify_events(name), event.id, record)
            pipe.zadd(self.keys.notify_outbox(name), {event.id: at_ms}, xx=True)
            pipe.execute()

    # -- log -------------------------------------------------------------------------------------------------
    def log_attempt(self, name: str, entry: dict[str, Any]) -> None:
        """Record one delivery attempt (the log keeps the newest ``LOG_SIZE``)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.lpush(self.keys.notify_log(name), json.dumps(entry, separators=(",", ":"), ensure_ascii=False))
        pipe.ltrim(self.keys.notify_log(name), 0, LOG_SIZE - 1)
        pipe.execute()

    def log(self, name: str, limit: int) -> builtins.list[dict[str, Any]]:
        """The newest ``limit`` attempts of ``name``, newest first."""
        return [json.loads(_s(raw)) for raw in self.client.lrange(self.keys.notify_log(name), 0, limit - 1)]

    # -- views (the CLI, the SDK and the MCP tools) ----------------------------------------------------------
    def listing(self) -> builtins.list[dict[str, Any]]:
        """Every endpoint's public view (never its secret) with how many events wait for delivery."""
        return [{**e.to_dict(), "pending": self.pending_count(e.name)} for e in self.list()]

    def logs(self, name: str | None, limit: int) -> builtins.list[dict[str, Any]]:
        """The newest ``limit`` attempts of endpoint ``name`` (of each endpoint, by name, when None), newest first,
        each with its ``notification``.

        Raises:
            NotFoundError: ``notification not found: <name>``.
        """
        if name is not None:
            name = check_endpoint_name(name)
            if self.get(name) is None:
                raise NotFoundError(f"notification not found: {shown(name)}")
        names = [name] if name is not None else [e.name for e in self.list()]
        return [{"notification": n, **entry} for n in names for entry in self.log(n, limit)]

    def require_remove(self, name: str) -> None:
        """``delete``, or ``NotFoundError('notification not found: <name>')`` when there is no such endpoint."""
        name = check_endpoint_name(name)
        if not self.delete(name):
            raise NotFoundError(f"notification not found: {shown(name)}")
