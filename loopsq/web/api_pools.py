"""The JSON API for fleet-wide pools: list, show, set (``PUT``) and delete, on Redis itself (no mirror table holds
pools, so a read sees every write)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Path
from fastapi.responses import JSONResponse

from loopsq.domain.pools import POOL_NAME_SCHEMA_PATTERN, check_pool_limit, check_pool_name
from loopsq.domain.text import quoted, shown
from loopsq.errors import NotFoundError, ValidationError
from loopsq.state.pools import PoolState, PoolStore
from loopsq.web import schemas
from loopsq.web.deps import Ctx, json_object, responses

router = APIRouter(prefix="/api")

# The pattern is documented, not enforced by FastAPI, so that a bad name gets loopsq's own message (``check_pool_name``).
# ``:path``: a pool name may hold ``/``.
PoolName = Annotated[str, Path(description="A pool's name: a label.",
                               json_schema_extra={"pattern": POOL_NAME_SCHEMA_PATTERN})]


def _require(store: PoolStore, name: str) -> PoolState:
    state = store.state(check_pool_name(name))
    if state is None:
        raise NotFoundError(f"pool not found: {shown(name)}")
    return state


@router.get("/pools", tags=["pools"], summary="List pools", responses=responses(200, schemas.PoolList))
def list_pools(ctx: Ctx) -> JSONResponse:
    """Every pool, by name, with how many slots are held and how many runs wait."""
    store = PoolStore(ctx.client, ctx.keys)
    states = [state for state in (store.state(pool.name) for pool in store.list()) if state is not None]
    return JSONResponse({"items": [state.summary() for state in states]})


@router.get("/pools/{name:path}", tags=["pools"], summary="Show a pool",
            responses=responses(200, schemas.PoolOut, 400, 404))
def show_pool(ctx: Ctx, name: PoolName) -> JSONResponse:
    """The pool with its live holders (fence, since when) and its waiters (queue position, 0 = next)."""
    return JSONResponse(_require(PoolStore(ctx.client, ctx.keys), name).to_dict())


@router.put("/pools/{name:path}", tags=["pools"], summary="Create a pool or change its limit",
            responses=responses(200, schemas.PoolOut, 400),
            openapi_extra=schemas.json_body(schemas.POOL_SET_SCHEMA, "The pool's limit."))
def set_pool(ctx: Ctx, name: PoolName, body: Annotated[Any, Body()]) -> JSONResponse:
    """``{"limit": N}``: at most N runs naming the pool hold one of its slots at once; a lowered limit lets the runs
    above it finish and admits none until under it."""
    name = check_pool_name(name)
    request = json_object(body)
    unknown = sorted(set(request) - {"limit"})
    if unknown:
        raise ValidationError(f"pool body takes only limit, got {quoted(unknown[0])}")
    if "limit" not in request:
        raise ValidationError("limit is required")
    store = PoolStore(ctx.client, ctx.keys)
    store.set(name, check_pool_limit(request["limit"]))
    return JSONResponse(_require(store, name).to_dict())


@router.delete("/pools/{name:path}", tags=["pools"], summary="Remove a pool",
               responses=responses(200, schemas.PoolRemoved, 400, 404))
def delete_pool(ctx: Ctx, name: PoolName) -> JSONResponse:
    """Remove the pool; runs holding its slots finish."""
    if not PoolStore(ctx.client, ctx.keys).delete(check_pool_name(name)):
        raise NotFoundError(f"pool not found: {shown(name)}")
    return JSONResponse({"removed": True, "name": name})
