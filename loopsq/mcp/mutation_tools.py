"""The mutation tools that change definitions or request runs at once: pause, resume, the three creates,
trigger, and cancel. Each is behind the mutation gate (``Tool.mutation``: ``LOOPSQ_MCP_ALLOW_MUTATIONS``, and
``LOOPSQ_MCP_ALLOW_TOOLS`` when set); bad input is refused before anything is written, with the messages of
loopsq's own validation (``new_loop``, the stores), as the API gives them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from loopsq.domain import limits
from loopsq.domain.durations import format_duration
from loopsq.domain.loop_spec import new_loop, show
from loopsq.domain.loop_update import UPDATABLE, check_patch
from loopsq.domain.models import Loop
from loopsq.domain.redaction import public_loop, public_run, public_workflow_run
from loopsq.domain.run_rules import TERMINAL, LoopRun
from loopsq.domain.targets import CONFIG_ISOLATIONS, PROMPT_VIAS, PROVIDERS
from loopsq.domain.text import shown
from loopsq.engine.cancel import request_run_cancel
from loopsq.engine.routing import arm_created, arm_updated
from loopsq.errors import NotFoundError, ValidationError
from loopsq.mcp import schemas as s
from loopsq.mcp.context import McpContext
from loopsq.mcp.registry import Call, Tool, in_thread
from loopsq.mirror import queries
from loopsq.state.loops import LoopStore
from loopsq.state.runs import RunStore
from loopsq.state.workflow_runs import WorkflowRunStore
from loopsq.state.workflows import WorkflowStore

#: How long ``run_cancel`` waits for a cancelled loop run to be recorded before it answers.
CANCEL_WAIT_S = 10.0
CANCEL_KEY_TTL_MS = 3_600_000
DEFAULT_REASON = "cancelled by user"
#: The loop body's optional fields a create tool passes through as given.
_POLICY_KEYS = tuple(k for k in s.LOOP_POLICIES if k != "schedule")


# -- lifecycle ---------------------------------------------------------------------------------------------------
def loop_pause(call: Call) -> dict[str, Any]:
    ctx = call.ctx
    return public_loop(LoopStore(ctx.client, ctx.keys).pause(call.args["idOrName"], ctx.now()).to_dict())


def loop_resume(call: Call) -> dict[str, Any]:
    ctx = call.ctx
    return public_loop(LoopStore(ctx.client, ctx.keys).resume(call.args["idOrName"], ctx.now()).to_dict())


# -- creates -----------------------------------------------------------------------------------------------------
def schedule_label(schedule: dict[str, Any], timezone: str) -> str:
    """How a schedule reads in a default description (``every 5m``, ``cron 0 9 * * 1-5 (Europe/Paris)``)."""
    kind = schedule["type"]
    if kind == "once":
        return f"once at {schedule['at']}"
    if kind == "interval":
        delay = " (fixed delay)" if schedule.get("anchor") == "fixed_delay" else ""
        return f"every {format_duration(int(schedule['everyMs']))}{delay}"
    if kind == "cron":
        return f"cron {schedule['expression']} ({timezone})"
    return f"dynamic, at least {format_duration(int(schedule['minIntervalMs']))} apart"


def default_description(loop: Loop, target_label: str) -> str:
    """The reference's default description of an MCP-created loop, naming loopsq."""
    cadence = schedule_label(loop.schedule.to_dict(), loop.timezone)
    return (f"Why: keep {loop.name} running as a loopsq scheduled automation. How: {target_label} on cadence "
            f"{cadence}. Outcome: record each run, status, retries, and evidence in loopsq for operator review.")


def _build(call: Call, target: dict[str, Any]) -> Loop:
    """The new loop from the call (``new_loop``'s validation first, then the rest of the schema); nothing stored."""
    args = call.args
    body: dict[str, Any] = {"name": args.get("name"), "schedule": args.get("schedule"), "target": target}
    body.update({key: args[key] for key in _POLICY_KEYS if key in args})
    loop = new_loop(body, call.ctx.now())
    call.check_all()
    return loop


def _store(call: Call, loop: Loop, target_label: str) -> dict[str, Any]:
    if "description" not in call.args:
        loop = replace(loop, description=default_description(loop, target_label))
    created = arm_created(call.ctx.client, call.ctx.keys, LoopStore(call.ctx.client, call.ctx.keys).create(loop))
    return public_loop(created.to_dict())


def _optional(args: Any, target: dict[str, Any], *names: str) -> dict[str, Any]:
    target.update({name: args[name] for name in names if name in args})
    return target


def loop_create_command(call: Call) -> dict[str, Any]:
    args = call.args
    target = _optional(args, {"type": "command", "command": args.get("command"), "shell": args.get("shell", False)},
                       "args", "cwd", "env", "timeoutMs", "idleTimeoutMs", "account")
    loop = _build(call, target)
    return _store(call, loop, f"command {show(loop.target['command'])}")


def loop_create_agent(call: Call) -> dict[str, Any]:
    args = call.args
    target = _optional(args, {"type": "agent", "provider": args.get("provider"), "prompt": args.get("prompt")},
                       "cwd", "model", "agent", "extraArgs", "timeoutMs", "idleTimeoutMs", "configIsolation",
                       "promptVia", "account")
    loop = _build(call, target)
    return _store(call, loop, f"{loop.target['provider']} agent")


def loop_create_workflow(call: Call) -> dict[str, Any]:
    args = call.args
    target: dict[str, Any] = {"type": "workflow", "workflowId": args.get("workflow")}
    if "workflowInput" in args:
        target["input"] = args["workflowInput"]
    loop = _build(call, _optional(args, target, "timeoutMs"))
    # An active name or any id (archived too), as `create workflow --workflow`; the loop keeps the id.
    spec = WorkflowStore(call.ctx.client, call.ctx.keys).require(str(args["workflow"]))
    loop = replace(loop, target={**loop.target, "workflowId": spec["id"]})
    return _store(call, loop, f"workflow {spec['name']}")


# -- edits in place ---------------------------------------------------------------------------------------------
def loop_update(call: Call) -> dict[str, Any]:
    """``PATCH /api/loops/{loop}`` as a tool: the changes are checked by ``domain.loop_update`` (as a create is)."""
    ctx = call.ctx
    changes = check_patch(call.args.get("changes"))
    call.check_all()
    target = changes.get("target")
    if isinstance(target, dict) and target.get("type") == "workflow" and isinstance(target.get("workflowId"), str):
        spec = WorkflowStore(ctx.client, ctx.keys).find(target["workflowId"])  # an active name, or an id
        if spec is None:
            raise ValidationError(f"target.workflowId must name a stored workflow, got {show(target['workflowId'])}")
        changes["target"] = {**target, "workflowId": spec["id"]}
    updated = LoopStore(ctx.client, ctx.keys).edit(call.args["idOrName"], changes, ctx.now())
    return public_loop(arm_updated(ctx.client, ctx.keys, updated).to_dict())


# -- runs --------------------------------------------------------------------------------------------------------
def loop_trigger(call: Call) -> dict[str, Any]:
    from loopsq.engine.triggers import trigger_with

    ctx = call.ctx
    run_id, created = trigger_with(ctx.client, ctx.keys, call.args["idOrName"], call.args.get("idempotencyKey"))
    return {"runId": run_id, "created": created}


def _await_end(ctx: McpContext, run: LoopRun) -> LoopRun:
    store, deadline = RunStore(ctx.client, ctx.keys), time.monotonic() + CANCEL_WAIT_S
    while run.status not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.1)
        run = store.get(run.id) or run
    return run


def run_cancel(call: Call) -> dict[str, Any]:
    ctx, run_id = call.ctx, call.args["runId"]
    reason = call.args.get("reason", DEFAULT_REASON)
    workflow_runs = WorkflowRunStore(ctx.client, ctx.keys)
    before = workflow_runs.load(run_id)
    if before is not None:
        state = workflow_runs.cancel(run_id, ctx.now(), reason)
        return {"kind": "workflowRun", "cancelRequested": not before.terminal,
                "workflowRun": public_workflow_run(state.run)}
    found = request_run_cancel(ctx.client, ctx.keys, run_id, ctx.now(), reason)
    if found is not None:
        run, requested = found
        return {"kind": "loopRun", "cancelRequested": requested,
                "run": public_run((_await_end(ctx, run) if requested else run).to_dict())}
    with ctx.mirror() as conn:  # past Redis's retention window: ended long ago, returned unchanged
        archived = queries.get_workflow_run(conn, run_id)
        if archived is not None:
            return {"kind": "workflowRun", "cancelRequested": False, "workflowRun": public_workflow_run(archived)}
        row = queries.get_run(conn, run_id)
    if row is None:
        raise NotFoundError(f"run not found: {shown(run_id)}")
    return {"kind": "loopRun", "cancelRequested": False, "run": public_run(row)}


# -- the tools ---------------------------------------------------------------------------------------------------
_LOOP_FIELDS = frozenset({"name", *s.LOOP_POLICIES})
_NAME = s.string("The loop's name (unique).", limits.MAX_NAME_LENGTH)
_CWD = s.string("Working directory.", limits.MAX_CWD_LENGTH)
_COMMAND = {
    "name": _NAME,
    "command": s.string("The executable (shell false) or a shell command line (shell true).",
                        limits.MAX_COMMAND_LENGTH),
    "args": s.strings("Arguments (shell false).", limits.MAX_ARGS, limits.MAX_ARG_LENGTH),
    "cwd": _CWD,
    "shell": s.boolean("Run through /bin/sh -c (default false, as the reference's MCP tool)."),
    "env": s.string_map("Extra environment (shown as '[redacted]')."),
    "timeoutMs": s.TIMEOUT_MS,
    "idleTimeoutMs": s.IDLE_TIMEOUT_MS,
    "account": s.ACCOUNT,
}
_AGENT = {
    "name": _NAME,
    "provider": {"enum": list(PROVIDERS),
                 "description": "The coding-agent CLI."},
    "prompt": s.string("The prompt (shown as its first 80 characters).", limits.MAX_PROMPT_LENGTH),
    "cwd": _CWD,
    "model": {"type": "string", "maxLength": limits.MAX_WORD_LENGTH, "description": "Model name passed to the provider."},
    "agent": {"type": "string", "maxLength": limits.MAX_WORD_LENGTH, "description": "Agent name passed to the provider."},
    "extraArgs": s.strings("Extra provider arguments.", limits.MAX_ARGS, limits.MAX_ARG_LENGTH),
    "timeoutMs": s.TIMEOUT_MS,
    "idleTimeoutMs": s.IDLE_TIMEOUT_MS,
    "configIsolation": {"enum": list(CONFIG_ISOLATIONS), "default": "safe", "description": "Provider config isolation."},
    "promptVia": {"enum": list(PROMPT_VIAS), "default": "argv",
                  "description": "stdin keeps the prompt out of the process table."},
    "account": s.ACCOUNT,
}
_WORKFLOW = {
    "name": _NAME,
    "workflow": s.WORKFLOW_REF,
    "workflowInput": s.string_map("Input handed to the workflow run."),
    "timeoutMs": s.TIMEOUT_MS,
}


def _create_schema(fields: dict[str, s.Schema], *required: str) -> s.Schema:
    return s.obj({**fields, **s.LOOP_POLICIES}, ("name", *required, "schedule"))


TOOLS = (
    Tool("loop_pause", "Pause a loop (its next run is kept).",
         s.obj({"idOrName": s.LOOP_REF}, ("idOrName",)), in_thread(loop_pause), mutation=True, idempotent=True),
    Tool("loop_resume", "Resume a loop; a stopped one is scheduled again from now.",
         s.obj({"idOrName": s.LOOP_REF}, ("idOrName",)), in_thread(loop_resume), mutation=True, idempotent=True),
    Tool("loop_create_command", "Create a loop that runs a command on a schedule.",
         _create_schema(_COMMAND, "command"), in_thread(loop_create_command), mutation=True,
         domain=_LOOP_FIELDS | frozenset(_COMMAND)),
    Tool("loop_create_agent", "Create a loop that runs a headless coding agent on a schedule.",
         _create_schema(_AGENT, "provider", "prompt"), in_thread(loop_create_agent), mutation=True,
         domain=_LOOP_FIELDS | frozenset(_AGENT)),
    Tool("loop_create_workflow", "Create a loop that runs a stored workflow on a schedule.",
         _create_schema(_WORKFLOW, "workflow"), in_thread(loop_create_workflow), mutation=True,
         domain=_LOOP_FIELDS | frozenset(_WORKFLOW)),
    Tool("loop_update", "Edit a loop in place: change only the fields given (schedule, target, policies, "
         "placement, budgets; null returns a field to its default), validated as a create. The id, name, status "
         "and history stay; a new schedule starts from now, with no catch-up of the old one's slots.",
         s.obj({"idOrName": s.LOOP_REF,
                "changes": {"type": "object", "minProperties": 1, "maxProperties": len(UPDATABLE),
                            "propertyNames": {"enum": list(UPDATABLE)},
                            "description": "The fields to change, as PATCH /api/loops/{loop} takes them (camelCase): "
                                           + ", ".join(UPDATABLE) + "."}},
               ("idOrName", "changes")),
         in_thread(loop_update), mutation=True, idempotent=True, domain=frozenset({"changes"})),
    Tool("loop_trigger", "Start a run of a loop on a worker now; the same idempotencyKey within 24 h returns the "
         "same run and starts nothing new.",
         s.obj({"idOrName": s.LOOP_REF,
                "idempotencyKey": s.string("The same key within 24 h returns the same run.",
                                           limits.MAX_IDEMPOTENCY_KEY_LENGTH)}, ("idOrName",)),
         in_thread(loop_trigger), mutation=True),
    Tool("run_cancel", "Cancel a running workflow run or loop run from any host: its process group is killed "
         "within a second; a loop run is recorded failed with the reason. An ended run is returned unchanged.",
         s.obj({"runId": s.RUN_ID, "reason": s.string("Recorded on the run (default 'cancelled by user').",
                                                      limits.MAX_REASON_LENGTH)}, ("runId",)),
         in_thread(run_cancel), mutation=True, destructive=True),
)
