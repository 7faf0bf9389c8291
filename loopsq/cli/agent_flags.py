"""The later 0.3.x flags of ``create agent`` (``--prompt-file``, ``--variant``, ``--permission-mode``,
``--sandbox``, ``--add-dir``, ``--auth-profile``) and ``--preflight-each-run`` of every ``create``, checked with
flag-named messages before anything is stored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from loopsq.domain import agent_options
from loopsq.errors import ValidationError
from loopsq.system.prompt_files import read_prompt_file

#: The flag of each target field, for messages.
FLAGS = {
    "variant": "--variant",
    "permissionMode": "--permission-mode",
    "sandbox": "--sandbox",
    "addDirs": "--add-dir",
    "authProfile": "--auth-profile",
    "agent": "--agent",
    "extraArgs": "--extra-arg",
    "model": "--model",
    "promptVia": "--prompt-via",
    "prompt": "--prompt",
}


def _q(value: Any) -> str:
    return "'" + str(value).replace("'", "\\'") + "'"


def agent_option_flags(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The agent option flags (0.3.26-0.3.60)."""
    opts = [
        click.option("--prompt-file", metavar="PATH",
                     help="Read the prompt from PATH now (stored with promptSource); instead of --prompt."),
        click.option("--variant", metavar="EFFORT", help="Reasoning effort (claude --effort; codex/codewith "
                     "model_reasoning_effort; opencode/aicopilot --variant)."),
        click.option("--permission-mode", metavar="MODE",
                     help=f"{'|'.join(agent_options.PERMISSION_MODES)} (per provider: see the README)."),
        click.option("--sandbox", metavar="MODE", help="codex/codewith: read-only|workspace-write|"
                     "danger-full-access; cursor: enabled|disabled."),
        click.option("--add-dir", "add_dirs", metavar="DIR", multiple=True,
                     help="Another writable directory (codex, codewith; repeat)."),
        click.option("--auth-profile", metavar="PROFILE", help="codewith's own auth profile (codewith only)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def preflight_each_run_flag(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--preflight-each-run``: check the target before every run (stored as ``preflight.beforeRun``)."""
    return click.option("--preflight-each-run", is_flag=True,
                        help="Preflight the target before every run; a failure fails the run.")(fn)


def prompt_from_flags(prompt: str | None, prompt_file: str | None) -> tuple[str, dict[str, str] | None]:
    """The prompt text and its ``promptSource``: exactly one of ``--prompt`` and ``--prompt-file``."""
    if (prompt is None) == (prompt_file is None):
        raise ValidationError("choose exactly one of --prompt or --prompt-file")
    if prompt_file is not None:
        text, path = read_prompt_file(prompt_file, "--prompt-file")
        return text, {"type": "file", "path": path}
    assert prompt is not None
    return prompt, None


def apply_agent_flags(target: dict[str, Any], opts: dict[str, Any]) -> None:
    """Put the agent option flags on ``target`` and check them against its provider (0.3.60's rules), naming the
    flag and the value."""
    for key, field in (("variant", "variant"), ("permission_mode", "permissionMode"), ("sandbox", "sandbox"),
                       ("auth_profile", "authProfile")):
        value = opts.get(key)
        if value is None:
            continue
        if not value.strip():
            raise ValidationError(f"{FLAGS[field]} must not be empty, got {_q(value)}")
        target[field] = value
    if opts.get("add_dirs"):
        for directory in opts["add_dirs"]:
            if not directory.strip():
                raise ValidationError(f"--add-dir must not be empty, got {_q(directory)}")
        target["addDirs"] = list(opts["add_dirs"])
    mode = target.get("permissionMode")
    if mode is not None and mode not in agent_options.PERMISSION_MODES:
        raise ValidationError(f"--permission-mode must be default, plan, auto, or bypass, got {_q(mode)}")
    sandbox = target.get("sandbox")
    if sandbox is not None and sandbox not in agent_options.SANDBOXES:
        raise ValidationError(
            f"--sandbox must be read-only, workspace-write, danger-full-access, enabled or disabled, got {_q(sandbox)}"
        )
    problem = agent_options.option_problem(target, cli=True)
    if problem is not None:
        provider = target.get("provider")
        got = (f"--provider {provider}" if problem.by_provider else "nothing" if problem.value is None
               else _q(problem.value))
        raise ValidationError(f"{FLAGS.get(problem.field, problem.field)} {problem.reason}, got {got}")


def apply_preflight_flag(target: dict[str, Any], preflight_each_run: bool) -> None:
    """``--preflight-each-run`` as ``preflight: {beforeRun: true}``."""
    if preflight_each_run:
        target["preflight"] = {"beforeRun": True}
