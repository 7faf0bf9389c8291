"""The JSON API for workflow specs and workflow runs: list, show, create, run on a worker, cancel, recover."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query
from fastapi.responses import JSONResponse

from loopsq.domain import limits
from loopsq.domain.redaction import public_event, public_step_run, public_workflow, public_workflow_run
from loopsq.domain.tags import MAX_TAGS, TAG_PATTERN, parse_tags
from loopsq.domain.text import shown
from loopsq.domain.timeutil import gen_id
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.engine.recovery import step_alive
from loopsq.engine.routing import enqueue_for_workflow
from loopsq.errors import NotFoundError
from loopsq.mirror import queries
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore
from loopsq.web import schemas
from loopsq.web.deps import Ctx, Limit, Offset, ShowOutput, json_object, page, responses

router = APIRouter(prefix="/api")

WorkflowRef = Annotated[str, Path(description="A workflow's id, or an active workflow's name.")]
Reason = Annotated[schemas.ReasonIn | None, Body()]
#: The RQ job that executes a workflow run on a worker (as ``loopsq workflows run``).
RUN_WORKFLOW_JOB = "worker.jobs.run_workflow"


# -- specs -------------------------------------------------------------------------------------------------
@router.get("/workflows", tags=["workflows"], summary="List workflow specs",
            responses=responses(200, schemas.WorkflowList, 400))
def list_workflows(ctx: Ctx, status: Annotated[Literal["active", "archived", "all"], Query()] = "active",
                   limit: Annotated[int, Query(ge=1, le=limits.MAX_LIST_LIMIT)] = 200,
                   tag: Annotated[list[str] | None, Query(
                       max_length=MAX_TAGS, json_schema_extra={"items": {"type": "string", "pattern": TAG_PATTERN}},
                       description="Only workflows carrying this tag, `key:value` (repeat: all of them)."),
                   ] = None,
                   ) -> JSONResponse:
    """Workflow specs, newest update first (``all``: active ones first)."""
    wanted = parse_tags(tag or (), "tag", filtering=True)
    with ctx.mirror() as conn:
        specs = queries.list_workflows(conn, status=None if status == "all" else status, limit=limit, tags=wanted)
    return JSONResponse({"items": [public_workflow(spec) for spec in specs]})


@router.post("/workflows", tags=["workflows"], summary="Create a workflow spec", status_code=201,
             responses=responses(201, schemas.WorkflowOut, 400, 409),
             openapi_extra=schemas.json_body(schemas.WORKFLOW_CREATE_SCHEMA, "A workflow spec (JSON)."))
def create_workflow(ctx: Ctx, body: Annotated[Any, Body()]) -> JSONResponse:
    """Validate and store a spec; 400 names the first invalid field, 409 when an active spec has the name."""
    spec = WorkflowStore(ctx.client, ctx.keys).create(workflow_body_from_json(json_object(body)), ctx.now())
    return JSONResponse(public_workflow(spec), status_code=201, headers={"Location": f"/api/workflows/{spec['id']}"})


@router.get("/workflows/{workflow}", tags=["workflows"], summary="Show a workflow spec",
            responses=responses(200, schemas.WorkflowOut, 404))
def show_workflow(ctx: Ctx, workflow: WorkflowRef) -> JSONResponse:
    """One spec by id (archived too), else by active name."""
    with ctx.mirror() as conn:
        spec = queries.find_workflow(conn, workflow)
    if spec is None:
        raise NotFoundError(f"workflow not found: {shown(workflow)}")
    return JSONResponse(public_workflow(spec))


@router.post("/workflows/{workflow}/runs", tags=["workflows"], summary="Run a workflow on a worker",
             status_code=202, responses=responses(202, schemas.WorkflowRunQueued, 404,
                                                  description="Handed to a worker."))
def run_workflow(ctx: Ctx, workflow: WorkflowRef) -> JSONResponse:
    """Enqueue a new run for a worker and return its id at once; every call makes a new run."""
    spec = WorkflowStore(ctx.client, ctx.keys).require(workflow)
    run_id = gen_id()
    enqueue_for_workflow(ctx.client, ctx.keys, spec, run_id)
    return JSONResponse({"runId": run_id, "workflowId": spec["id"], "workflowName": spec["name"], "status": "queued"},
                        status_code=202, headers={"Location": f"/api/workflow-runs/{run_id}"})


# -- runs --------------------------------------------------------------------------------------------------
@router.get("/workflow-runs", tags=["workflow runs"], summary="List workflow runs",
            responses=responses(200, schemas.WorkflowRunPage, 400, 404))
def list_workflow_runs(
    ctx: Ctx,
    workflow: Annotated[str | None, Query(description="Only runs of this workflow (id or active name).")] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> JSONResponse:
    """Workflow runs, newest first."""
    with ctx.mirror() as conn:
        workflow_id = None
        if workflow is not None:
            spec = queries.find_workflow(conn, workflow)
            if spec is None:
                raise NotFoundError(f"workflow not found: {shown(workflow)}")
            workflow_id = spec["id"]
        items, next_offset = page(lambda n: queries.list_workflow_runs(conn, workflow_id=workflow_id, limit=n),
                                  limit, offset)
    return JSONResponse({"items": [public_workflow_run(r) for r in items], "limit": limit, "offset": offset,
                         "nextOffset": next_offset})


@router.get("/workflow-runs/{run_id}", tags=["workflow runs"], summary="Show a workflow run with steps and events",
            responses=responses(200, schemas.WorkflowRunDetail, 404))
def show_workflow_run(ctx: Ctx, run_id: str, show_output: ShowOutput = False) -> JSONResponse:
    """The run, its step runs (outputs redacted unless ``showOutput``) and all its events."""
    with ctx.mirror() as conn:
        run = queries.get_workflow_run(conn, run_id)
        if run is None:
            raise NotFoundError(f"workflow run not found: {shown(run_id)}")
        steps = queries.list_step_runs(conn, run_id)
        events = queries.list_events(conn, run_id, limit=100_000)
    return JSONResponse({"workflowRun": public_workflow_run(run),
                         "steps": [public_step_run(s, show_output) for s in steps],
                         "events": [public_event(e) for e in events]})


@router.get("/workflow-runs/{run_id}/events", tags=["workflow runs"], summary="A workflow run's events",
            responses=responses(200, schemas.EventPage, 400, 404))
def list_workflow_events(ctx: Ctx, run_id: str,
                         limit: Annotated[int, Query(ge=1, le=limits.MAX_EVENT_PAGE_LIMIT)] = 200,
                         offset: Offset = 0) -> JSONResponse:
    """Events in sequence order (gap-free: sequence = position + 1)."""
    with ctx.mirror() as conn:
        if queries.get_workflow_run(conn, run_id) is None:
            raise NotFoundError(f"workflow run not found: {shown(run_id)}")
        items, next_offset = page(lambda n: queries.list_events(conn, run_id, limit=n), limit, offset)
    return JSONResponse({"items": [public_event(e) for e in items], "limit": limit, "offset": offset,
                         "nextOffset": next_offset})


@router.post("/workflow-runs/{run_id}/cancel", tags=["workflow runs"], summary="Cancel a workflow run",
             responses=responses(200, schemas.WorkflowRunOut, 400, 404, 409))
def cancel_workflow_run(ctx: Ctx, run_id: str, body: Reason = None) -> JSONResponse:
    """Cancel from any host: pending steps are cancelled, the running step's process group is killed within a
    second. An ended run is returned unchanged."""
    reason = body.reason if body is not None and body.reason else "cancelled by user"
    state = WorkflowRunStore(ctx.client, ctx.keys).cancel(run_id, ctx.now(), reason)
    return JSONResponse(public_workflow_run(state.run))


@router.post("/workflow-runs/{run_id}/recover", tags=["workflow runs"], summary="Recover a workflow run",
             responses=responses(200, schemas.Recovered, 400, 404, 409))
def recover_workflow_run(ctx: Ctx, run_id: str, body: Reason = None) -> JSONResponse:
    """Reset the running steps of a run whose process died so a re-execution resumes it; 409 while a step's
    process is alive (checked by host, pid and start time)."""
    reason = body.reason if body is not None and body.reason else "manual recovery"
    store = WorkflowRunStore(ctx.client, ctx.keys)
    state = store.require(run_id)
    state, recovered = store.recover(run_id, ctx.now(), reason, step_alive(ctx.client, ctx.keys, state.run))
    return JSONResponse({"workflowRun": public_workflow_run(state.run), "recoveredSteps": recovered})
