"""The API's documented shapes (OpenAPI): response bodies, small request bodies, and the create-body schemas.

Response models document the camelCase entities the mirror returns (the reference's public shapes, §7.3); the
routes return those entities as they are, so the models only describe them (``extra`` allowed: loopsq may add
fields). Loop and workflow create bodies are validated by ``loop_spec.new_loop`` and
``workflow_spec.workflow_body_from_json``, whose messages name the field; their JSON schemas (``body_schemas``,
referenced here) say exactly what those validators accept.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from loopsq.domain.agent_options import PERMISSION_MODES, SANDBOXES
from loopsq.domain.control import OUTCOMES
from loopsq.domain.limits import MAX_POOL_LIMIT, MAX_REASON_LENGTH
from loopsq.domain.missed import KINDS as MISSED_KINDS
from loopsq.domain.models import LOOP_STATUSES
from loopsq.domain.run_rules import RUN_STATUSES
from loopsq.mirror.pages import CURSOR_PATTERN
from loopsq.web.filters import TIME_PATTERN
from loopsq.web.schema_patterns import visible_text_pattern

# What the query parameters the server checks itself take, exactly (added to their schemas).
#: ``since``/``until``: RFC 3339 in 1970..9998 (``filters.TIME_PATTERN``); an empty value is refused.
TIME_SCHEMA: dict[str, Any] = {"format": "date-time", "pattern": TIME_PATTERN}
#: ``cursor``: any text of a cursor's shape (``pages.CURSOR_PATTERN``) is a position to continue from.
CURSOR_SCHEMA: dict[str, Any] = {"pattern": CURSOR_PATTERN}
#: A ``name`` filter: no control, format, bidi or zero-width character (``checks.check_visible``).
NAME_FILTER_SCHEMA: dict[str, Any] = {"pattern": visible_text_pattern()}
#: An ``Idempotency-Key``: visible text, not blank (``triggers.trigger_with``).
KEY_SCHEMA: dict[str, Any] = {"pattern": visible_text_pattern(non_blank=True)}
#: The trigger's optional body: ``{"retry": false}`` or nothing; no other field.
TRIGGER_BODY_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "properties": {"retry": {"type": "boolean", "description": "false: no retry policy for this run."}}}


class Entity(BaseModel):
    """A stored entity: known fields typed, others (loopsq's additions) allowed."""

    model_config = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    """What failed."""

    status: int = Field(description="The HTTP status, repeated.")
    code: Literal["bad_request", "unauthorized", "not_found", "method_not_allowed", "conflict",
                  "payload_too_large", "internal_error", "redis_unavailable"]
    message: str = Field(description="One line naming the field and the value, or what to do next.")


class ErrorBody(BaseModel):
    """The one error body of the whole API."""

    error: ErrorDetail


class LoopOut(Entity):
    """A loop (public shape: command env and agent prompts redacted)."""

    id: str
    name: str
    status: str = Field(json_schema_extra={"enum": list(LOOP_STATUSES)})
    schedule: dict[str, Any]
    target: dict[str, Any]
    nextRunAt: str | None = None
    archivedAt: str | None = Field(None, description="When the loop was archived (absent: not archived).")
    archivedFromStatus: str | None = Field(None, description="The status unarchive restores.")
    steerable: bool | None = Field(None, description="A run's control file may move the next slot (nextIn).")
    minIntervalMs: int | None = None
    maxIntervalMs: int | None = None
    gate: dict[str, Any] | None = Field(None, description="The probe before each scheduled slot.")
    jitterMs: int | None = Field(None, description="The spread of the slots; the offset is schedule.offsetMs.")
    workspace: str | None = Field(None, description="Loops sharing this key never run at once.")
    workspaceWaitMs: int | None = None
    requires: list[str] | None = Field(None, description="Worker labels every run needs (sorted).")
    pool: str | None = Field(None, description="The fleet-wide pool its runs count against.")
    budgetRuns: dict[str, Any] | None = Field(None, description="{limit, per: day|week}: runs per window.")
    budgetCost: dict[str, Any] | None = Field(None, description="{limit (USD), per: day|week}: cost per window.")
    usage: dict[str, Any] | None = Field(None, description="Runs, tokens and cost of the current day and week.")
    pauseAfterFailures: int | None = Field(None, description="The circuit breaker: pause after this many "
                                           "unsuccessful runs in a row; 0: off; absent: a loop stored before it.")
    failureStreak: int | None = Field(None, description="Unsuccessful settled slots in a row.")
    expiresAfterRuns: int | None = Field(None, description="Expire after this many consecutive successful runs.")
    successStreak: int | None = Field(None, description="Successful settled slots in a row (with expiresAfterRuns).")
    commandLine: str | None = Field(None, description="Loop detail only: the argv a command or agent run starts, "
                                    "shell-quoted (an agent prompt redacted).")
    commandEnvKeys: list[str] | None = Field(None, description="Loop detail only: the names of the variables loopsq "
                                             "gives the target (never their values).")
    commandDigest: str | None = Field(None, description="Loop detail only: cmd:sha256:<hex> of the argv, working "
                                      "directory, stdin prompt and variable names: it changes iff what runs "
                                      "changes.")
    commandError: str | None = Field(None, description="Loop detail only: why the target cannot run.")
    createdAt: str
    updatedAt: str


class LoopList(BaseModel):
    """Loops; with ``name``, ``nextCursor`` continues after this page (null on the last one)."""

    items: list[LoopOut]
    nextCursor: str | None = None


class RunOut(Entity):
    """A loop run (stdout and stderr redacted unless ``showOutput``)."""

    id: str
    loopId: str
    loopName: str
    scheduledFor: str
    attempt: int
    status: str = Field(json_schema_extra={"enum": list(RUN_STATUSES)})
    startedAt: str | None = None
    finishedAt: str | None = None
    stdout: str | None = None
    stderr: str | None = None
    error: str | None = None
    previousAttempts: list[dict[str, Any]] | None = Field(
        None, description="The slot's earlier attempts, oldest first (at most 5; output tails redacted like the run's)."
    )
    rerun: int | None = Field(None, description="Re-runs of this attempt after a worker shutdown gave it up.")
    noRetry: bool | None = Field(None, description="The caller asked that this run not be retried.")
    outcome: str | None = Field(None, description="What the run's control file said its outcome was.",
                                json_schema_extra={"enum": [*OUTCOMES, None]})
    control: dict[str, Any] | None = Field(None, description="The run's control file: outcome, nextInMs, stop, note.")
    controlWarning: str | None = Field(None, description="Why the run's control file was ignored (malformed).")
    workspace: str | None = Field(None, description="The workspace lease the run held.")
    workspaceFence: int | None = Field(None, description="The workspace lease's fencing number.")
    inputTokens: int | None = Field(None, description="Input tokens the agent reported (cached input included).")
    outputTokens: int | None = Field(None, description="Output tokens the agent reported.")
    costUsd: float | None = Field(None, description="Cost in USD the agent reported.")
    missedLast: str | None = Field(None, description=(
        "A missed run's last slot: the row stands for the slots from scheduledFor to this one, which did not run."))
    missedCount: int | None = Field(None, ge=1, description="How many slots a missed run stands for.")
    missedKind: str | None = Field(None, description="Why the slots of a missed run did not run (error: in words).",
                                   json_schema_extra={"enum": [*MISSED_KINDS, None]})


class Page(BaseModel):
    """Offset pagination: ``nextOffset`` is the offset of the next page, null on the last one."""

    limit: int
    offset: int
    nextOffset: int | None


class RunPage(Page):
    """Loop runs, newest first; ``nextCursor`` continues after this page (keyset), null on the last one."""

    items: list[RunOut]
    nextCursor: str | None = None


class WorkflowOut(Entity):
    """A workflow spec (agent prompts and step env redacted)."""

    id: str
    name: str
    status: str = Field(json_schema_extra={"enum": ["active", "archived"]})
    requires: list[str] | None = Field(None, description="Worker labels its runs need (sorted).")
    pool: str | None = Field(None, description="The fleet-wide pool its runs count against.")
    steps: list[dict[str, Any]]


class WorkflowList(BaseModel):
    """Workflow specs."""

    items: list[WorkflowOut]


class WorkflowRunOut(Entity):
    """A workflow run."""

    id: str
    workflowId: str
    workflowName: str
    status: str
    startedAt: str | None = None
    finishedAt: str | None = None
    error: str | None = None


class WorkflowRunPage(Page):
    """Workflow runs, newest first."""

    items: list[WorkflowRunOut]


class StepRunOut(Entity):
    """A step run of a workflow run (stdout and stderr redacted unless ``showOutput``)."""

    id: str
    workflowRunId: str
    stepId: str
    sequence: int
    status: str


class EventOut(Entity):
    """A workflow run event (sensitive payload keys redacted)."""

    id: str
    workflowRunId: str
    sequence: int
    eventType: str
    stepId: str | None = None
    payload: Any = None
    createdAt: str


class EventPage(Page):
    """A workflow run's events by sequence."""

    items: list[EventOut]


class WorkflowRunDetail(BaseModel):
    """A workflow run with its steps and events."""

    workflowRun: WorkflowRunOut
    steps: list[StepRunOut]
    events: list[EventOut]


class Triggered(BaseModel):
    """A triggered loop run: ``created`` is false when the idempotency key already stood for this run."""

    runId: str
    created: bool


class WorkflowRunQueued(BaseModel):
    """A workflow run handed to a worker; it appears under ``/api/workflow-runs/{runId}`` once picked up."""

    runId: str
    workflowId: str
    workflowName: str
    status: Literal["queued"]


class Removed(BaseModel):
    """A removed loop definition (its runs stay)."""

    removed: bool
    id: str


class PoolSummary(BaseModel):
    """A fleet-wide pool and its use: live holders (``inUse``) and waiters still asking (``waiting``)."""

    name: str
    limit: int
    inUse: int
    waiting: int


class PoolList(BaseModel):
    """Every pool, by name."""

    items: list[PoolSummary]


class PoolHolder(BaseModel):
    """A live holder of a pool slot: its fencing number, since when it holds the slot, its lease's time left."""

    holder: str
    fence: int
    since: str
    expiresInMs: int


class PoolWaiter(BaseModel):
    """A waiter still asking: its place in the queue (0: next), since when it waits, when it last asked."""

    holder: str
    position: int
    since: str
    lastAskedAt: str


class PoolOut(PoolSummary):
    """A pool with its live holders (by fence) and its waiters (in queue order)."""

    holders: list[PoolHolder]
    waiters: list[PoolWaiter]


class PoolRemoved(BaseModel):
    """A removed pool (runs holding its slots finish)."""

    removed: bool
    name: str


class Recovered(BaseModel):
    """A recovered workflow run and the steps reset to pending."""

    workflowRun: WorkflowRunOut
    recoveredSteps: list[str]


class Health(BaseModel):
    """Liveness: Redis answers (``degraded``: but refuses writes, for ``reason``); how many changes this process's
    mirror has not applied yet (null while Redis runs a long script and answers nothing else)."""

    status: Literal["ok", "degraded"]
    redis: Literal["ok", "degraded"]
    reason: str | None = None
    mirrorLag: int | None
    #: This process's release (``loopsq --version``) and the state layout it reads and writes (``state.layout``).
    version: str
    layout: int


class ReasonIn(BaseModel):
    """An optional reason recorded on the run and its steps."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, min_length=1, max_length=MAX_REASON_LENGTH)


_MS = {"type": "integer", "minimum": 1}
#: Agent target fields besides provider, prompt and model (``loopsq.domain.agent_options``).
AGENT_OPTION_SCHEMAS: dict[str, Any] = {
    "agent": {"type": "string"},
    "extraArgs": {"type": "array", "items": {"type": "string"}},
    "configIsolation": {"enum": ["safe", "none"]},
    "promptVia": {"enum": ["argv", "stdin"], "description": "Default for a new target: stdin."},
    "promptSource": {"type": "object", "required": ["type", "path"],
                     "properties": {"type": {"enum": ["file"]}, "path": {"type": "string", "minLength": 1}}},
    "variant": {"type": "string", "minLength": 1, "description": "Reasoning effort."},
    "permissionMode": {"enum": list(PERMISSION_MODES)},
    "sandbox": {"enum": list(SANDBOXES), "description": "codex/codewith: the first three; cursor: enabled|disabled."},
    "addDirs": {"type": "array", "items": {"type": "string", "minLength": 1}, "description": "codex, codewith."},
    "authProfile": {"type": "string", "minLength": 1, "description": "codewith only."},
    "preflight": {"type": "object", "properties": {"beforeRun": {"type": "boolean"}},
                  "description": "beforeRun: preflight the target before every run."},
}
#: The body of ``POST /api/loops`` (the SDK's camelCase create request) and of ``POST /api/workflows`` (a spec, as
#: ``loopsq workflows create`` reads it from a file): components built by ``body_schemas``.
LOOP_CREATE_SCHEMA: dict[str, Any] = {"$ref": "#/components/schemas/LoopCreate"}
WORKFLOW_CREATE_SCHEMA: dict[str, Any] = {"$ref": "#/components/schemas/WorkflowCreate"}
#: The body of ``PATCH /api/loops/{loop}``.
LOOP_UPDATE_SCHEMA: dict[str, Any] = {"$ref": "#/components/schemas/LoopUpdate"}


#: The body of ``PUT /api/pools/{name}``.
POOL_SET_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["limit"], "additionalProperties": False,
    "properties": {"limit": {"type": "integer", "minimum": 1, "maximum": MAX_POOL_LIMIT}},
}

#: The body of ``POST /api/loops/{loop}/rename``.
RENAME_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 200}},
}


def json_body(schema: dict[str, Any], description: str, *, required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` documenting a JSON request body the route reads itself."""
    return {"requestBody": {"required": required, "description": description,
                            "content": {"application/json": {"schema": schema}}}}
