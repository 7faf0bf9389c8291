"""``create`` flags for the beyond-the-reference features: steering (``--steerable``, ``--min-interval``,
``--max-interval``), the change gate (``--gate``, ``--gate-timeout``), the workspace, budgets, jitter, and where
runs may go (``--requires``, ``--pool``).

Each flag is checked here with a message naming it and quoting its value, before anything touches Redis.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import click

from loopsq.cli.options import at_least, bounded_flag, duration_flag, quote
from loopsq.domain import limits
from loopsq.domain.budget import parse_budget_flag
from loopsq.domain.checks import check_visible
from loopsq.domain.jitter import MAX_JITTER_MS
from loopsq.domain.labels import LABEL_PATTERN, MAX_LABELS
from loopsq.domain.tags import MAX_TAGS, TAG_CHARS, parse_tags
from loopsq.errors import ValidationError


def feature_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The steering and gate option group."""
    opts = [
        click.option(
            "--steerable", is_flag=True, help="Let the run's $LOOPS_CONTROL_FILE move the next slot (nextIn)."
        ),
        click.option(
            "--min-interval", metavar="DURATION", help="Shortest nextIn a steerable loop takes [1s]."
        ),
        click.option(
            "--max-interval", metavar="DURATION", help="Longest nextIn a steerable loop takes [none]."
        ),
        click.option(
            "--gate",
            metavar="CMD",
            help="Shell probe before each scheduled slot: the target runs only when it exits 0.",
        ),
        click.option("--gate-timeout", metavar="DURATION", help="Kill the gate after DURATION [60s]."),
        click.option("--workspace", metavar="KEY",
                     help="Never run at once with another loop (or step) of this workspace key, on any host."),
        click.option("--workspace-wait", metavar="DURATION",
                     help="With --overlap allow: wait this long for a busy workspace [10m]."),
        click.option("--budget-runs", metavar="N/day|week",
                     help="Pause the loop once N runs have run in the current UTC day (or ISO week)."),
        click.option("--budget-cost", metavar="AMOUNT/day|week",
                     help="Pause the loop once its agent runs have cost AMOUNT USD this day (or week)."),
        click.option("--jitter", metavar="DURATION",
                     help="Spread the slots by a deterministic per-loop offset below DURATION (--every, --cron)."),
        click.option("--requires", "requires", multiple=True, metavar="LABEL[,LABEL...]",
                     help="Run only on workers carrying every one of these labels (repeat, or comma-separated)."),
        click.option("--pool", metavar="NAME",
                     help="Count runs against this fleet-wide pool (made with: loopsq pool set NAME --limit N)."),
        tag_option,
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


#: ``--tag KEY:VALUE`` (repeatable), on ``create`` and ``update``.
tag_option = click.option("--tag", "tags", multiple=True, metavar="KEY:VALUE",
                          help=f"Tag the loop (repeat; at most {MAX_TAGS}); keys and values of {TAG_CHARS}.")


#: ``--tag KEY:VALUE`` (repeatable) as a filter, on ``list`` and ``runs``.
tag_filter_option = click.option("--tag", "tags", multiple=True, metavar="KEY:VALUE",
                                 help="Only those of loops carrying this tag (repeat: all of them).")


def tags_flag(values: Sequence[str]) -> dict[str, str]:
    """The pairs of every ``--tag`` (``domain.tags``): ``--tag must be KEY:VALUE, …, got '<value>'``."""
    return parse_tags(values, "--tag", quote)


def label_flag(flag: str, text: str) -> str:
    """A label (``domain.labels``): ``<flag> must be a label (<pattern>), got '<value>'`` otherwise."""
    if re.fullmatch(LABEL_PATTERN, text) is None:
        raise ValidationError(f"{flag} must be a label ({LABEL_PATTERN}), got {quote(text)}")
    return text


def requires_flag(values: Sequence[str]) -> list[str]:
    """The labels of every ``--requires`` (each one label or a comma-separated list), sorted, without
    duplicates, at most ``MAX_LABELS``."""
    found = {label_flag("--requires", part.strip()) for value in values for part in value.split(",")}
    if len(found) > MAX_LABELS:
        raise ValidationError(f"--requires must have at most {MAX_LABELS} labels, got {len(found)}")
    return sorted(found)


def _interval(flag: str, text: str) -> int:
    return at_least(flag, text, duration_flag(flag, text) or 0, limits.MIN_EVERY_MS)


def feature_body(opts: dict[str, Any]) -> dict[str, Any]:
    """The create body's ``steerable``, ``minIntervalMs``, ``maxIntervalMs`` and ``gate`` from the flags."""
    body: dict[str, Any] = {}
    steerable = bool(opts.get("steerable"))
    for flag, key, name in (
        ("--min-interval", "minIntervalMs", "min_interval"),
        ("--max-interval", "maxIntervalMs", "max_interval"),
    ):
        text = opts.get(name)
        if text is None:
            continue
        if not steerable:
            raise ValidationError(f"{flag} requires --steerable, got {quote(text)}")
        body[key] = _interval(flag, text)
    if steerable:
        body["steerable"] = True
    low, high = body.get("minIntervalMs"), body.get("maxIntervalMs")
    if low is not None and high is not None and high < low:
        raise ValidationError(
            f"--max-interval must be at least --min-interval, got {quote(opts['max_interval'])}"
        )
    gate, timeout = opts.get("gate"), opts.get("gate_timeout")
    if timeout is not None and gate is None:
        raise ValidationError(f"--gate-timeout requires --gate, got {quote(timeout)}")
    if gate is not None:
        if not gate.strip():
            raise ValidationError(f"--gate must be a non-empty command, got {quote(gate)}")
        body["gate"] = {"command": bounded_flag("--gate", gate, limits.MAX_COMMAND_LENGTH)}
        if timeout is not None:
            body["gate"]["timeoutMs"] = duration_flag("--gate-timeout", timeout)
    workspace, wait = opts.get("workspace"), opts.get("workspace_wait")
    if wait is not None and workspace is None:
        raise ValidationError(f"--workspace-wait requires --workspace, got {quote(wait)}")
    if workspace is not None:
        if not workspace.strip():
            raise ValidationError(f"--workspace must not be empty, got {quote(workspace)}")
        body["workspace"] = check_visible(bounded_flag("--workspace", workspace, limits.MAX_WORD_LENGTH).strip(),
                                          "--workspace", quote)
        if wait is not None:
            if opts.get("overlap") != "allow":
                raise ValidationError(f"--workspace-wait requires --overlap allow, got {quote(wait)}")
            body["workspaceWaitMs"] = duration_flag("--workspace-wait", wait)
    for flag, key, name, cost in (("--budget-runs", "budgetRuns", "budget_runs", False),
                                  ("--budget-cost", "budgetCost", "budget_cost", True)):
        if opts.get(name) is not None:
            body[key] = parse_budget_flag(flag, opts[name], cost=cost)
    jitter = opts.get("jitter")
    if jitter is not None:
        ms = duration_flag("--jitter", jitter) or 0
        if ms > MAX_JITTER_MS:
            raise ValidationError(f"--jitter must be at most 7d, got {quote(jitter)}")
        if opts.get("every") is None and opts.get("cron") is None:
            raise ValidationError(f"--jitter needs --every or --cron, got {quote(jitter)}")
        body["jitterMs"] = ms
    requires = requires_flag(opts.get("requires") or ())
    if requires:
        body["requires"] = requires
    if opts.get("pool") is not None:
        body["pool"] = label_flag("--pool", opts["pool"])
    if opts.get("tags"):
        body["tags"] = tags_flag(opts["tags"])
    return body
