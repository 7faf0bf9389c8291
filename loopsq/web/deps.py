"""Shared pieces of the API routes: the context dependency, pagination, body checks and documented responses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Request
from pydantic import BaseModel

from loopsq.domain import limits
from loopsq.domain.loop_spec import show
from loopsq.errors import ValidationError
from loopsq.web.context import WebContext
from loopsq.web.schemas import ErrorBody

T = TypeVar("T")

_ERROR_TEXT = {
    400: "Bad input: the message names the field and quotes the value; nothing was changed.",
    401: "Missing or wrong API token; nothing was changed.",
    404: "Not found.",
    409: "Refused in the current state; nothing was changed.",
    413: "The request body is larger than the bound (1 MiB); it was not read; nothing was changed.",
    500: "Internal error.",
    503: "Redis is unreachable.",
}


async def get_ctx(request: Request) -> WebContext:
    """The app's shared context."""
    ctx: WebContext = request.app.state.ctx
    return ctx


Ctx = Annotated[WebContext, Depends(get_ctx)]


async def raw_body(request: Request) -> bytes:
    """The request's body as sent (read once, before the route runs; ``BodyLimit`` bounds it)."""
    return await request.body()
Limit = Annotated[int, Query(ge=1, le=limits.MAX_PAGE_LIMIT, description="Page size.")]
Offset = Annotated[int, Query(ge=0, le=limits.MAX_OFFSET, description="Items to skip (newest first).")]
ShowOutput = Annotated[bool, Query(alias="showOutput", description="Include stdout and stderr.")]


def error_responses(*errors: int) -> dict[int | str, Any]:
    """OpenAPI responses for each error status (401, 500 and 503 always) with the one error body."""
    return {status: {"model": ErrorBody, "description": _ERROR_TEXT[status]}
            for status in sorted({*errors, 401, 500, 503})}


def responses(ok: int, model: type[BaseModel], *errors: int, description: str = "Success.") -> dict[int | str, Any]:
    """OpenAPI responses: ``ok`` with ``model``, then the error statuses (see ``error_responses``)."""
    return {ok: {"model": model, "description": description}, **error_responses(*errors)}


def page(fetch: Callable[[int], Sequence[T]], limit: int, offset: int) -> tuple[list[T], int | None]:
    """One page of a newest-first list: ``fetch(n)`` returns the first ``n`` items; returns the page and the
    next page's offset (None on the last page)."""
    rows = list(fetch(offset + limit + 1))
    items = rows[offset:offset + limit]
    return items, (offset + limit if len(rows) > offset + limit else None)


def json_object(body: Any) -> dict[str, Any]:
    """The request body as a JSON object; 400 otherwise."""
    if not isinstance(body, dict):
        if isinstance(body, bytes | bytearray):
            raise ValidationError("request body must be a JSON object (Content-Type: application/json)")
        raise ValidationError(f"request body must be a JSON object, got {show(body)}")
    return body
