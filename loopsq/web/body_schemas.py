"""The JSON schemas of the create bodies (``POST /api/loops``, ``POST /api/workflows``), built from the rules the
server applies, so that the OpenAPI document says exactly what a request may hold.

Every bound comes from ``loopsq.domain.limits``; character rules are built from the same Unicode categories and
whitespace sets the validators use (``checks.INVISIBLE_CATEGORIES``, Python's ``str.strip`` for loop names,
JavaScript's trim for the reference's fields). Schedules and targets are discriminated unions by ``type``.

Two rules are documented as a subset: a cron ``expression``'s pattern covers lists of values and steps and the
lowercase macros, while the server also takes ranges (``1-5``), names (``MON``), mixed case and extra spaces; a
``timezone`` is one of the IANA names of this host's zone database, while the server takes any name ``zoneinfo``
loads. Everything the patterns admit is accepted. Patterns are ECMA-262 with Unicode semantics (JSON Schema's
``u`` flag), as Python's ``re`` reads them too: characters outside the BMP appear as themselves.
"""

from __future__ import annotations

import functools
import unicodedata
import zoneinfo
from typing import Any

from loopsq.domain import limits, tags
from loopsq.domain.budget import MAX_COST_USD, PERIODS
from loopsq.domain.checks import INVISIBLE_CATEGORIES
from loopsq.domain.cron import MACROS
from loopsq.domain.jitter import JITTERED_TYPES, MAX_JITTER_MS
from loopsq.domain.labels import LABEL_PATTERN, MAX_LABELS
from loopsq.domain.models import OVERLAP_POLICIES, RETRY_BACKOFFS
from loopsq.domain.schedules import ANCHORS, CATCH_UP_POLICIES
from loopsq.domain.targets import CONFIG_ISOLATIONS, PROMPT_VIAS, PROVIDERS, is_js_whitespace

#: Where the components live in the document.
REF = "#/components/schemas/"
# Control and format characters exist only in planes 0, 1 and 14 (surrogates are in plane 0): scanning those is
# exact and six times faster than scanning all 1.1 million code points.
_SCANNED = (range(0, 0x20000), range(0xE0000, 0xF0000))


def _code_points(predicate: Any) -> list[int]:
    # Lone surrogates are left out: no regex engine of a JSON Schema validator can name them (Rust's cannot
    # compile such a class at all), and no valid Unicode string holds one. The server refuses them all the same.
    return [cp for span in _SCANNED for cp in span if not 0xD800 <= cp <= 0xDFFF and predicate(chr(cp))]


@functools.cache
def _sets() -> dict[str, frozenset[int]]:
    return {
        "bad": frozenset(_code_points(lambda ch: unicodedata.category(ch) in INVISIBLE_CATEGORIES)),
        "py_ws": frozenset(_code_points(str.isspace)),
        "js_ws": frozenset(cp for cp in range(0x10000) if is_js_whitespace(chr(cp))),
    }


def _escape(cp: int) -> str:
    return f"\\u{cp:04x}" if cp < 0x10000 else chr(cp)


def char_class(code_points: frozenset[int], *, negate: bool = False) -> str:
    """A regex character class of ``code_points`` (or of everything else), as ranges."""
    ranges: list[tuple[int, int]] = []
    for cp in sorted(code_points):
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    body = "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in ranges)
    return f"[{'^' if negate else ''}{body}]"


def _name_pattern(ws: frozenset[int]) -> str:
    """A name: whitespace around it is trimmed; the rest is not empty and has no invisible character."""
    bad = _sets()["bad"]
    edge, inner, space = char_class(ws | bad, negate=True), char_class(bad, negate=True), char_class(ws)
    return f"^{space}*{edge}(?:{inner}*{edge})?{space}*$"


@functools.cache
def patterns() -> dict[str, str]:
    """The patterns of the create bodies, by name (also what ``tests/unit/test_body_schemas.py`` checks)."""
    sets = _sets()
    js_ws = sets["js_ws"]
    no_nul = "[^\\u0000]"
    solid = char_class(js_ws | {0}, negate=True)
    minute, hour, dom, month, dow = (r"[1-5]?[0-9]", r"1?[0-9]|2[0-3]", r"[1-9]|[12][0-9]|3[01]",
                                     r"[1-9]|1[0-2]", r"[0-7]")
    step = r"(?:/[1-9][0-9]{0,2})?"

    def field(value: str) -> str:
        part = f"(?:\\*|{value}){step}"
        return f"{part}(?:,{part})*"

    macros = "|".join(name.lstrip("@") for name in MACROS)
    return {
        "loopName": _name_pattern(sets["py_ws"]),
        "workflowName": _name_pattern(js_ws),
        "noNul": f"^{no_nul}*$",
        "nonBlank": f"^{no_nul}*{solid}{no_nul}*$",
        # Blank as Python's str.strip sees it (the server's own checks of an opencode model and of a gate).
        "pyNonBlank": f"^{no_nul}*{char_class(sets['py_ws'] | {0}, negate=True)}{no_nul}*$",
        "noWhitespace": f"^{solid}+$",
        "cron": f"^(?:@(?:{macros})|{' '.join(field(v) for v in (minute, hour, dom, month, dow))})$",
        "stepId": f"^{limits.STEP_ID_PATTERN}$",
        "envKey": f"^{limits.ENV_KEY_PATTERN}$",
        "label": f"^{LABEL_PATTERN}$",
    }


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
            "args": _args("Arguments, each passed literally."),
            "shell": {"type": ["boolean", "null"], "description": "Run through /bin/sh -c (default false)."},
            "cwd": _string(limits.MAX_CWD_LENGTH, "nonBlank"),
            "env": _nullable(_env()),
            **_timeouts(),
            "account": _account(),
        },
        "if": {"required": ["shell"], "properties": {"shell": {"const": True}}},
        "then": {"properties": {"command": {"pattern": patterns()["nonBlank"]}}},
        "else": {"properties": {"command": {"pattern": patterns()["noWhitespace"]}}},
    }


def _agent_target() -> dict[str, Any]:
    word = _nullable(_string(limits.MAX_WORD_LENGTH, "noNul"))
    return {
        "type": "object",
        "required": ["type", "provider", "prompt"],
        "properties": {
            "type": {"const": "agent"},
            "provider": _enum(PROVIDERS, nullable=False),
            "prompt": _string(limits.MAX_PROMPT_LENGTH, "nonBlank"),
            "cwd": _nullable(_string(limits.MAX_CWD_LENGTH, "nonBlank")),
            "model": word,
            "agent": word,
            "extraArgs": _nullable(_args("Extra provider arguments.")),
            **_timeouts(),
            "configIsolation": _enum(CONFIG_ISOLATIONS),
            "promptVia": _enum(PROMPT_VIAS),
            "account": _account(),
        },
        # Provider rules the server applies (0.3.60): opencode runs only with a model; codex and codewith take no
        # agent name.
        "allOf": [
            {"if": {"required": ["provider"], "properties": {"provider": {"const": "opencode"}}},
             "then": {"required": ["model"], "properties": {"model": _string(limits.MAX_WORD_LENGTH, "pyNonBlank")}}},
            {"if": {"required": ["provider"], "properties": {"provider": {"enum": ["codex", "codewith"]}}},
             "then": {"properties": {"agent": {"type": "null"}}}},
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
        },
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
        "workspace": _nullable(_string(limits.MAX_WORD_LENGTH, "loopName", minLength=1,
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
            "timezone": {"enum": [*zones, None], "description": "IANA zone; default the server's."},
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
