"""The JSON schemas of the create bodies (``POST /api/loops``, ``POST /api/workflows``), built from the rules the
server applies, so that the OpenAPI document says exactly what a request may hold.

Every bound comes from ``loopsq.domain.limits``; character rules are built from the same Unicode categories and
whitespace sets the validators use (``checks.INVISIBLE_CATEGORIES``, Python's ``str.strip`` for loop names,
JavaScript's trim for the reference's fields). Schedules and targets are discriminated unions by ``type``; a
target has no field its type does not have (``additionalProperties: false``, as the server refuses them), and the
later agent options carry their provider rules (``agent_options.option_problem``) as ``if``/``then``. Two of those
rules are the server's alone: codewith's forbidden ``extraArgs`` and a prompt starting with ``-`` on the argv of
a provider without ``--``.

Two rules are documented as a subset: a cron ``expression``'s pattern covers lists of values and steps and the
lowercase macros, while the server also takes ranges (``1-5``), names (``MON``), mixed case and extra spaces; a
``timezone`` is one of the IANA names of this host's zone database, while the server takes any name ``zoneinfo``
loads. Everything the patterns admit is accepted. Patterns are ECMA-262 with Unicode semantics (JSON Schema's
``u`` flag), as Python's ``re`` reads them too: characters outside the BMP appear as themselves.
"""

from __future__ import annotations

import functools
import zoneinfo
from typing import Any

from loopsq.domain import limits, tags
from loopsq.domain.agent_options import (
    CODEX_LIKE,
    CODEX_SANDBOXES,
    CURSOR_SANDBOXES,
    PERMISSION_MODES,
    SANDBOXES,
)
from loopsq.domain.budget import MAX_COST_USD, PERIODS
from loopsq.domain.jitter import JITTERED_TYPES, MAX_JITTER_MS
from loopsq.domain.labels import MAX_LABELS
from loopsq.domain.models import OVERLAP_POLICIES, RETRY_BACKOFFS
from loopsq.domain.schedules import ANCHORS, CATCH_UP_POLICIES
from loopsq.domain.targets import CONFIG_ISOLATIONS, PROMPT_VIAS, PROVIDERS
from loopsq.web.schema_patterns import SCANNED as _SCANNED  # noqa: F401  (tests scan the same planes)
from loopsq.web.schema_patterns import literal, patterns

#: Where the components live in the document.
REF = "#/components/schemas/"
def _string(max_length: int, pattern: str | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "maxLength": max_length, **extra}
    if pattern is not None:
        schema["pattern"] = patterns()[pattern]
    return schema


def _int(minimum: int, maximum: int, *, nullable: bool = False, **extra: Any) -> dict[str, Any]:
    return {"type": ["integer", "null"] if nullable else "integer", "minimum": minimum, "maximum": maximum, **extra}


def _enum(values: tuple[str, ...], *, nullable: bool = True) -> dict[str, Any]:
    return {"enum": [*values, None] if nullable else list(values)}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _args(description: str) -> dict[str, Any]:
    return {"type": "array", "maxItems": limits.MAX_ARGS, "items": _string(limits.MAX_ARG_LENGTH, "noNul"),
            "description": description}


def _timeouts() -> dict[str, Any]:
    return {
        "timeoutMs": _int(1, limits.MAX_MS, nullable=True, description="null: no timeout (default 30 minutes)."),
        "idleTimeoutMs": _int(1, limits.MAX_MS, nullable=True,
                              description="Kill after this many ms without output; null: never. An agent given "
                                          "neither timeoutMs nor idleTimeoutMs gets 30 minutes (codex) or 4 hours."),
    }


def _account() -> dict[str, Any]:
    word = _string(limits.MAX_WORD_LENGTH, "nonBlank")
    return {"type": ["object", "null"], "required": ["profile"],
            "properties": {"profile": word, "tool": _nullable(word)}}


def _env() -> dict[str, Any]:
    return {
        "type": "object",
        "maxProperties": limits.MAX_ENV_ENTRIES,
        "propertyNames": _string(limits.MAX_ENV_KEY_LENGTH, "envKey"),
        "additionalProperties": _string(limits.MAX_ENV_VALUE_LENGTH, "noNul"),
    }


def _command_target() -> dict[str, Any]:
    command = {"type": "string", "minLength": 1, "maxLength": limits.MAX_COMMAND_LENGTH}
    return {
        "type": "object",
        "required": ["type", "command"],
        "description": "Without shell true the command is one executable: no whitespace, flags go in args.",
        "properties": {
            "type": {"const": "command"},
            "command": command,
            "args": _nullable(_args("Arguments, each passed literally.")),
            "shell": {"type": ["boolean", "null"], "description": "Run through /bin/sh -c (default false)."},
            "cwd": _nullable(_string(limits.MAX_CWD_LENGTH, "nonBlank")),
            "env": _nullable(_env()),
            **_timeouts(),
            "account": _account(),
            "preflight": _preflight(),
        },
        "additionalProperties": False,
        "if": {"required": ["shell"], "properties": {"shell": {"const": True}}},
        "then": {"properties": {"command": {"pattern": patterns()["nonBlank"]}}},
        "else": {"properties": {"command": {"pattern": patterns()["noWhitespace"]}}},
    }


def _preflight() -> dict[str, Any]:
    return _nullable({"type": "object", "properties": {"beforeRun": {"type": "boolean"}},
                      "description": "beforeRun: check the executable, the account and the working directory "
                                     "before each run."})


def _agent_options() -> dict[str, Any]:
    """The later 0.3.x agent options (``agent_options``), each nullable (null: not given)."""
    text = {"type": "string", "pattern": patterns()["nonBlankAny"]}
    return {
        "env": _nullable(_env()),
        "variant": _nullable(text),
        "permissionMode": _enum(PERMISSION_MODES),
        "sandbox": _enum(SANDBOXES),
        "addDirs": _nullable({"type": "array", "maxItems": limits.MAX_ARGS,
                              "items": _string(limits.MAX_ARG_LENGTH, "nonBlank")}),
        "authProfile": _nullable(text),
        "promptSource": _nullable({"type": "object", "required": ["type", "path"],
                                   "properties": {"type": {"const": "file"}, "path": text}}),
        "preflight": _preflight(),
    }


def _for_providers_other_than(providers: tuple[str, ...], properties: dict[str, Any]) -> dict[str, Any]:
    return {"if": {"required": ["provider"], "properties": {"provider": {"enum": list(providers)}}},
            "else": {"properties": properties}}


def _agent_target() -> dict[str, Any]:
    word = _nullable(_string(limits.MAX_WORD_LENGTH, "noNul"))
    return {
        "type": "object",
        "required": ["type", "provider", "prompt"],
        "properties": {
            "type": {"const": "agent"},
            "provider": _enum(PROVIDERS, nullable=False),
            "prompt": _string(limits.MAX_PROMPT_LENGTH, "prompt"),
            "cwd": _nullable(_string(limits.MAX_CWD_LENGTH, "nonBlank")),
            "model": word,
            "agent": word,
            "extraArgs": _nullable(_args("Extra provider arguments.")),
            **_timeouts(),
            "configIsolation": _enum(CONFIG_ISOLATIONS),
            "promptVia": _enum(PROMPT_VIAS),
            "account": _account(),
            **_agent_options(),
        },
        "additionalProperties": False,
        # Provider rules the server applies (0.3.60, ``agent_options.option_problem``): opencode runs only with a
        # model; codex and codewith take no agent name; the later options each for some providers only.
        "allOf": [
            {"if": {"required": ["provider"], "properties": {"provider": {"const": "opencode"}}},
             "then": {"required": ["model"], "properties": {"model": _string(limits.MAX_WORD_LENGTH, "pyNonBlank")}}},
            {"if": {"required": ["provider"], "properties": {"provider": {"enum": list(CODEX_LIKE)}}},
             "then": {"properties": {"agent": {"type": "null"}, "sandbox": _enum(CODEX_SANDBOXES)}}},
            _for_providers_other_than(("codewith",), {"authProfile": {"type": "null"}}),
            _for_providers_other_than(CODEX_LIKE, {"addDirs": {"type": ["null", "array"], "maxItems": 0}}),
            _for_providers_other_than((*CODEX_LIKE, "cursor"), {"sandbox": {"type": "null"}}),
            _for_providers_other_than(("claude", "cursor"), {"permissionMode": _enum(("default", "bypass"))}),
            {"if": {"required": ["provider"], "properties": {"provider": {"const": "cursor"}}},
             "then": {"properties": {"variant": {"type": "null"}, "sandbox": _enum(CURSOR_SANDBOXES),
                                     "permissionMode": _enum(tuple(m for m in PERMISSION_MODES if m != "auto"))}}},
        ],
    }


def _workflow_target() -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["type", "workflowId"],
        "properties": {
            "type": {"const": "workflow"},
            "workflowId": _string(limits.MAX_WORD_LENGTH, "nonBlank",
                                  description="A stored workflow's id or active name (400 when none matches)."),
            "input": _nullable({"type": "object", "maxProperties": limits.MAX_ENV_ENTRIES,
                                "propertyNames": {"maxLength": limits.MAX_ENV_KEY_LENGTH},
                                "additionalProperties": {"type": "string",
                                                         "maxLength": limits.MAX_ENV_VALUE_LENGTH}}),
            "timeoutMs": _timeouts()["timeoutMs"],
            "preflight": _preflight(),
        },
        "additionalProperties": False,
    }


def _union(names: dict[str, str]) -> dict[str, Any]:
    return {"oneOf": [{"$ref": REF + ref} for ref in names.values()],
            "discriminator": {"propertyName": "type", "mapping": {k: REF + v for k, v in names.items()}}}


def _schedules() -> dict[str, dict[str, Any]]:
    every = _int(limits.MIN_EVERY_MS, limits.MAX_MS)
    return {
        "ScheduleOnce": {"type": "object", "required": ["type", "at"], "properties": {
            "type": {"const": "once"},
            # Written 1970-01-02 or later (``loop_spec.FIRST_ONCE_DATE``: no offset can put it before the epoch).
            "at": {**_string(limits.MAX_TIME_LENGTH, format="date-time",
                             description="A past time runs at once; a time without offset is read in timezone. "
                                         "1970-01-02 or later."),
                   "pattern": "^(?!(0[0-9]{3}|1[0-8][0-9]{2}|19[0-6][0-9])-|1970-01-01)"}}},
        "ScheduleInterval": {"type": "object", "required": ["type", "everyMs"], "properties": {
            "type": {"const": "interval"}, "everyMs": every, "anchor": _enum(ANCHORS)}},
        "ScheduleCron": {"type": "object", "required": ["type", "expression"], "properties": {
            "type": {"const": "cron"},
            "expression": _string(limits.MAX_CRON_LENGTH, "cron",
                                  description="5 fields or a macro; see the module doc for the subset.")}},
        "ScheduleDynamic": {"type": "object", "required": ["type"], "properties": {
            "type": {"const": "dynamic"}, "minIntervalMs": {**every, "type": ["integer", "null"]}}},
    }


def placement_properties(what: str) -> dict[str, Any]:
    """``requires`` and ``pool`` of a loop, a workflow or a step (``domain.placement``); ``what`` says whose runs."""
    label = _string(64, "label")
    return {
        "requires": {"type": ["array", "null"], "maxItems": MAX_LABELS, "items": label,
                     "description": f"Worker labels {what} needs, all of them (kept sorted, without duplicates)."},
        "pool": _nullable({**label, "description": f"The fleet-wide pool {what} counts against; it must exist "
                                                   "(`loopsq pool set NAME --limit N`), else 400."}),
    }


def feature_properties() -> dict[str, Any]:
    """The loop create body's steering and gate fields (``domain.loop_features``)."""
    interval = _int(limits.MIN_EVERY_MS, limits.MAX_MS, nullable=True)
    gate = {"type": "object", "required": ["command"], "additionalProperties": False, "properties": {
        "command": _string(limits.MAX_COMMAND_LENGTH, "pyNonBlank", minLength=1,
                           description="Run through /bin/sh -c before each scheduled slot; exit 0 opens the gate."),
        "timeoutMs": _int(1, limits.MAX_MS, nullable=True, description="Default 60000.")}}
    return {
        "steerable": {"type": ["boolean", "null"],
                      "description": "The run's control file may move the next slot (nextIn)."},
        "minIntervalMs": {**interval, "description": "Shortest nextIn (default 1000); needs steerable true."},
        "maxIntervalMs": {**interval, "description": "Longest nextIn (below minIntervalMs: minIntervalMs); needs steerable."},
        "gate": _nullable(gate),
        "workspace": _nullable(_string(limits.MAX_WORD_LENGTH, "workspaceKey", minLength=1,
                                       description="Loops and steps sharing this key never run at once.")),
        "workspaceWaitMs": _int(1, limits.MAX_MS, nullable=True,
                                description="How long an overlap-allow run waits for its busy workspace (600000)."),
        "budgetRuns": _nullable({"type": "object", "required": ["limit", "per"], "additionalProperties": False,
                                 "properties": {"limit": _int(1, limits.MAX_COUNT), "per": _enum(PERIODS, nullable=False)},
                                 "description": "Pause the loop once this many runs ran in the UTC day or ISO week."}),
        "budgetCost": _nullable({"type": "object", "required": ["limit", "per"], "additionalProperties": False,
                                 "properties": {"limit": {"type": "number", "exclusiveMinimum": 0,
                                                          "maximum": MAX_COST_USD},
                                                "per": _enum(PERIODS, nullable=False)},
                                 "description": "Pause the loop once its runs cost this much USD in the window."}),
        "jitterMs": _int(1, MAX_JITTER_MS, nullable=True,
                         description="Spread the slots by a deterministic per-loop offset below this (interval and "
                                     "cron schedules)."),
        **placement_properties("each run"),
    }


def loop_update(loop_create: dict[str, Any]) -> dict[str, Any]:
    """The body of ``PATCH /api/loops/{loop}`` (``domain.loop_update``): the create body's fields but the name,
    at least one, none other; a null returns a field to its default (``schedule`` and ``target`` are never null).
    The rules between fields (``workspaceWaitMs`` needs a workspace, …) hold on the merged loop, which only the
    server sees: they are checked there (400)."""
    properties = {key: value for key, value in loop_create["properties"].items() if key != "name"}
    properties.setdefault("keepRuns", _int(1, limits.MAX_COUNT, nullable=True,
                                           description="Settled runs Redis keeps for this loop (its history "
                                                       "window); null: the deployment default."))
    return {"type": "object", "minProperties": 1, "additionalProperties": False, "properties": properties,
            "description": "The fields to change; the others keep their values. The merged loop is validated as "
                           "a create is. A new schedule, timezone or jitter moves the next slot to the first one "
                           "after now."}


def tags_schema(what: str) -> dict[str, Any]:
    """``tags`` of a loop or a workflow (``domain.tags``): at most 20 ``key: value`` strings."""
    return {"type": ["object", "null"], "maxProperties": tags.MAX_TAGS,
            "propertyNames": {"maxLength": tags.MAX_KEY_LENGTH, "pattern": tags.KEY_PATTERN},
            "additionalProperties": {"type": "string", "maxLength": tags.MAX_VALUE_LENGTH,
                                     "pattern": tags.VALUE_PATTERN},
            "description": f"key: value pairs to group and filter {what} by (`?tag=key:value`); keys and values "
                           f"of {tags.TAG_CHARS}."}


@functools.cache
def components() -> dict[str, dict[str, Any]]:
    """Every create-body schema, as components of the OpenAPI document."""
    zones = sorted(zoneinfo.available_timezones())
    schedule = _union({"once": "ScheduleOnce", "interval": "ScheduleInterval", "cron": "ScheduleCron",
                       "dynamic": "ScheduleDynamic"})
    count = _int(1, limits.MAX_COUNT, nullable=True)
    ms = _int(1, limits.MAX_MS, nullable=True)
    step_target = _union({"command": "CommandTarget", "agent": "AgentTarget"})
    loop_create = {
        "type": "object",
        "required": ["name", "schedule", "target"],
        "properties": {
            "name": _string(limits.MAX_NAME_LENGTH, "loopName", minLength=1,
                            description="Trimmed; unique, and never another loop's id (409)."),
            "description": _nullable(_string(limits.MAX_DESCRIPTION_LENGTH)),
            # A pattern, not an enum: client generators name enum members after the values, and ~600 zones
            # collide once turned into identifiers (GMT0, GMT+0, GMT-0: openapi-python-client refuses the document).
            "timezone": _nullable({"type": "string", "pattern": "^(?:" + "|".join(map(literal, zones)) + ")$",
                                   "description": "An IANA zone of the server's database; default the server's."}),
            "schedule": {"$ref": REF + "Schedule"},
            "target": {"$ref": REF + "Target"},
            "catchUp": _enum(CATCH_UP_POLICIES),
            "catchUpLimit": count,
            "overlap": _enum(OVERLAP_POLICIES),
            "maxAttempts": count,
            "retryDelayMs": ms,
            "retryBackoff": _enum(RETRY_BACKOFFS),
            "retryMaxDelayMs": ms,
            "leaseMs": _int(limits.MIN_LEASE_MS, limits.MAX_MS, nullable=True),
            "expiresAt": _nullable(_string(limits.MAX_TIME_LENGTH, format="date-time")),
            "expiresAfterRuns": _int(1, limits.MAX_COUNT, nullable=True,
                                     description="Expire the loop after this many consecutive successful runs."),
            "pauseAfterFailures": _int(0, limits.MAX_COUNT, nullable=True,
                                       description="The circuit breaker: pause after this many unsuccessful runs "
                                                   "in a row; 0 turns it off (absent or null: 5)."),
            **feature_properties(),
            "tags": tags_schema("loops"),
        },
        # ``minIntervalMs``/``maxIntervalMs`` only with ``steerable: true`` (``domain.loop_features``).
        "allOf": [{"if": {"required": ["workspaceWaitMs"], "properties": {"workspaceWaitMs": {"type": "integer"}}},
                   "then": {"required": ["workspace"], "properties": {"workspace": {"type": "string"}}}},
                  {"if": {"required": ["jitterMs"], "properties": {"jitterMs": {"type": "integer"}}},
                   "then": {"properties": {"schedule": {"properties": {"type": {"enum": list(JITTERED_TYPES)}}}}}},
                  {"if": {"anyOf": [{"required": [key], "properties": {key: {"type": "integer"}}}
                                    for key in ("minIntervalMs", "maxIntervalMs")]},
                   "then": {"required": ["steerable"], "properties": {"steerable": {"const": True}}}}],
    }
    step = {
        "type": "object",
        "required": ["id", "target"],
        "properties": {
            "id": _string(limits.MAX_STEP_ID_LENGTH, "stepId", minLength=1, description="Unique in the spec."),
            "target": {"$ref": REF + "StepTarget"},
            "dependsOn": {"type": ["array", "null"], "maxItems": limits.MAX_STEPS,
                          "items": {"type": "string"}, "description": "Ids of earlier or later steps; no cycles."},
            "continueOnFailure": {"type": ["boolean", "null"]},
            "timeoutMs": _timeouts()["timeoutMs"],
            "account": _account(),
            "gate": feature_properties()["gate"],
            "workspace": feature_properties()["workspace"],
            "workspaceWaitMs": {**feature_properties()["workspaceWaitMs"],
                                "description": "How long the step waits for its busy workspace (600000)."},
            **placement_properties("the step"),
        },
        "allOf": [{"if": {"required": ["workspaceWaitMs"], "properties": {"workspaceWaitMs": {"type": "integer"}}},
                   "then": {"required": ["workspace"], "properties": {"workspace": {"type": "string"}}}}],
    }
    workflow_create = {
        "type": "object",
        "required": ["name", "steps"],
        "properties": {
            "name": _string(limits.MAX_NAME_LENGTH, "workflowName", minLength=1),
            "description": _string(limits.MAX_DESCRIPTION_LENGTH),
            "version": {"type": "number", "minimum": -limits.MAX_VERSION, "maximum": limits.MAX_VERSION},
            "maxParallel": _int(1, limits.MAX_PARALLEL, nullable=True),
            **placement_properties("the workflow"),
            "tags": tags_schema("workflows"),
            "steps": {"type": "array", "minItems": 1, "maxItems": limits.MAX_STEPS, "items": step},
        },
    }
    return {
        **_schedules(),
        "Schedule": schedule,
        "CommandTarget": _command_target(),
        "AgentTarget": _agent_target(),
        "WorkflowTarget": _workflow_target(),
        "Target": _union({"command": "CommandTarget", "agent": "AgentTarget", "workflow": "WorkflowTarget"}),
        "StepTarget": step_target,
        "LoopCreate": loop_create,
        "LoopUpdate": loop_update(loop_create),
        "WorkflowCreate": workflow_create,
    }
