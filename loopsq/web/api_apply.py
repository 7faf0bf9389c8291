"""``POST /api/apply``: ``loopsq apply`` over HTTP (``ops.apply_plan``): plan loop and workflow specs by name, and
carry the plan out unless ``dryRun``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from loopsq.domain import tags
from loopsq.domain.loop_spec import show
from loopsq.errors import ValidationError
from loopsq.ops.apply_plan import SPEC_STATUSES, check_owner, execute, plan
from loopsq.ops.apply_specs import MAX_SPECS, body_specs
from loopsq.ops.apply_workflows import WORKFLOW_FIELDS
from loopsq.web import schemas
from loopsq.web.deps import Ctx, json_object, responses

router = APIRouter(prefix="/api")

#: The body of ``POST /api/apply``.
APPLY_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["loops"], "additionalProperties": False,
    "properties": {
        "loops": {"type": "array", "maxItems": MAX_SPECS,
                  "items": {"allOf": [{"$ref": "#/components/schemas/LoopCreate"}],
                            "properties": {"status": {"enum": [*SPEC_STATUSES, None]}}},
                  "description": "Loop specs: create bodies (identity by name), each with an optional status."},
        "workflows": {"type": "array", "maxItems": MAX_SPECS,
                      "items": {"allOf": [{"$ref": "#/components/schemas/WorkflowCreate"}],
                                "propertyNames": {"enum": ["name", *WORKFLOW_FIELDS]}},
                      "description": "Workflow specs: create bodies (identity by active name), applied before the "
                                     "loops, which may name them in a workflow target's workflowId."},
        "dryRun": {"type": "boolean", "description": "Return the plan only; change nothing (default false)."},
        "owner": {"type": ["string", "null"], "maxLength": tags.MAX_VALUE_LENGTH, "pattern": tags.VALUE_PATTERN,
                  "description": "Tag the loops and workflows this apply creates apply.owner:<owner>; needed by "
                                 "prune."},
        "prune": {"type": "boolean", "description": "Remove the owner's loops (archive the owner's workflows) that "
                                                    "no spec names (default false)."},
    },
}
_KEYS = frozenset(APPLY_SCHEMA["properties"])


class ApplyStep(BaseModel):
    """One line of the plan."""

    action: str
    kind: str
    name: str
    changes: list[str]


class ApplyOut(BaseModel):
    """The plan, and whether it was carried out."""

    plan: list[ApplyStep]
    applied: bool


def _flag(request: dict[str, Any], key: str) -> bool:
    value = request.get(key, False)
    if not isinstance(value, bool):
        raise ValidationError(f"{key} must be a boolean, got {show(value)}")
    return value


@router.post("/apply", tags=["loops"], summary="Apply loop and workflow specs (plan, then create, update, prune)",
             responses=responses(200, ApplyOut, 400, 409),
             openapi_extra=schemas.json_body(APPLY_SCHEMA, "Loop and workflow specs, and how to apply them."))
def apply_specs(ctx: Ctx, body: Annotated[Any, Body()]) -> JSONResponse:
    """The plan (create, update with the fields that change, unchanged, prune; workflows first, prunes last); every
    spec is validated first, so one bad spec is a 400 and changes nothing. A loop's status is kept unless its spec
    sets it."""
    request = json_object(body)
    unknown = sorted(set(request) - _KEYS)
    if unknown:
        raise ValidationError(f"unknown apply field: {show(unknown[0])}")
    if "loops" not in request:
        raise ValidationError("loops is required")
    dry_run, prune = _flag(request, "dryRun"), _flag(request, "prune")
    owner = check_owner(request.get("owner"), prune)
    now = ctx.now()
    steps = plan(ctx.client, ctx.keys, body_specs(request["loops"], request.get("workflows", [])), now, owner,
                 prune)
    if not dry_run:
        execute(ctx.client, ctx.keys, steps, now)
    return JSONResponse({"plan": [s.public() for s in steps],
                         "applied": not dry_run})
