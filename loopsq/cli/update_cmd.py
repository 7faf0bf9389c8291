"""``loopsq update NAME``: edit a loop in place with the ``create`` flags that make sense on a stored loop.

The flags are checked by the same builders as ``create`` (``cli.options``, ``cli.feature_flags``), then the patch
goes through the same validation as a create (``LoopStore.edit`` → ``domain.loop_update``): one ``error:`` line
naming the flag or field and its value, exit 2, nothing changed. The loop keeps its id, name, status and history;
a new schedule starts from now (its timer is re-armed at once).
"""

from __future__ import annotations

from typing import Any

import click

from loopsq.cli.app import get_app, json_flag
from loopsq.cli.feature_flags import feature_body, tag_option, tags_flag
from loopsq.cli.options import (
    bounded_flag,
    duration_flag,
    env_body,
    env_option,
    off_or_duration_flag,
    policy_body,
    quote,
    resolve_timezone,
    schedule_body,
    update_schedule_options,
)
from loopsq.domain import limits
from loopsq.domain.jitter import MAX_JITTER_MS
from loopsq.domain.models import Loop
from loopsq.domain.redaction import public_loop
from loopsq.engine.routing import arm_updated
from loopsq.errors import ValidationError
from loopsq.state.pool_registry import require_pools

#: Said when ``update`` is given nothing to change.
NOTHING_TO_UPDATE = "nothing to update: give at least one flag to change, e.g. --every 5m or --cmd CMD"


def _target_patch(loop: Loop, opts: dict[str, Any]) -> dict[str, Any] | None:
    """The loop's target with the target flags applied (None: no target flag given)."""
    kind = loop.target_type
    target = dict(loop.target)
    given = False
    for flag, name, key, kinds, limit in (
        ("--cmd", "cmd", "command", ("command",), limits.MAX_COMMAND_LENGTH),
        ("--prompt", "prompt", "prompt", ("agent",), limits.MAX_PROMPT_LENGTH),
        ("--model", "model", "model", ("agent",), limits.MAX_WORD_LENGTH),
        ("--cwd", "cwd", "cwd", ("command", "agent"), limits.MAX_CWD_LENGTH),
    ):
        value = opts.get(name)
        if value is None:
            continue
        if kind not in kinds:
            raise ValidationError(f"{flag} applies to {' or '.join(kinds)} loops, not a {kind} loop, "
                                  f"got {quote(value)}")
        if not value.strip():
            raise ValidationError(f"{flag} must not be empty, got {quote(value)}")
        target[key] = bounded_flag(flag, value, limit)
        if key == "prompt":
            target.pop("promptSource", None)  # the prompt is no longer the file's
        given = True
    if opts.get("timeout") is not None:
        target["timeoutMs"] = duration_flag("--timeout", opts["timeout"], allow_none=True)
        given = True
    if opts.get("idle_timeout") is not None:
        if kind == "workflow":
            raise ValidationError(f"--idle-timeout applies to command or agent loops, not a workflow loop, "
                                  f"got {quote(opts['idle_timeout'])}")
        target["idleTimeoutMs"] = off_or_duration_flag("--idle-timeout", opts["idle_timeout"])
        given = True
    env = env_body(opts.get("env_pairs") or ())
    if env is not None:
        if kind == "workflow":
            raise ValidationError(f"--env applies to command or agent loops, not a workflow loop, "
                                  f"got {quote(opts['env_pairs'][0])}")
        target["env"] = env
        given = True
    return target if given else None


def update_patch(loop: Loop, opts: dict[str, Any]) -> dict[str, Any]:
    """The update body (camelCase, as ``PATCH /api/loops/{id}`` takes it) from the flags given."""
    patch: dict[str, Any] = {}
    timezone = loop.timezone
    if opts.get("timezone") is not None:
        timezone = patch["timezone"] = resolve_timezone(opts["timezone"])
    if any(opts.get(name) is not None for name in ("at", "every", "cron")) or opts.get("dynamic"):
        patch["schedule"] = schedule_body(opts, timezone)
    policies = dict(opts)
    if opts.get("retry_max_delay") is not None and opts.get("retry_backoff") is None:
        policies["retry_backoff"] = loop.retry_backoff  # checked against the loop's own backoff
    patch.update(policy_body(policies, timezone))
    jitter = opts.get("jitter")
    features = feature_body({**opts, "jitter": None})
    if jitter is not None:
        ms = duration_flag("--jitter", jitter) or 0
        if ms > MAX_JITTER_MS:
            raise ValidationError(f"--jitter must be at most 7d, got {quote(jitter)}")
        features["jitterMs"] = ms
    features.pop("tags", None)
    patch.update(features)
    if opts.get("tags") or opts.get("untag"):
        tags = {**(loop.tags or {}), **tags_flag(opts.get("tags") or ())}
        for key in opts.get("untag") or ():
            if key not in tags:
                raise ValidationError(f"--untag names no tag of the loop, got {quote(key)}")
            del tags[key]
        patch["tags"] = tags or None
    target = _target_patch(loop, opts)
    if target is not None:
        patch["target"] = target
    return patch


@click.command("update")
@click.argument("id_or_name")
@click.option("--cmd", metavar="COMMAND", help="The command to run (command loops).")
@click.option("--prompt", metavar="TEXT", help="The prompt (agent loops).")
@click.option("--model", metavar="MODEL", help="Model name passed to the provider (agent loops).")
@click.option("--cwd", metavar="DIR", help="Working directory.")
@click.option("--timeout", metavar="DURATION", help="Kill after DURATION; 'none' for no limit.")
@click.option("--idle-timeout", metavar="DURATION", help="Kill after DURATION without output; 'none' for no limit.")
@env_option
@update_schedule_options
@click.option("--gate", metavar="CMD", help="Shell probe before each scheduled slot: the target runs only on exit 0.")
@click.option("--gate-timeout", metavar="DURATION", help="Kill the gate after DURATION [60s].")
@click.option("--workspace", metavar="KEY", help="Never run at once with another loop of this workspace key.")
@click.option("--budget-runs", metavar="N/day|week", help="Pause the loop once N runs ran this UTC day (or week).")
@click.option("--budget-cost", metavar="AMOUNT/day|week", help="Pause the loop once its runs cost AMOUNT USD.")
@click.option("--jitter", metavar="DURATION", help="Spread the slots by a per-loop offset below DURATION.")
@click.option("--requires", "requires", multiple=True, metavar="LABEL[,LABEL...]",
              help="Replace the worker labels every run needs (repeat, or comma-separated).")
@click.option("--pool", metavar="NAME", help="Count runs against this fleet-wide pool (it must exist).")
@tag_option
@click.option("--untag", "untag", multiple=True, metavar="KEY", help="Remove the tag KEY (repeat).")
@json_flag
def update(id_or_name: str, **opts: Any) -> None:
    """Edit a loop in place (schedule, target, policies, budgets, placement); its id and history stay.

    A new schedule starts from now: its first slot is the first one after now, with no catch-up of the old
    schedule's slots. A run already going finishes under the definition it started with.
    """
    app = get_app()
    loop = app.loops().require(id_or_name)
    patch = update_patch(loop, opts)
    if not patch:
        raise ValidationError(NOTHING_TO_UPDATE)
    if patch.get("pool") is not None:  # named as the flag here; the store checks again, guarded
        require_pools(app.client(), app.keys, [patch["pool"]], "--pool", quote)
    updated = arm_updated(app.client(), app.keys, app.loops().edit(id_or_name, patch, app.now()))
    state = "unchanged" if updated == loop else "updated"
    app.emit(public_loop(updated.to_dict()),
             f"{state} loop {updated.id} ({updated.name}) next={updated.next_run_at or '-'}")
