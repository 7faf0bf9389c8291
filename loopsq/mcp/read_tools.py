"""The read-only tools: the reference's (``loops_list``, ``loops_show``, ``loop_runs``, ``loops_doctor``,
``workflows_list``, ``workflow_read``, ``workflow_validate``) and loopsq's ``workflow_run_inspect``.

They read the caught-up mirror, as the CLI does, and redact as the CLI does: command ``env`` and agent prompts
always, run and step output unless ``showOutput``.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from loopsq.domain import limits
from loopsq.domain.redaction import (
    public_event,
    public_loop,
    public_run,
    public_step_run,
    public_workflow,
    public_workflow_run,
)
from loopsq.domain.tags import validate_tags
from loopsq.domain.text import shown
from loopsq.domain.workflow_spec import workflow_body_from_json
from loopsq.errors import NotFoundError, ValidationError
from loopsq.mcp import schemas as s
from loopsq.mcp.registry import Call, Tool, in_thread
from loopsq.mirror import queries

BOTH_WORKFLOW_ARGS = "use workflow or workflowJson, not both"
NO_WORKFLOW_ARG = "workflow or workflowJson is required"


def _find_loop(conn: sqlite3.Connection, ref: str) -> dict[str, Any]:
    loop = queries.find_loop(conn, ref)
    if loop is None:
        raise NotFoundError(f"loop not found: {shown(ref)}")
    return loop


def _find_workflow(conn: sqlite3.Connection, ref: str) -> dict[str, Any]:
    spec = queries.find_workflow(conn, ref)
    if spec is None:
        raise NotFoundError(f"workflow not found: {shown(ref)}")
    return spec


def loops_list(call: Call) -> dict[str, Any]:
    args = call.args
    status = args.get("status", "all")
    archived = "only" if args.get("archivedOnly") else "include" if args.get("includeArchived") else "exclude"
    with call.ctx.mirror() as conn:
        loops = queries.list_loops(conn, status=None if status == "all" else status, limit=args.get("limit", 200),
                                   archived=archived, tags=validate_tags(args.get("tags")))
    return {"items": [public_loop(loop) for loop in loops]}


def loops_show(call: Call) -> dict[str, Any]:
    args = call.args
    with call.ctx.mirror() as conn:
        loop = _find_loop(conn, args["idOrName"])
        result = public_loop(loop)
        if args.get("includeLatestRun"):
            latest = queries.list_runs(conn, loop_id=loop["id"], limit=1)
            result["latestRun"] = public_run(latest[0], args.get("showOutput", False)) if latest else None
    return result


def loop_runs(call: Call) -> dict[str, Any]:
    args = call.args
    with call.ctx.mirror() as conn:
        loop_id = _find_loop(conn, args["idOrName"])["id"] if "idOrName" in args else None
        rows = queries.list_runs(conn, loop_id=loop_id, status=args.get("status"), limit=args.get("limit", 50),
                                 tags=validate_tags(args.get("tags")))
    return {"items": [public_run(r, args.get("showOutput", False)) for r in rows]}


def loops_doctor(call: Call) -> dict[str, Any]:
    from loopsq.ops.doctor import run_doctor

    ok, checks = run_doctor(call.ctx.redis_url, call.ctx.data_dir, call.ctx.keys)
    return {"ok": ok, "checks": [c.to_dict() for c in checks]}


def workflows_list(call: Call) -> dict[str, Any]:
    args = call.args
    status, limit, offset = args.get("status", "active"), args.get("limit", 200), args.get("offset", 0)
    with call.ctx.mirror() as conn:
        specs = queries.list_workflows(conn, status=None if status == "all" else status, limit=offset + limit + 1,
                                       tags=validate_tags(args.get("tags")))
    page = specs[offset:offset + limit]
    return {"items": [public_workflow(spec) for spec in page], "limit": limit, "offset": offset,
            "nextOffset": offset + limit if len(specs) > offset + limit else None}


def _run_detail(conn: sqlite3.Connection, run: dict[str, Any], show_output: bool, events: bool) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "workflowRun": public_workflow_run(run),
        "steps": [public_step_run(step, show_output) for step in queries.list_step_runs(conn, run["id"])],
    }
    if events:
        detail["events"] = [public_event(e) for e in queries.list_events(conn, run["id"], limit=100_000)]
    return detail


def workflow_read(call: Call) -> dict[str, Any]:
    args = call.args
    show_output, events = args.get("showOutput", False), args.get("includeEvents", False)
    with call.ctx.mirror() as conn:
        spec = _find_workflow(conn, args["idOrName"])
        result: dict[str, Any] = {"workflow": public_workflow(spec)}
        if args.get("includeRuns") or events:
            runs = queries.list_workflow_runs(conn, workflow_id=spec["id"], limit=args.get("runLimit", 20))
            result["runs"] = [_run_detail(conn, run, show_output, events) for run in runs]
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_workflow_json(text: str) -> Any:
    try:
        # JSON has no NaN or Infinity, though Python's decoder accepts them by default (as workflow files).
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"workflowJson is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
                              ) from exc
    except (ValueError, RecursionError) as exc:
        raise ValidationError(f"workflowJson is not valid JSON: {exc}") from exc


def workflow_validate(call: Call) -> dict[str, Any]:
    args = call.args
    if "workflow" in args and "workflowJson" in args:
        raise ValidationError(BOTH_WORKFLOW_ARGS)
    if "workflow" not in args and "workflowJson" not in args:
        raise ValidationError(NO_WORKFLOW_ARG)
    value = args["workflow"] if "workflow" in args else _parse_workflow_json(str(args["workflowJson"]))
    body = workflow_body_from_json(value, args.get("name"))
    result: dict[str, Any] = {"valid": True, "workflow": public_workflow({"id": "validation", **body})}
    if args.get("preflight"):
        from loopsq.executor.preflight import preflight_workflow_body

        result["preflight"] = preflight_workflow_body(body)
    return result


def workflow_run_inspect(call: Call) -> dict[str, Any]:
    run_id = call.args["runId"]
    with call.ctx.mirror() as conn:
        run = queries.get_workflow_run(conn, run_id)
        if run is None:
            raise NotFoundError(f"workflow run not found: {shown(run_id)}")
        return _run_detail(conn, run, call.args.get("showOutput", False), events=True)


TOOLS = (
    Tool("loops_list", "List loops (command env and agent prompts redacted); archived loops only with "
         "includeArchived (them too) or archivedOnly (only them).",
         s.obj({"status": s.LOOP_STATUS, "limit": {**s.LIMIT, "default": 200},
                "includeArchived": s.boolean("Archived loops too."),
                "archivedOnly": s.boolean("Only archived loops."),
                "tags": s.TAG_FILTER}),
         in_thread(loops_list)),
    Tool("loops_show", "Show one loop by id or name (redacted); with includeLatestRun, its newest run as "
         "latestRun.",
         s.obj({"idOrName": s.LOOP_REF, "includeLatestRun": s.boolean("Add the newest run as latestRun."),
                "showOutput": s.SHOW_OUTPUT}, ("idOrName",)),
         in_thread(loops_show)),
    Tool("loop_runs", "Run history, newest first (of one loop when idOrName is given); output redacted unless "
         "showOutput.",
         s.obj({"idOrName": s.LOOP_REF, "status": s.RUN_STATUS, "limit": {**s.LIMIT, "default": 50},
                "showOutput": s.SHOW_OUTPUT, "tags": s.TAG_FILTER}),
         in_thread(loop_runs)),
    Tool("loops_doctor", "The checks of `loopsq doctor`: Redis, data dir, mirror, live schedulers and workers, "
         "provider CLIs, the accounts CLI, a preflight of every active loop.",
         s.obj({}), in_thread(loops_doctor)),
    Tool("workflows_list", "List workflow specs (agent prompts and step env redacted), newest update first.",
         s.obj({"status": {"enum": ["active", "archived", "all"], "default": "active"},
                "limit": {**s.LIMIT, "default": 200},
                "offset": s.integer("Items to skip.", 0, 100_000, default=0),
                "tags": {**s.TAG_FILTER, "description": "Only workflows carrying every one of these tags."}}),
         in_thread(workflows_list)),
    Tool("workflow_read", "One workflow spec; with includeRuns its newest runs (steps, output redacted unless "
         "showOutput), with includeEvents each run's events too.",
         s.obj({"idOrName": s.WORKFLOW_REF, "includeRuns": s.boolean("Add the newest runs with their steps."),
                "includeEvents": s.boolean("Add each run's events (implies includeRuns)."),
                "runLimit": s.integer("At most this many runs.", 1, 500, default=20),
                "showOutput": s.SHOW_OUTPUT}, ("idOrName",)),
         in_thread(workflow_read)),
    Tool("workflow_validate", "Check a workflow spec without storing it (as `loopsq workflows validate`): give "
         "it as an object (workflow) or as JSON text (workflowJson).",
         s.obj({"workflow": {"type": "object", "maxProperties": 16,
                             "properties": {"steps": {"type": "array", "maxItems": limits.MAX_STEPS}},
                             "description": "The spec: {name, description?, maxParallel?, "
                             "steps: [{id, target, dependsOn?, continueOnFailure?, timeoutMs?}]}."},
                "workflowJson": {"type": "string", "maxLength": limits.MAX_SPEC_FILE_BYTES,
                                 "description": "The spec as JSON text."},
                "name": s.string("Use this name instead of the spec's.", limits.MAX_NAME_LENGTH),
                "preflight": s.boolean("Also check every step's executable and account.")}),
         in_thread(workflow_validate)),
    Tool("workflow_run_inspect", "A workflow run with its steps and events (as `loopsq workflows inspect`); step "
         "output redacted unless showOutput.",
         s.obj({"runId": s.string("A workflow run's id.", limits.MAX_WORD_LENGTH), "showOutput": s.SHOW_OUTPUT},
               ("runId",)),
         in_thread(workflow_run_inspect)),
)
