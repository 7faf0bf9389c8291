"""The JSON-schema pieces of the tools' input schemas: ids, flags, the schedule as a tagged union, loop policies.

The schemas are exact: every argument is typed and bounded (every string has a ``maxLength``, every array a
``maxItems``, every map a ``maxProperties``, all from ``domain.limits``), unknown arguments are refused
(``additionalProperties: false``), and a value the schema accepts is one loopsq's validation accepts too. (The
transports bound a whole message first: ``limits.MAX_BODY_BYTES``.)
"""

from __future__ import annotations

from typing import Any

from loopsq.domain import limits, tags
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


def string(description: str, max_length: int, **extra: Any) -> Schema:
    """A non-empty string of at most ``max_length`` characters."""
    return {"type": "string", "minLength": 1, "maxLength": max_length, "description": description, **extra}


def strings(description: str, max_items: int, max_length: int) -> Schema:
    """An array of at most ``max_items`` strings, each of at most ``max_length`` characters."""
    return {"type": "array", "maxItems": max_items, "items": {"type": "string", "maxLength": max_length},
            "description": description}


def string_map(description: str) -> Schema:
    """A map of strings, bounded as a command's ``env`` (entries, key and value lengths)."""
    return {"type": "object", "maxProperties": limits.MAX_ENV_ENTRIES,
            "propertyNames": {"maxLength": limits.MAX_ENV_KEY_LENGTH},
            "additionalProperties": {"type": "string", "maxLength": limits.MAX_ENV_VALUE_LENGTH},
            "description": description}


def boolean(description: str, default: bool = False) -> Schema:
    """A boolean with its default."""
    return {"type": "boolean", "default": default, "description": description}


def integer(description: str, minimum: int = 1, maximum: int | None = None, **extra: Any) -> Schema:
    """A bounded integer."""
    schema: Schema = {"type": "integer", "minimum": minimum, "description": description, **extra}
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def milliseconds(description: str) -> Schema:
    """A positive duration in milliseconds (at most 100 years)."""
    return integer(description, 1, MAX_DURATION_MS)


#: A tag filter of the list tools: the loops (or the runs of the loops) carrying every pair (``domain.tags``).
TAG_FILTER: Schema = {"type": "object", "maxProperties": tags.MAX_TAGS,
                      "propertyNames": {"maxLength": tags.MAX_KEY_LENGTH, "pattern": tags.KEY_PATTERN},
                      "additionalProperties": {"type": "string", "maxLength": tags.MAX_VALUE_LENGTH,
                                               "pattern": tags.VALUE_PATTERN},
                      "description": "Only those of loops carrying every one of these tags ({key: value})."}
LOOP_REF = string("A loop's id or name.", limits.MAX_NAME_LENGTH)
WORKFLOW_REF = string("A workflow's id, or an active workflow's name.", limits.MAX_NAME_LENGTH)
RUN_ID = string("A loop run's or a workflow run's id.", limits.MAX_WORD_LENGTH)
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
             "at": string("ISO-8601 time; without an offset, wall time in the loop's timezone.",
                          limits.MAX_TIME_LENGTH)},
            ("type", "at")),
        obj({"type": {"const": "interval"}, "everyMs": milliseconds("The interval."),
             "anchor": {"enum": list(ANCHORS), "default": "fixed_rate",
                        "description": "fixed_rate keeps the phase; fixed_delay counts from each run's end."}},
            ("type", "everyMs")),
        obj({"type": {"const": "cron"},
             "expression": string("5 fields, names and @daily-style macros, read in the loop's timezone.",
                                  limits.MAX_CRON_LENGTH)},
            ("type", "expression")),
        obj({"type": {"const": "dynamic"}, "minIntervalMs": milliseconds("At least this long between runs "
                                                                          "(default 60000).")},
            ("type",)),
    ],
}

#: A worker label or a pool name (``domain.labels``).
LABEL: Schema = {"type": "string", "maxLength": 64, "pattern": f"^{LABEL_PATTERN}$"}

#: Options every loop create takes (the CLI's schedule and policy option group, camelCase as the API's body).
LOOP_POLICIES: dict[str, Schema] = {
    "description": {"type": "string", "maxLength": limits.MAX_DESCRIPTION_LENGTH,
                    "description": "Description (default: a Why/How/Outcome summary)."},
    "timezone": string("IANA zone for cron and bare times (default: the server host's zone).",
                       limits.MAX_TIMEZONE_LENGTH),
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
    "expiresAt": string("Stop scheduling after this ISO-8601 time.", limits.MAX_TIME_LENGTH),
    "expiresAfterRuns": integer("Expire the loop after this many consecutive successful runs."),
    "pauseAfterFailures": integer("The circuit breaker: pause the loop after this many unsuccessful runs in a row "
                                  "(default 5); 0 turns it off.", 0),
    "requires": {"type": "array", "maxItems": MAX_LABELS, "items": LABEL,
                 "description": "Run only on workers carrying every one of these labels (e.g. gpu, repo:web)."},
    "pool": {**LABEL, "description": "Count runs against this fleet-wide pool; it must exist "
                                     "(loopsq pool set NAME --limit N)."},
    "tags": {**TAG_FILTER, "description": "key: value pairs to group and filter the loop by."},
}

TIMEOUT_MS: Schema = {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_DURATION_MS,
              "description": "Kill the run after this many ms (default 30 minutes); null for no limit."}
IDLE_TIMEOUT_MS: Schema = {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_DURATION_MS,
                   "description": "Kill the run after this many ms without output; null for none. An agent given "
                                  "neither timeoutMs nor idleTimeoutMs gets 30 minutes (codex) or 4 hours."}
ACCOUNT = obj({"profile": string("The accounts profile.", limits.MAX_WORD_LENGTH),
               "tool": string("The accounts tool id.", limits.MAX_WORD_LENGTH)}, ("profile",))
