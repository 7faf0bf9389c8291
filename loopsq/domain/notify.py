"""Notifications: what an endpoint is, the events it receives, their JSON body and their signature (no I/O).

An endpoint (``loopsq notify add NAME --webhook URL``) receives a JSON ``POST`` per event it subscribes to
(``failed``, ``recovered``, ``missed``, ``paused``, ``overdue``), signed as Standard Webhooks do so that its
receiver can check that loopsq sent it: ``webhook-id`` (one per event, the same on every retry, so a receiver
drops the duplicates that at-least-once delivery allows), ``webhook-timestamp`` (unix seconds) and
``webhook-signature`` (``v1,`` + base64 HMAC-SHA256 of ``"{id}.{timestamp}.{body}"``, keyed by the base64-decoded
part of the endpoint's ``whsec_`` secret). The body carries a Slack-compatible ``text`` line, so a Slack incoming
webhook can be an endpoint as it is.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from loopsq.domain.durations import format_duration, parse_duration
from loopsq.domain.labels import check_label
from loopsq.domain.text import quoted
from loopsq.errors import ValidationError

#: Every event an endpoint may subscribe to, in the order they are listed.
EVENTS = ("failed", "recovered", "missed", "paused", "overdue")
#: What ``--on`` defaults to: ``overdue`` is opt-in (a dead-man switch alerts on loops that merely run rarely).
DEFAULT_EVENTS = ("failed", "recovered", "missed", "paused")
#: Tag filters per endpoint, and how long a URL may be.
MAX_TAGS = 20
MAX_URL = 2_000
SECRET_PREFIX = "whsec_"


def check_endpoint_name(value: Any, field: str = "notification name") -> str:
    """``value`` when it is a label; else ``<field> must be a label (<pattern>), got "<value>"``."""
    return check_label(value, field)


def check_webhook(value: Any, field: str = "webhook") -> str:
    """An ``http``/``https`` URL with a host; else ``<field> must be an http(s) URL, got "<value>"``."""
    ok = isinstance(value, str) and 0 < len(value) <= MAX_URL and not any(c.isspace() for c in value)
    if ok:
        try:
            parts = urlsplit(value)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
        except ValueError:
            ok = False
    if not ok:
        raise ValidationError(f"{field} must be an http(s) URL, got {quoted(value)}")
    return str(value)


def check_events(value: Any, field: str = "on") -> tuple[str, ...]:
    """A comma-separated text (or a list) of event names, in ``EVENTS`` order without duplicates; else
    ``<field> takes failed, recovered, missed, paused, overdue, got "<the unknown one>"``."""
    items = [part.strip() for part in value.split(",")] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValidationError(f"{field} takes {', '.join(EVENTS)}, got {quoted(value)}")
    for item in items:
        if item not in EVENTS:
            raise ValidationError(f"{field} takes {', '.join(EVENTS)}, got {quoted(item)}")
    return tuple(event for event in EVENTS if event in items)


def check_tag_filter(value: Any, field: str = "tag") -> tuple[str, str]:
    """``key:value`` (both non-empty) as a pair; else ``<field> must be key:value, got "<value>"``."""
    if isinstance(value, str) and ":" in value:
        key, _, tag_value = value.partition(":")
        if key.strip() and tag_value.strip() and len(value) <= 200:
            return key.strip(), tag_value.strip()
    raise ValidationError(f"{field} must be key:value, got {quoted(value)}")


def check_tags(value: Any, field: str = "tags") -> dict[str, str]:
    """A mapping of tag key -> value (strings), or ``key:value`` texts; at most ``MAX_TAGS``."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(v, str):
                raise ValidationError(f"{field}.{k} must be a string, got {quoted(v)}")
        pairs = [check_tag_filter(f"{k}:{v}", field) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        pairs = [check_tag_filter(item, field) for item in value]
    else:
        raise ValidationError(f"{field} must be an object of key: value, got {quoted(value)}")
    if len(pairs) > MAX_TAGS:
        raise ValidationError(f"{field} must have at most {MAX_TAGS} entries, got {len(pairs)}")
    return dict(pairs)


def check_alert_after(value: Any, field: str = "alert-after") -> int:
    """A duration text (``2h``) or milliseconds above zero, in ms; else
    ``<field> must be a duration greater than zero such as 2h, got "<value>"``."""
    ms = 0
    if isinstance(value, str):
        try:
            ms = parse_duration(value)
        except ValidationError:
            ms = 0
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    if ms <= 0:
        raise ValidationError(f"{field} must be a duration greater than zero such as 2h, got {quoted(value)}")
    return ms


def new_secret() -> str:
    """A fresh endpoint secret: ``whsec_`` + base64 of 24 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` header value (``v1,<base64 HMAC-SHA256>``) of ``body`` sent as ``msg_id`` at
    ``timestamp``, as Standard Webhooks define it."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secret: str, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """Every header of one delivery attempt."""
    return {"content-type": "application/json", "user-agent": "loopsq-notify",
            "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(secret, msg_id, timestamp, body)}


@dataclass(frozen=True)
class Endpoint:
    """A notification endpoint: where to POST, which events, which loops (tags, all when empty), and for
    ``overdue`` the silence that alerts (None: twice the loop's cadence)."""

    name: str
    url: str
    events: tuple[str, ...] = DEFAULT_EVENTS
    tags: dict[str, str] = field(default_factory=dict)
    alert_after_ms: int | None = None
    secret: str = ""
    created_at: str = ""

    def wants(self, event: str, loop_tags: Mapping[str, Any]) -> bool:
        """True when this endpoint subscribes to ``event`` and every tag filter matches the loop's tags."""
        return event in self.events and matches(self.tags, loop_tags.items())

    def to_dict(self, *, secret: bool = False) -> dict[str, Any]:
        """The public view (camelCase); the secret only when asked (shown once, at creation)."""
        out: dict[str, Any] = {"name": self.name, "webhook": self.url, "on": list(self.events),
                               "tags": dict(self.tags), "alertAfterMs": self.alert_after_ms,
                               "createdAt": self.created_at}
        if secret:
            out["secret"] = self.secret
        return out

    def to_json(self) -> str:
        """The stored form (with the secret)."""
        return json.dumps({**self.to_dict(secret=True)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, name: str, text: str) -> Endpoint:
        data = json.loads(text)
        return cls(name=name, url=data["webhook"], events=tuple(data.get("on") or DEFAULT_EVENTS),
                   tags=dict(data.get("tags") or {}), alert_after_ms=data.get("alertAfterMs"),
                   secret=data.get("secret") or "", created_at=data.get("createdAt") or "")


#: The fields of an endpoint's body (``PUT /api/notifications/{name}``, the SDK, the MCP tool).
BODY_FIELDS = ("webhook", "on", "tags", "alertAfterMs")


def endpoint_from_body(name: Any, body: Mapping[str, Any]) -> Endpoint:
    """A new endpoint (with a fresh secret, which the store keeps for an endpoint that exists) from a camelCase
    body: ``webhook`` (required), ``on`` (a list of events; default ``DEFAULT_EVENTS``), ``tags`` and
    ``alertAfterMs``.

    Raises:
        ValidationError: ``notification body takes only webhook, on, tags, alertAfterMs, got "<field>"``,
            ``webhook is required``, or the field's own check's message.
    """
    unknown = sorted(set(body) - set(BODY_FIELDS))
    if unknown:
        raise ValidationError(f"notification body takes only {', '.join(BODY_FIELDS)}, got {quoted(unknown[0])}")
    if "webhook" not in body:
        raise ValidationError("webhook is required")
    on = body.get("on")
    if on is not None and not isinstance(on, list | tuple):
        raise ValidationError(f"on must be a list of {', '.join(EVENTS)}, got {quoted(on)}")
    after = body.get("alertAfterMs")
    return Endpoint(name=check_endpoint_name(name), url=check_webhook(body["webhook"]),
                    events=DEFAULT_EVENTS if on is None else check_events(on), tags=check_tags(body.get("tags")),
                    alert_after_ms=None if after is None else check_alert_after(after, "alertAfterMs"),
                    secret=new_secret())


def summary_line(endpoint: Endpoint) -> str:
    """One line for ``notify list``."""
    tags = ",".join(f"{k}:{v}" for k, v in sorted(endpoint.tags.items()))
    after = format_duration(endpoint.alert_after_ms) if endpoint.alert_after_ms else "2x cadence"
    line = f"{endpoint.name}  {endpoint.url}  on={','.join(endpoint.events)}"
    if "overdue" in endpoint.events:
        line += f"  alert-after={after}"
    return line + (f"  tags={tags}" if tags else "")


_VERBS = {"failed": "failed", "recovered": "recovered", "missed": "missed slots", "paused": "was paused",
          "overdue": "is overdue"}


def event_text(event: str, data: Mapping[str, Any]) -> str:
    """The one human line of an event (the body's ``text``, which Slack shows)."""
    loop = data.get("loop") or "?"
    line = f"loopsq: loop {loop} {_VERBS.get(event, event)}"
    if event == "failed":
        line += f" (run {data.get('run')}, {data.get('status')}" + (
            f", exit {data['exitCode']}" if data.get("exitCode") is not None else "") + ")"
        if data.get("error"):
            line += f": {str(data['error'])[:200]}"
    elif event == "recovered":
        line += f" (run {data.get('run')} succeeded)" if data.get("run") else ""
    elif event == "missed":
        line += f" ({data.get('count', 1)} from {data.get('scheduledFor')}: {data.get('reason')})"
    elif event == "paused" and data.get("reason"):
        line += f": {data['reason']}"
    elif event == "overdue":
        line += f": no success within {format_duration(int(data.get('alertAfterMs') or 0))}"
    return line


def event_body(event: str, timestamp: str, data: Mapping[str, Any]) -> str:
    """The JSON body: ``{type, timestamp, data: {loop, run, ...}, text}``."""
    return json.dumps({"type": f"loop.{event}", "timestamp": timestamp, "data": dict(data),
                       "text": event_text(event, data)}, separators=(",", ":"), ensure_ascii=False)


def backoff_ms(attempts: int, minimum_ms: int, maximum_ms: int) -> int:
    """The wait before attempt ``attempts + 1``: ``minimum_ms`` doubled per failed attempt, capped."""
    return int(min(maximum_ms, minimum_ms * 2 ** min(max(attempts - 1, 0), 40)))


def matches(tags: Mapping[str, str], loop_tags: Iterable[tuple[str, Any]]) -> bool:
    """True when every ``key: value`` of ``tags`` is among the loop's tags."""
    have = dict(loop_tags)
    return all(k in have and str(have[k]) == v for k, v in tags.items())
