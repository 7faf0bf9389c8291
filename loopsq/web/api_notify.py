"""The JSON API for notification endpoints: list, show, set (``PUT``, create or replace) and delete, on Redis
itself. Delivery is the leading scheduler's (``engine.notify``), never the web app's."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from loopsq.domain import notify as domain
from loopsq.domain.labels import LABEL_PATTERN
from loopsq.domain.text import shown
from loopsq.errors import NotFoundError
from loopsq.state.notify import NotifyStore
from loopsq.web import schemas
from loopsq.web.deps import Ctx, json_object, responses

router = APIRouter(prefix="/api")

NotificationName = Annotated[str, Path(description="A notification's name: a label.",
                                       json_schema_extra={"pattern": f"^{LABEL_PATTERN}$"})]

SET_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["webhook"], "additionalProperties": False,
    "properties": {
        "webhook": {"type": "string", "format": "uri", "description": "The http(s) URL events are POSTed to."},
        "on": {"type": "array", "items": {"type": "string", "enum": list(domain.EVENTS)},
               "description": "Events (default: failed, recovered, missed, paused)."},
        "tags": {"type": "object", "additionalProperties": {"type": "string"},
                 "description": "Only loops whose tags hold every key: value."},
        "alertAfterMs": {"type": ["integer", "null"], "minimum": 1,
                         "description": "overdue: silence that alerts (default: twice the loop's cadence)."},
    },
}


class NotificationOut(BaseModel):
    """A notification endpoint; ``secret`` only in the answer that created it."""

    name: str
    webhook: str
    on: list[str]
    tags: dict[str, str]
    alertAfterMs: int | None = None
    createdAt: str
    secret: str | None = None
    pending: int | None = None


class NotificationList(BaseModel):
    """Every notification endpoint, by name."""

    items: list[NotificationOut]


class NotificationRemoved(BaseModel):
    """A removed notification endpoint."""

    removed: bool
    name: str


def _name(name: str) -> str:
    return domain.check_endpoint_name(name)


@router.get("/notifications", tags=["notifications"], summary="List notifications",
            responses=responses(200, NotificationList))
def list_notifications(ctx: Ctx) -> JSONResponse:
    """Every notification endpoint (never its secret) with how many events wait for delivery."""
    store = NotifyStore(ctx.client, ctx.keys)
    return JSONResponse({"items": [{**e.to_dict(), "pending": store.pending_count(e.name)} for e in store.list()]})


@router.get("/notifications/{name:path}", tags=["notifications"], summary="Show a notification",
            responses=responses(200, NotificationOut, 400, 404))
def show_notification(ctx: Ctx, name: NotificationName) -> JSONResponse:
    """The endpoint (never its secret) with how many events wait for delivery."""
    store = NotifyStore(ctx.client, ctx.keys)
    endpoint = store.get(_name(name))
    if endpoint is None:
        raise NotFoundError(f"notification not found: {shown(name)}")
    return JSONResponse({**endpoint.to_dict(), "pending": store.pending_count(endpoint.name)})


@router.put("/notifications/{name:path}", tags=["notifications"], summary="Create or replace a notification",
            responses=responses(200, NotificationOut, 400),
            openapi_extra=schemas.json_body(SET_SCHEMA, "The endpoint."))
def set_notification(ctx: Ctx, name: NotificationName, body: Annotated[Any, Body()]) -> JSONResponse:
    """Create the endpoint (the answer holds its signing ``secret``, shown this once) or replace its settings
    (its secret is kept)."""
    endpoint = domain.endpoint_from_body(_name(name), json_object(body))
    saved, created = NotifyStore(ctx.client, ctx.keys).set(endpoint)
    return JSONResponse(saved.to_dict(secret=created))


@router.delete("/notifications/{name:path}", tags=["notifications"], summary="Remove a notification",
               responses=responses(200, NotificationRemoved, 400, 404))
def delete_notification(ctx: Ctx, name: NotificationName) -> JSONResponse:
    """Remove the endpoint with its undelivered events and its log."""
    if not NotifyStore(ctx.client, ctx.keys).delete(_name(name)):
        raise NotFoundError(f"notification not found: {shown(name)}")
    return JSONResponse({"removed": True, "name": name})
