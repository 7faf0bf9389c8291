"""The JSON API for loops, their runs and health: reads from the caught-up mirror, writes through the stores."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

import redis
from fastapi import APIRouter, Body, Depends, Header, Path, Query
from fastapi.responses import JSONResponse

from loopsq import __version__
from loopsq.domain import limits
from loopsq.domain.checks import check_visible
from loopsq.domain.control import OUTCOMES
from loopsq.domain.loop_spec import new_loop, show
from loopsq.domain.models import LOOP_STATUSES
from loopsq.domain.redaction import public_loop, public_run
from loopsq.domain.run_rules import RUN_STATUSES
from loopsq.domain.tags import MAX_TAGS, TAG_CHARS, TAG_PATTERN, parse_tags
from loopsq.domain.text import shown
from loopsq.engine.cancel import cancel_run
from loopsq.engine.routing import arm_created, arm_updated
from loopsq.engine.triggers import trigger_with
from loopsq.errors import LoopsqError, NotFoundError, RedisUnavailableError, ValidationError
from loopsq.executor.digest import command_fields
from loopsq.mirror import pages, queries
from loopsq.mirror.follow import mirror_lag
from loopsq.ops.apply_plan import resolve_workflow_ref
from loopsq.ops.health import writes_refused
from loopsq.state.layout import LAYOUT
from loopsq.state.loops import LoopStore
from loopsq.state.workflows import WorkflowStore
from loopsq.web import filters, schemas
from loopsq.web.deps import Ctx, Limit, Offset, ShowOutput, json_object, raw_body, responses

router = APIRouter(prefix="/api")

LoopStatus = Literal["active", "paused", "stopped", "expired"]
RunStatus = Literal["running", "succeeded", "failed", "timed_out", "abandoned", "skipped", "missed"]
RunOutcome = Literal["progress", "no_op", "done", "needs_human"]
LoopRef = Annotated[str, Path(description="A loop's id or name.")]
TagFilter = Annotated[list[str] | None, Query(max_length=MAX_TAGS, json_schema_extra={"items": {
    "type": "string", "pattern": TAG_PATTERN}}, description=(
    f"Only those of loops carrying this tag, `key:value` (repeat: all of them; keys and values of {TAG_CHARS})."))]
assert set(get_args(LoopStatus)) == set(LOOP_STATUSES) and set(get_args(RunStatus)) == set(RUN_STATUSES)
assert set(get_args(RunOutcome)) == set(OUTCOMES)

#: How long a trigger's idempotency key may be (the CLI's ``--key`` and the SDK's bound too).
MAX_KEY_LENGTH = limits.MAX_IDEMPOTENCY_KEY_LENGTH


@router.get("/health", tags=["health"], summary="Liveness: Redis ping and mirror lag (no token needed)",
            responses=responses(200, schemas.Health), openapi_extra={"security": []})
def health(ctx: Ctx) -> JSONResponse:
    """Ping Redis and report how far this process's mirror is behind. 503 when Redis does not answer;
    ``degraded`` (200) with Redis's reason while it answers but refuses writes (``OOM`` at ``maxmemory``, a
    read-only replica, a long script: ``BUSY``), when runs cannot be recorded until it takes them again.

    Public by design (a probe for supervisors and load balancers): it names no entity and no URL.
    """
    try:
        refused = writes_refused(ctx.client)
        lag: int | None = None
        if refused is None or not refused.startswith("BUSY"):  # (a long script: Redis answers nothing else)
            with ctx.mirror(fresh=False) as conn:
                lag = mirror_lag(ctx.client, ctx.keys, conn)
    except redis.RedisError as exc:
        raise RedisUnavailableError("redis is unreachable") from exc
    except LoopsqError as exc:
        raise LoopsqError("the mirror database cannot be read") from exc
    if refused is not None:
        return JSONResponse({"status": "degraded", "redis": "degraded", "reason": f"writes refused: {refused}",
                             "mirrorLag": lag, "version": __version__, "layout": LAYOUT})
    return JSONResponse({"status": "ok", "redis": "ok", "mirrorLag": lag, "version": __version__, "layout": LAYOUT})


# -- loops -------------------------------------------------------------------------------------------------
@router.get("/loops", tags=["loops"], summary="List loops", responses=responses(200, schemas.LoopList, 400))
def list_loops(ctx: Ctx, status: Annotated[LoopStatus | None, Query()] = None,
               limit: Annotated[int, Query(ge=1, le=limits.MAX_LIST_LIMIT)] = 200,
               archived: Annotated[Literal["exclude", "only", "include"], Query(
                   description="Archived loops: left out (default), only them, or included.")] = "exclude",
               name: Annotated[str | None, Query(max_length=200, json_schema_extra=schemas.NAME_FILTER_SCHEMA,
                                                 description=(
                   "Only loops whose name contains this (case-insensitive); the list is then by name, in keyset "
                   "pages (`nextCursor`)."))] = None,
               cursor: Annotated[str | None, Query(max_length=400, json_schema_extra=schemas.CURSOR_SCHEMA, description=(
                   "With `name`: the `nextCursor` of the previous page."))] = None,
               tag: TagFilter = None,
               ) -> JSONResponse:
    """Loops, by status then next run (the CLI's ``list``; ``archived=only`` is ``--archived``, ``include``
    is ``--all``); with ``name``, those whose name contains it, by name, a keyset page at a time."""
    if name is not None:
        # No loop name holds a control or invisible character, and SQLite's LIKE stops at a NUL: "%00" matched
        # every loop. Such a filter is bad input.
        check_visible(name, "name")
    wanted = parse_tags(tag or (), "tag", filtering=True)
    with ctx.mirror() as conn:
        if name is None and cursor is None:
            loops = queries.list_loops(conn, status=status, limit=limit, archived=archived, tags=wanted)
            return JSONResponse({"items": [public_loop(loop) for loop in loops]})
        found = pages.loops_page(conn, name=name, status=status, archived=archived, cursor=cursor, limit=limit,
                                 tags=wanted)
    return JSONResponse({"items": [public_loop(loop) for loop in found.items], "nextCursor": found.next_cursor})


@router.post("/loops", tags=["loops"], summary="Create a loop", status_code=201,
             responses=responses(201, schemas.LoopOut, 400, 409),
             openapi_extra=schemas.json_body(schemas.LOOP_CREATE_SCHEMA, "A loop create request (camelCase)."))
def create_loop(ctx: Ctx, body: Annotated[Any, Body()]) -> JSONResponse:
    """Validate and store a loop; 400 names the first invalid field, 409 when the name is taken."""
    request = _resolve_workflow(ctx, json_object(body))
    loop = arm_created(ctx.client, ctx.keys, LoopStore(ctx.client, ctx.keys).create(new_loop(request, ctx.now())))
    return JSONResponse(public_loop(loop.to_dict()), status_code=201,
                        headers={"Location": f"/api/loops/{loop.id}"})


def _resolve_workflow(ctx: Ctx, request: dict[str, Any]) -> dict[str, Any]:
    """A workflow target names its workflow by id or active name (as ``create workflow --workflow``); the
    stored loop keeps the id. A name or id that matches no workflow is bad input."""
    return resolve_workflow_ref(request, WorkflowStore(ctx.client, ctx.keys))


@router.get("/loops/{loop}", tags=["loops"], summary="Show a loop", responses=responses(200, schemas.LoopOut, 404))
def show_loop(ctx: Ctx, loop: LoopRef) -> JSONResponse:
    """One loop by id, else by name, with the command line its runs start and its digest (``commandDigest``)."""
    with ctx.mirror() as conn:
        found = queries.find_loop(conn, loop)
    if found is None:
        raise NotFoundError(f"loop not found: {shown(loop)}")
    return JSONResponse({**public_loop(found), **command_fields(found.get("target"))})


def _lifecycle(ctx: Ctx, loop: str, verb: str) -> JSONResponse:
    store = LoopStore(ctx.client, ctx.keys)
    action = {"pause": store.pause, "resume": store.resume, "stop": store.stop, "archive": store.archive,
              "unarchive": store.unarchive}[verb]
    return JSONResponse(public_loop(action(loop, ctx.now()).to_dict()))


@router.post("/loops/{loop}/archive", tags=["loops"], summary="Archive a loop",
             responses=responses(200, schemas.LoopOut, 404, 409))
def archive_loop(ctx: Ctx, loop: LoopRef) -> JSONResponse:
    """Hidden from lists and counts and never run (an active loop is paused); 409 when already archived."""
    return _lifecycle(ctx, loop, "archive")


@router.post("/loops/{loop}/unarchive", tags=["loops"], summary="Unarchive (restore) a loop",
             responses=responses(200, schemas.LoopOut, 404, 409))
@router.post("/loops/{loop}/restore", tags=["loops"], summary="Unarchive (restore) a loop",
             responses=responses(200, schemas.LoopOut, 404, 409))
def unarchive_loop(ctx: Ctx, loop: LoopRef) -> JSONResponse:
    """Back with the status it had when archived; 409 when it is not archived."""
    return _lifecycle(ctx, loop, "unarchive")


@router.post("/loops/{loop}/rename", tags=["loops"], summary="Rename a loop",
             responses=responses(200, schemas.LoopOut, 400, 404, 409),
             openapi_extra=schemas.json_body(schemas.RENAME_SCHEMA, "The new name."))
def rename_loop(ctx: Ctx, loop: LoopRef, body: Annotated[Any, Body()]) -> JSONResponse:
    """A new name; the id and the run history stay. 409 when another loop has the name."""
    request = json_object(body)
    if set(request) != {"name"}:
        raise ValidationError(f"rename takes exactly {{\"name\": ...}}, got {show(request)}")
    renamed = LoopStore(ctx.client, ctx.keys).rename(loop, request["name"], ctx.now())
    return JSONResponse(public_loop(renamed.to_dict()))


@router.patch("/loops/{loop}", tags=["loops"], summary="Update a loop in place",
              responses=responses(200, schemas.LoopOut, 400, 404, 409),
              openapi_extra=schemas.json_body(schemas.LOOP_UPDATE_SCHEMA, "The fields to change (camelCase)."))
def update_loop(ctx: Ctx, loop: LoopRef, body: Annotated[Any, Body()]) -> JSONResponse:
    """Change the given fields, validated as a create; the id, name, status and history stay. A new schedule
    starts from now (no catch-up of the old one's slots). 409 when the loop is archived."""
    request = _resolve_workflow(ctx, json_object(body))
    updated = LoopStore(ctx.client, ctx.keys).edit(loop, request, ctx.now())
    return JSONResponse(public_loop(arm_updated(ctx.client, ctx.keys, updated).to_dict()))


@router.post("/loops/{loop}/pause", tags=["loops"], summary="Pause a loop",
             responses=responses(200, schemas.LoopOut, 404, 409))
def pause_loop(ctx: Ctx, loop: LoopRef) -> JSONResponse:
    """Status ``paused``; the next run is kept."""
    return _lifecycle(ctx, loop, "pause")


@router.post("/loops/{loop}/resume", tags=["loops"], summary="Resume a loop",
             responses=responses(200, schemas.LoopOut, 404, 409))
def resume_loop(ctx: Ctx, loop: LoopRef) -> JSONResponse:
    """Status ``active``; a stopped loop is scheduled again from now."""
    return _lifecycle(ctx, loop, "resume")


@router.post("/loops/{loop}/stop", tags=["loops"], summary="Stop a loop",
             responses=responses(200, schemas.LoopOut, 404, 409))
def stop_loop(ctx: Ctx, loop: LoopRef) -> JSONResponse:
    """Status ``stopped``; the next run is cleared."""
    return _lifecycle(ctx, loop, "stop")


@router.delete("/loops/{loop}", tags=["loops"], summary="Remove a loop",
               responses=responses(200, schemas.Removed, 404, 409))
def remove_loop(ctx: Ctx, loop: LoopRef) -> JSONResponse:
    """Delete the loop definition; its runs stay."""
    removed = LoopStore(ctx.client, ctx.keys).remove(loop, ctx.now())
    return JSONResponse({"removed": True, "id": removed.id})


@router.post("/loops/{loop}/trigger", tags=["loops"], summary="Trigger a run now",
             responses={**responses(201, schemas.Triggered, 400, 404, 409, description="A new run was reserved."),
                        200: {"model": schemas.Triggered,
                              "description": "The idempotency key already stood for this run; nothing new."}},
             openapi_extra=schemas.json_body(schemas.TRIGGER_BODY_SCHEMA, "Optional: {\"retry\": false}.",
                                             required=False))
def trigger_loop(
    ctx: Ctx,
    loop: LoopRef,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", min_length=1, max_length=MAX_KEY_LENGTH,
                                                  json_schema_extra=schemas.KEY_SCHEMA,
                                                  description="The same key within 24 h returns the same run (sent as UTF-8: "
                                                              "the same key as the CLI's --key and the SDK's).")]
    = None,
    body: Annotated[Any, Body()] = None,
    sent: Annotated[bytes, Depends(raw_body)] = b"",
    traceparent: Annotated[str | None, Header(description="W3C trace context: the run's spans are its children "
                                                          "(an invalid one is ignored).")] = None,
    tracestate: Annotated[str | None, Header(description="W3C trace state, with traceparent.")] = None,
) -> JSONResponse:
    """Start a run on a worker now. 201 with a new run id; 200 with the same run id for a repeated key. An optional
    body ``{"retry": false}`` keeps the loop's retry policy from applying to this run. 409: the loop is archived.
    A ``traceparent`` header (W3C trace context) is stored with the trigger: the run's spans are its children."""
    retry = _trigger_retry(body, sent=bool(sent.strip()))
    trace = {k: v for k, v in (("traceparent", traceparent), ("tracestate", tracestate)) if v is not None}
    run_id, created = trigger_with(ctx.client, ctx.keys, loop, header_text(idempotency_key), retry=retry,
                                   trace=trace)
    return JSONResponse({"runId": run_id, "created": created}, status_code=201 if created else 200)


def header_text(value: str | None) -> str | None:
    """A header's text as its sender wrote it: HTTP hands header bytes over as Latin-1, so the UTF-8 bytes of
    ``café`` arrive as ``cafÃ©`` and would be another idempotency key than the CLI's and the SDK's ``café``.
    Bytes that are not UTF-8 are kept as Latin-1 text."""
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def _trigger_retry(body: Any, *, sent: bool) -> bool:
    """``retry`` of a trigger's optional body (absent: true). A body that was sent must be an object: JSON's
    ``null`` is refused as the document says (FastAPI hands it over as None, as if nothing was sent)."""
    if body is None and not sent:
        return True
    request = json_object(body)
    unknown = sorted(set(request) - {"retry"})
    if unknown:
        raise ValidationError(f"trigger body takes only retry, got {show(unknown[0])}")
    retry = request.get("retry", True)
    if not isinstance(retry, bool):
        raise ValidationError(f"retry must be true or false, got {show(retry)}")
    return retry


# -- runs --------------------------------------------------------------------------------------------------
@router.get("/runs", tags=["runs"], summary="List runs", responses=responses(200, schemas.RunPage, 400, 404))
def list_runs(
    ctx: Ctx,
    loop: Annotated[str | None, Query(description="Only runs of this loop (id or name; a removed loop's too).")]
    = None,
    status: Annotated[RunStatus | None, Query()] = None,
    outcome: Annotated[RunOutcome | None, Query(description="Only runs whose control file said this outcome.")]
    = None,
    since: Annotated[str | None, Query(max_length=64, description=(
        "Only runs created at or after this time (before `until`: an empty range is 400)."),
                                       json_schema_extra=schemas.TIME_SCHEMA)] = None,
    until: Annotated[str | None, Query(max_length=64, description="Only runs created before this time.",
                                       json_schema_extra=schemas.TIME_SCHEMA)] = None,
    cursor: Annotated[str | None, Query(max_length=400, json_schema_extra=schemas.CURSOR_SCHEMA, description=(
        "The `nextCursor` of the previous page (keyset paging; cheaper than `offset` deep in a history)."))] = None,
    limit: Limit = 50,
    offset: Offset = 0,
    show_output: ShowOutput = False,
    tag: TagFilter = None,
) -> JSONResponse:
    """Run history, newest first; stdout and stderr redacted unless ``showOutput``. ``nextCursor`` (null on the
    last page) continues after this page without an offset."""
    start, end = filters.time_range(since, until, blank_is_none=False)
    wanted = parse_tags(tag or (), "tag", filtering=True)
    with ctx.mirror() as conn:
        owner: dict[str, str] = {}
        if loop is not None:
            found = queries.run_filter(conn, loop)  # a removed loop's runs too, by its id or name
            if found is None:
                raise NotFoundError(f"loop not found: {shown(loop)}")
            owner = found
        rows = pages.runs_page(conn, wanted, status=status, since=start, until=end, cursor=cursor, limit=offset + limit,
                               outcome=outcome, **owner)
    items = rows.items[offset:]
    more = rows.next_cursor is not None
    return JSONResponse({"items": [public_run(r, show_output) for r in items], "limit": limit, "offset": offset,
                         "nextOffset": offset + limit if more else None,
                         "nextCursor": rows.next_cursor if more and items else None})


@router.get("/runs/{run_id}", tags=["runs"], summary="Show a run", responses=responses(200, schemas.RunOut, 404))
def show_run(ctx: Ctx, run_id: str, show_output: ShowOutput = False) -> JSONResponse:
    """One loop run."""
    with ctx.mirror() as conn:
        run = queries.get_run(conn, run_id)
    if run is None:
        raise NotFoundError(f"run not found: {shown(run_id)}")
    return JSONResponse(public_run(run, show_output))


@router.post("/runs/{run_id}/cancel", tags=["runs"], summary="Cancel a running loop run", status_code=202,
             responses=responses(202, schemas.RunOut, 400, 404, 409,
                                 description="The worker executing the run was asked to stop it."))
def cancel_loop_run(ctx: Ctx, run_id: str, body: Annotated[schemas.ReasonIn | None, Body()] = None) -> JSONResponse:
    """Cancel a running loop run from any host: its process group is killed within a second, and the run is
    recorded failed with ``cancelled by user[: reason]`` and not retried; 409 when it is not running."""
    run = cancel_run(ctx.client, ctx.keys, run_id, ctx.now(), body.reason if body is not None else None)
    return JSONResponse(public_run(run.to_dict(), False), status_code=202)
