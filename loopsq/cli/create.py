"""``loopsq create command|agent|workflow``: build a loop from flags, validate everything, then store it."""

from __future__ import annotations

from typing import Any

import click

from loopsq.cli.agent_flags import (
    agent_option_flags,
    apply_agent_flags,
    apply_preflight_flag,
    preflight_each_run_flag,
    prompt_from_flags,
)
from loopsq.cli.app import echo_err, get_app, json_flag
from loopsq.cli.feature_flags import feature_body, feature_options
from loopsq.cli.options import (
    account_body,
    account_options,
    bounded_flag,
    duration_flag,
    env_body,
    env_option,
    off_or_duration_flag,
    policy_body,
    quote,
    resolve_timezone,
    schedule_body,
    schedule_options,
)
from loopsq.domain import limits
from loopsq.domain.agent_options import default_prompt_via
from loopsq.domain.agent_output import prompt_problem
from loopsq.domain.loop_spec import new_loop, validate_name
from loopsq.domain.models import Loop
from loopsq.domain.redaction import public_loop
from loopsq.domain.targets import PROVIDERS
from loopsq.domain.text import shown
from loopsq.engine.routing import arm_created
from loopsq.errors import ValidationError
from loopsq.state.pool_registry import require_pools


@click.group("create")
def create() -> None:
    """Create a loop (a command, a coding agent, or a workflow on a schedule)."""


def _base_body(name: str, opts: dict[str, Any]) -> tuple[dict[str, Any], str]:
    validate_name(name)
    timezone = resolve_timezone(opts.get("timezone"))
    body: dict[str, Any] = {"name": name, "timezone": timezone}
    body["schedule"] = schedule_body(opts, timezone)
    body.update(policy_body(opts, timezone))
    body.update(feature_body(opts))
    return body, timezone


def _timeouts(target: dict[str, Any], opts: dict[str, Any]) -> None:
    if opts.get("timeout") is not None:
        target["timeoutMs"] = duration_flag("--timeout", opts["timeout"], allow_none=True)
    if opts.get("idle_timeout") is not None:
        # 'none' (or 0) is stored as null: no idle timeout, where an agent loop given nothing gets the default.
        target["idleTimeoutMs"] = off_or_duration_flag("--idle-timeout", opts["idle_timeout"])


def _store(body: dict[str, Any], preflight: bool) -> Loop:
    app = get_app()
    loop = new_loop(body, app.now())
    # Named as the flag here; the store checks again, guarded, in its own words (``pool``).
    require_pools(app.client(), app.keys, [loop.pool], "--pool", quote)
    warning = None
    if preflight:
        from loopsq.executor.preflight import preflight_loop_target

        preflight_loop_target(loop.target, loop, app)
        warning = _workers_warning(loop)
    created = arm_created(app.client(), app.keys, app.loops().create(loop))
    if warning is not None:
        echo_err(f"warning: {warning}")
    return created


def _workers_warning(loop: Loop) -> str | None:
    """Why no live worker may run the loop, judged from what the workers publish; None when one can (or
    cannot tell)."""
    from loopsq.ops.fit import executable_targets, fit

    app = get_app()
    result = fit(app.client(), app.keys, executable_targets(loop.target, app.workflows()))
    if result.live == 0:
        return "no worker is live to run this loop; start `loopsq worker`"
    if not result.can and result.cannot:
        return f"no live worker can run this loop ({result.summary()})"
    return None


def _create_executable(body: dict[str, Any], target: dict[str, Any], opts: dict[str, Any], preflight: bool) -> None:
    """The rest of ``create command|agent``: timeouts and account on the target, store, print."""
    _timeouts(target, opts)
    env = env_body(opts.get("env_pairs") or ())
    if env is not None:
        target["env"] = env
    apply_preflight_flag(target, bool(opts.get("preflight_each_run")))
    account = account_body(opts)
    if account is not None:
        target["account"] = account
    body["target"] = target
    loop = _store(body, preflight)
    _print_created(loop, f"created loop {loop.id} ({loop.name}) next={loop.next_run_at or '-'}")


def _print_created(loop: Loop, human: str) -> None:
    get_app().emit(public_loop(loop.to_dict()), human)


@create.command("command")
@click.argument("name")
@click.option("--cmd", "cmd", required=True, metavar="COMMAND", help="The command to run.")
@click.option("--cwd", metavar="DIR", help="Working directory.")
@click.option("--timeout", metavar="DURATION", help="Kill after DURATION [30m]; 'none' for no limit.")
@click.option("--idle-timeout", metavar="DURATION", help="Kill after DURATION without output [none].")
@click.option("--shell/--no-shell", default=True, show_default=True, help="Run through /bin/sh -c.")
@click.option("--preflight", is_flag=True,
              help="Refuse (and store nothing) if the target cannot start here; warn if no live worker can run it.")
@preflight_each_run_flag
@env_option
@schedule_options
@feature_options
@account_options
@json_flag
def create_command(name: str, cmd: str, shell: bool, preflight: bool, **opts: Any) -> None:
    """Create a loop that runs a shell command."""
    body, _tz = _base_body(name, opts)
    if not cmd.strip():
        raise ValidationError(f"--cmd must be a non-empty command, got {quote(cmd)}")
    bounded_flag("--cmd", cmd, limits.MAX_COMMAND_LENGTH)
    if not shell and any(ch.isspace() for ch in cmd.strip()):
        raise ValidationError(
            f"--cmd must be an executable without spaces when --no-shell is given; "
            f"drop --no-shell or use a script, got {quote(cmd)}"
        )
    target: dict[str, Any] = {"type": "command", "command": cmd, "shell": shell}
    if opts.get("cwd") is not None:
        target["cwd"] = bounded_flag("--cwd", opts["cwd"], limits.MAX_CWD_LENGTH)
    _create_executable(body, target, opts, preflight)


@create.command("agent")
@click.argument("name")
@click.option("--provider", required=True, metavar="NAME", help=f"One of {', '.join(PROVIDERS)}.")
@click.option("--prompt", metavar="TEXT", help="The prompt (or --prompt-file).")
@click.option("--cwd", metavar="DIR", help="Working directory.")
@click.option("--model", metavar="MODEL", help="Model name passed to the provider.")
@click.option("--agent", "agent_name", metavar="AGENT", help="Agent name passed to the provider.")
@click.option("--extra-arg", "extra_args", multiple=True, metavar="ARG", help="Extra provider argument (repeat).")
@click.option("--timeout", metavar="DURATION", help="Kill after DURATION [none]; 'none' for no limit.")
@click.option("--idle-timeout", metavar="DURATION",
              help="Kill after DURATION without output [codex 30m, other providers 4h, unless --timeout is given]; "
                   "'none' or 0 for no idle limit.")
@click.option("--config-isolation", default="safe", show_default=True, metavar="MODE", help="safe or none.")
@click.option("--prompt-via", metavar="HOW",
              help="stdin (keeps the prompt out of the process table) or argv (after --) [stdin].")
@click.option("--preflight", is_flag=True,
              help="Refuse (and store nothing) if the target cannot start here; warn if no live worker can run it.")
@preflight_each_run_flag
@env_option
@agent_option_flags
@schedule_options
@feature_options
@account_options
@json_flag
def create_agent(
    name: str,
    provider: str,
    prompt: str | None,
    agent_name: str | None,
    extra_args: tuple[str, ...],
    config_isolation: str,
    prompt_via: str | None,
    preflight: bool,
    **opts: Any,
) -> None:
    """Create a loop that runs a headless coding agent."""
    body, _tz = _base_body(name, opts)
    if provider not in PROVIDERS:
        raise ValidationError(
            f"--provider: unsupported provider: {shown(provider)} (use one of {', '.join(PROVIDERS)})")
    prompt, prompt_source = prompt_from_flags(prompt, opts.get("prompt_file"))
    if not prompt.strip():
        raise ValidationError(f"--prompt must be a non-empty string, got {quote(prompt)}")
    problem = prompt_problem(prompt)
    if problem is not None:
        raise ValidationError(f"{'--prompt-file' if prompt_source else '--prompt'} {problem}, got {quote(prompt)}")
    bounded_flag("--prompt", prompt, limits.MAX_PROMPT_LENGTH)
    if config_isolation not in ("safe", "none"):
        raise ValidationError(f"--config-isolation must be safe or none, got {quote(config_isolation)}")
    if prompt_via is not None and prompt_via not in ("argv", "stdin"):
        raise ValidationError(f"--prompt-via must be argv or stdin, got {quote(prompt_via)}")
    target: dict[str, Any] = {"type": "agent", "provider": provider, "prompt": prompt}
    if prompt_source is not None:
        target["promptSource"] = prompt_source
    for key, flag, value, limit in (("cwd", "--cwd", opts.get("cwd"), limits.MAX_CWD_LENGTH),
                                    ("model", "--model", opts.get("model"), limits.MAX_WORD_LENGTH),
                                    ("agent", "--agent", agent_name, limits.MAX_WORD_LENGTH)):
        if value is not None:
            target[key] = bounded_flag(flag, value, limit)
    if len(extra_args) > limits.MAX_ARGS:
        raise ValidationError(f"--extra-arg may be given at most {limits.MAX_ARGS} times, got {len(extra_args)}")
    if extra_args:
        target["extraArgs"] = [bounded_flag("--extra-arg", arg, limits.MAX_ARG_LENGTH) for arg in extra_args]
    target["configIsolation"] = config_isolation
    target["promptVia"] = prompt_via or default_prompt_via(provider)
    apply_agent_flags(target, opts)
    _create_executable(body, target, opts, preflight)


@create.command("workflow")
@click.argument("name")
@click.option("--workflow", "workflow_ref", required=True, metavar="ID_OR_NAME", help="The workflow to run.")
@click.option("--timeout", metavar="DURATION", help="Time limit for the whole workflow run [none].")
@click.option("--preflight", is_flag=True, help="Refuse (and store nothing) if a step cannot start.")
@preflight_each_run_flag
@schedule_options
@feature_options
@json_flag
def create_workflow(name: str, workflow_ref: str, preflight: bool, **opts: Any) -> None:
    """Create a loop that runs a stored workflow."""
    body, _tz = _base_body(name, opts)
    target: dict[str, Any] = {"type": "workflow"}
    if opts.get("timeout") is not None:
        target["timeoutMs"] = duration_flag("--timeout", opts["timeout"], allow_none=True)
    apply_preflight_flag(target, bool(opts.get("preflight_each_run")))
    app = get_app()
    spec = app.workflows().require(workflow_ref)  # an active name, or any id (archived too), as the reference
    target["workflowId"] = spec["id"]
    body["target"] = target
    loop = _store(body, preflight)
    _print_created(
        loop,
        f"created workflow loop {loop.id} ({loop.name}) workflow={spec['name']} next={loop.next_run_at or '-'}",
    )
