"""The JSON-schema pieces of the tools' input schemas: ids, flags, the schedule as a tagged union, loop policies.

The schemas are exact: every argument is typed and bounded, unknown arguments are refused
(``additionalProperties: false``), and a value the schema accepts is one loopsq's validation accepts too.
"""

from __future__ import annotations

from typing import Any

from loopsq.domain.durations import MAX_DURATION_MS
from loopsq.domain.labels import LABEL_PATTERN, MAX_LABELS
from loopsq.domain.models import LOOP_STATUSES, OVERLAP_POLICIES, RETRY_BACKOFFS
from loopsq.domain.run_rules import RUN_STATUSES
from loopsq.domain.schedules import ANCHORS, CATCH_UP_POLICIES

Schema = dict[str, Any]

#: Longest ``wait`` a tool accepts, in seconds.
MAX_WAIT_S = 600


def obj(properties: dict[str, Schema], required: tuple[str, ...] = ()) -> Schema:
    """An object schema with exactly these properties."""
    schema: Schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def string(description: str, **extra: Any) -> Schema:
    """A non-empty string."""
    return {"type": "string", "minLength": 1, "description": description, **extra}


def boolean(description: str, default: bool = False) -> Schema:
    """A boolean with its default."""
    return {"type": "boolean", "default": default, "description": description}


def integer(description: str, minimum: int = 1, maximum: int | None = None, **extra: Any) -> Schema:
    """A bounded integer."""
    schema: Schema = {"type": "integer", "minimum": minimum, "description": description, **extra}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def confirm(literal: str) -> Schema:
    """The second gate of a mutation tool: the exact literal."""
    return {"type": "string", "const": literal, "description": f"Must be exactly '{literal}'."}


def milliseconds(description: str) -> Schema:
    """A positive duration in milliseconds (at most 100 years)."""
    return integer(description, 1, MAX_DURATION_MS)


LOOP_REF = string("A loop's id or name.")
WORKFLOW_REF = string("A workflow's id, or an active workflow's name.")
RUN_ID = string("A loop run's or a workflow run's id.")
SHOW_OUTPUT = boolean("Include stdout and stderr (otherwise shown as '[redacted <n> chars]').")
LIMIT = integer("At most this many items.", 1, 500)
WAIT: Schema = {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S, "default": 0,
        "description": f"Seconds (at most {MAX_WAIT_S}) to wait for the run to end, with progress notifications "
                       "carrying its status and the tail of its output; 0 returns once it has started."}
LOOP_STATUS: Schema = {"enum": [*LOOP_STATUSES, "all"], "default": "all", "description": "Only loops with this status."}
RUN_STATUS: Schema = {"enum": list(RUN_STATUSES), "description": "Only runs with this status."}

#: The schedule: a tagged union on ``type``, mirroring the stored schedule.
SCHEDULE: Schema = {
    "description": "When the loop runs: once at a time, every N ms, on a cron expression, or dynamically.",
    "oneOf": [
        obj({"type": {"const": "once"},
             "at": string("ISO-8601 time; without an offset, wall time in the loop's timezone.")},
            ("type", "at")),
        obj({"type": {"const": "interval"}, "everyMs": milliseconds("The interval."),
             "anchor": {"enum": list(ANCHORS), "default": "fixed_rate",
                        "description": "fixed_rate keeps the phase; fixed_delay counts from each run's end."}},
            ("type", "everyMs")),
        obj({"type": {"const": "cron"},
             "expression": string("5 fields, names and @daily-style macros, read in the loop's timezone.")},
            ("type", "expression")),
        obj({"type": {"const": "dynamic"}, "minIntervalMs": milliseconds("At least this long between runs "
                                                                          "(default 60000).")},
            ("type",)),
    ],
}

#: A worker label or a pool name (``domain.labels``).
LABEL: Schema = {"type": "string", "pattern": f"^{LABEL_PATTERN}$"}

#: Options every loop create takes (the CLI's schedule and policy option group, camelCase as the API's body).
LOOP_POLICIES: dict[str, Schema] = {
    "description": {"type": "string", "description": "Description (default: a Why/How/Outcome summary)."},
    "timezone": string("IANA zone for cron and bare times (default: the server host's zone)."),
    "schedule": SCHEDULE,
    "catchUp": {"enum": list(CATCH_UP_POLICIES), "default": "latest", "description": "Missed slots."},
    "catchUpLimit": integer("At most this many missed slots with catchUp all (default 50)."),
    "overlap": {"enum": list(OVERLAP_POLICIES), "default": "skip",
                "description": "A slot while the previous run is still active."},
    "maxAttempts": integer("Attempts per slot (default 1)."),
    "retryDelayMs": milliseconds("Delay before retrying a failed slot (default 60000)."),
    "retryBackoff": {"enum": list(RETRY_BACKOFFS), "default": "fixed", "description": "Retry delay growth."},
    "retryMaxDelayMs": milliseconds("Cap of the exponential retry delay."),
    "leaseMs": milliseconds("Run lease length (default 1800000)."),
    "expiresAt": string("Stop scheduling after this ISO-8601 time."),
    "expiresAfterRuns": integer("Expire the loop after this many consecutive successful runs."),
    "pauseAfterFailures": integer("The circuit breaker: pause the loop after this many unsuccessful runs in a row "
                                  "(default 5); 0 turns it off.", 0),
    "requires": {"type": "array", "maxItems": MAX_LABELS, "items": LABEL,
                 "description": "Run only on workers carrying every one of these labels (e.g. gpu, repo:web)."},
    "pool": {**LABEL, "description": "Count runs against this fleet-wide pool; it must exist "
                                     "(loopsq pool set NAME --limit N)."},
}

TIMEOUT_MS: Schema = {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_DURATION_MS,
              "description": "Kill the run after this many ms (default 30 minutes); null for no limit."}
IDLE_TIMEOUT_MS: Schema = {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_DURATION_MS,
                   "description": "Kill the run after this many ms without output; null for none. An agent given "
                                  "neither timeoutMs nor idleTimeoutMs gets 30 minutes (codex) or 4 hours."}
ACCOUNT = obj({"profile": string("The accounts profile."), "tool": string("The accounts tool id.")}, ("profile",))
STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
