"""The notification tools: list the endpoints and their delivery logs (read-only), add or replace one and remove
one (mutations, behind the gate: ``LOOPSQ_MCP_ALLOW_MUTATIONS``, and ``LOOPSQ_MCP_ALLOW_TOOLS`` when set). They
act on Redis as ``loopsq notify`` and ``/api/notifications`` do (``state.notify``); a new endpoint's signing
secret is in the answer that made it, once, as the API gives it; never afterwards.
"""

from __future__ import annotations

from typing import Any

from loopsq.domain import notify
from loopsq.domain.labels import LABEL_PATTERN
from loopsq.mcp import schemas as s
from loopsq.mcp.registry import Call, Tool, in_thread
from loopsq.state.notify import LOG_SIZE, NotifyStore

_NAME = s.string("The notification's name: a label.", 64, pattern=f"^{LABEL_PATTERN}$")


def _store(call: Call) -> NotifyStore:
    return NotifyStore(call.ctx.client, call.ctx.keys)


def notifications_list(call: Call) -> dict[str, Any]:
    return {"items": _store(call).listing()}


def notification_log(call: Call) -> dict[str, Any]:
    return {"items": _store(call).logs(call.args.get("name"), call.args.get("limit", 20))}


def notification_add(call: Call) -> dict[str, Any]:
    args = call.args
    endpoint = notify.endpoint_from_body(args.get("name"), {k: v for k, v in args.items() if k != "name"})
    call.check_all()
    saved, created = _store(call).set(endpoint)
    return saved.to_dict(secret=created)


def notification_remove(call: Call) -> dict[str, Any]:
    _store(call).require_remove(call.args["name"])
    return {"removed": True, "name": call.args["name"]}


_ADD = {
    "name": _NAME,
    "webhook": s.string("The http(s) URL each event is POSTed to, signed as Standard Webhooks do.", notify.MAX_URL),
    "on": {"type": "array", "minItems": 1, "maxItems": len(notify.EVENTS),
           "items": {"enum": list(notify.EVENTS)},
           "description": "Events (default: " + ", ".join(notify.DEFAULT_EVENTS) + ")."},
    "tags": {"type": "object", "maxProperties": notify.MAX_TAGS, "propertyNames": {"maxLength": 200},
             "additionalProperties": {"type": "string", "maxLength": 200},
             "description": "Only loops carrying every one of these tags ({key: value}); none: every loop."},
    "alertAfterMs": s.milliseconds("overdue: alert when a loop has not succeeded for this long (default: twice "
                                   "its cadence)."),
}

#: The read-only tools (listed with the other reads) and the mutations (listed last).
READ_TOOLS = (
    Tool("notifications_list", "List the notification endpoints: name, webhook, events, tag filters, overdue "
         "threshold and how many events wait for delivery (never their secrets).",
         s.obj({}), in_thread(notifications_list)),
    Tool("notification_log", "The latest delivery attempts of one notification (of each when no name is given), "
         "newest first: event type and id, attempt, HTTP status, delivered or not.",
         s.obj({"name": _NAME, "limit": s.integer("At most this many attempts per notification (default 20).", 1,
                                                  LOG_SIZE)}),
         in_thread(notification_log)),
)
MUTATION_TOOLS = (
    Tool("notification_add", "Add a notification endpoint, or replace its settings (its secret is kept): a signed "
         "JSON POST to the webhook when a loop fails, recovers, misses slots, pauses or is overdue. The answer that "
         "creates it holds its signing secret, this once.",
         s.obj(_ADD, ("name", "webhook")), in_thread(notification_add), mutation=True, idempotent=True,
         domain=frozenset(_ADD)),
    Tool("notification_remove", "Remove a notification endpoint, with its undelivered events and its log.",
         s.obj({"name": _NAME}, ("name",)), in_thread(notification_remove), mutation=True, destructive=True),
)
