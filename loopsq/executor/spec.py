"""Turn a command or agent target into a ``CommandSpec``: argv, cwd, timeouts, stdin and the composed env (§4.1-4.3).

Targets arrive as validated camelCase dicts. Building a spec resolves the target's account (which runs the
``accounts`` CLI and may raise ``ExecutionError``) but starts nothing.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loopsq.domain.agent_options import (
    SEPARATOR_PROVIDERS,
    codex_like_sandbox,
    option_problem,
    prompt_on_argv,
)
from loopsq.domain.agent_output import prompt_problem
from loopsq.domain.scrub import secret_values
from loopsq.errors import ExecutionError, ValidationError
from loopsq.executor.accounts import AUTH_ENV_KEYS, account_tool_for_provider, resolve_account_env
from loopsq.system.exec_path import normalize_execution_path, not_found_message

DEFAULT_TIMEOUT_MS = 1_800_000

PROVIDER_EXECUTABLES: dict[str, str] = {
    "claude": "claude",
    "cursor": "agent",  # Cursor's CLI (0.3.60; formerly cursor-agent)
    "codewith": "codewith",
    "aicopilot": "aicopilot",
    "opencode": "opencode",
    "codex": "codex",
}

SHELL = "/bin/sh"

_FS_ENCODING = sys.getfilesystemencoding()


@dataclass(frozen=True)
class RunMetadata:
    """Identifiers of the run a target executes for; each becomes a ``LOOPS_*`` variable when truthy (§4.2)."""

    loop_id: str | None = None
    loop_name: str | None = None
    run_id: str | None = None
    scheduled_for: str | None = None
    workflow_id: str | None = None
    workflow_name: str | None = None
    workflow_run_id: str | None = None
    workflow_step_id: str | None = None
    #: loopsq addition: the slot attempt (``LOOPS_ATTEMPT``), so a target can tell a retry from a first try.
    attempt: int | None = None
    #: Where the target may write its control JSON (``LOOPS_CONTROL_FILE``, ``domain.control``).
    control_file: str | None = None
    #: The W3C trace context of the span the target runs in (``TRACEPARENT``, ``TRACESTATE``), when tracing is on
    #: (``loopsq.system.tracing``): a traced target continues the trace.
    traceparent: str | None = None
    tracestate: str | None = None

    def env(self) -> dict[str, str]:
        """Return the ``LOOPS_*`` variables (and ``TRACEPARENT``/``TRACESTATE``) of the set fields."""
        pairs = (
            ("LOOPS_ATTEMPT", str(self.attempt) if self.attempt else None),
            ("LOOPS_CONTROL_FILE", self.control_file),
            ("LOOPS_LOOP_ID", self.loop_id),
            ("LOOPS_LOOP_NAME", self.loop_name),
            ("LOOPS_RUN_ID", self.run_id),
            ("LOOPS_SCHEDULED_FOR", self.scheduled_for),
            ("LOOPS_WORKFLOW_ID", self.workflow_id),
            ("LOOPS_WORKFLOW_NAME", self.workflow_name),
            ("LOOPS_WORKFLOW_RUN_ID", self.workflow_run_id),
            ("LOOPS_WORKFLOW_STEP_ID", self.workflow_step_id),
            ("TRACEPARENT", self.traceparent),
            ("TRACESTATE", self.tracestate),
        )
        return {name: value for name, value in pairs if value}


@dataclass(frozen=True)
class CommandSpec:
    """Everything needed to start one target as a process.

    ``command`` is what the executable check looks for (the target's command, or the provider's executable);
    ``argv`` is what is executed: ``(command, *args)``, or ``("/bin/sh", "-c", "<command> <args...>")`` when
    ``shell`` is true. ``stdin_text`` is the prompt when it goes through stdin, else None (stdin is /dev/null).
    """

    command: str
    args: tuple[str, ...]
    argv: tuple[str, ...]
    cwd: str | None
    shell: bool
    env: Mapping[str, str] = field(repr=False)
    timeout_ms: int | None = DEFAULT_TIMEOUT_MS
    idle_timeout_ms: int | None = None
    stdin_text: str | None = None
    account_profile: str | None = None
    account_tool: str | None = None
    #: A ``codewith exec --json`` run: its JSON events decide whether it succeeded (``domain.codewith_exec``).
    codewith_exec: bool = False
    #: The target's own ``env`` values that its captured output is scrubbed of (``domain.scrub.secret_values``).
    secrets: tuple[str, ...] = field(default=(), repr=False)


def _opt(flag: str, value: Any) -> list[str]:
    # The reference adds an optional flag only when its value is truthy (an empty model is no model).
    return [flag, str(value)] if value else []


def _effort(value: Any) -> list[str]:
    # codex and codewith read ``-c key=value`` as TOML: the effort is a quoted string.
    return ["-c", f"model_reasoning_effort={json.dumps(str(value))}"] if value else []


def _claude_args(target: Mapping[str, Any], safe: bool) -> list[str]:
    args = ["--safe-mode", "--setting-sources", "local", "--no-session-persistence"] if safe else []
    mode = target.get("permissionMode") or "default"
    if mode != "default":
        args += ["--permission-mode", "bypassPermissions" if mode == "bypass" else str(mode)]
    return [*args, "-p", "--output-format", "json", *_opt("--model", target.get("model")),
            *_opt("--effort", target.get("variant")), *_opt("--agent", target.get("agent"))]


def _cursor_args(target: Mapping[str, Any], safe: bool) -> list[str]:
    mode = target.get("permissionMode") or "default"
    sandbox = target.get("sandbox") or ("enabled" if safe else None)
    return ["-p", *(["--mode", "plan"] if mode == "plan" else []), *(["--force"] if mode == "bypass" else []),
            *_opt("--sandbox", sandbox), *_opt("--model", target.get("model")), *_opt("--agent", target.get("agent"))]


def _codex_args(target: Mapping[str, Any], safe: bool) -> list[str]:
    return [*_effort(target.get("variant")), "--ask-for-approval", "never", "exec", "--json", "--ephemeral",
            "--sandbox", codex_like_sandbox(target), "--skip-git-repo-check", *(["--ignore-rules"] if safe else []),
            *_opt("--cd", target.get("cwd")), *_add_dirs(target), *_opt("--model", target.get("model"))]


def _codewith_args(target: Mapping[str, Any], safe: bool) -> list[str]:
    """One ``codewith exec --json`` process (OpenLoops 0.4.9), as codex, with codewith's ``--auth-profile`` first
    (before the subcommand, 0.3.2)."""
    return [*_opt("--auth-profile", target.get("authProfile")), *_codex_args(target, safe)]


def _opencode_args(target: Mapping[str, Any], safe: bool) -> list[str]:
    bypass = target.get("permissionMode") == "bypass"
    return ["run", "--format", "json", *(["--pure"] if safe else []),
            *(["--dangerously-skip-permissions"] if bypass else []), *_opt("--dir", target.get("cwd")),
            *_opt("--model", target.get("model")), *_opt("--variant", target.get("variant")),
            *_opt("--agent", target.get("agent"))]


def _add_dirs(target: Mapping[str, Any]) -> list[str]:
    return [part for directory in target.get("addDirs") or [] for part in ("--add-dir", str(directory))]


_PROVIDER_ARGS = {
    "claude": _claude_args,
    "cursor": _cursor_args,
    "codex": _codex_args,
    "codewith": _codewith_args,
    "opencode": _opencode_args,
    "aicopilot": _opencode_args,
}


def agent_args(target: Mapping[str, Any]) -> list[str]:
    """Return the argv after the provider executable for an agent target: each provider's argv at 0.3.60, and
    codewith's one-shot ``exec --json`` of OpenLoops 0.4.9.

    The provider's options, then ``extraArgs``. The prompt comes last unless it goes through stdin
    (``promptVia: "stdin"``): after ``--`` where the provider's CLI ends its options there
    (``agent_options.SEPARATOR_PROVIDERS``), so a prompt is never read as an option. On aicopilot, which is not
    known to, a prompt beginning with ``-`` is refused.

    Args:
        target: a validated agent target.

    Returns:
        The argument list.

    Raises:
        ValidationError: when the provider is unknown, or the prompt cannot be passed literally.
    """
    provider = str(target.get("provider"))
    build = _PROVIDER_ARGS.get(provider)
    if build is None:
        raise ValidationError(f"unknown agent provider: {provider!r}")
    safe = (target.get("configIsolation") or "safe") == "safe"
    args = [*build(target, safe), *(str(arg) for arg in target.get("extraArgs") or [])]
    if prompt_on_argv(target):
        prompt = str(target.get("prompt", ""))
        if provider in SEPARATOR_PROVIDERS:
            args.append("--")
        elif prompt.startswith("-"):
            problem = option_problem(target)
            raise ValidationError(f"target.prompt {problem.reason if problem else 'must not begin with -'}, got "
                                  f"{json.dumps(prompt[:57])}")
        args.append(prompt)
    return args


#: loopsq's own variables, kept from every target: the Redis URL (with its password), the API token, the data dir,
#: fault injection. A loop that needs one passes it in its own ``env``. (The ``LOOPS_*`` run metadata is set anew
#: for each run.)
PRIVATE_ENV_PREFIX = "LOOPSQ_"
PRIVATE_ENV_KEYS = frozenset({"REDIS_URL"})


def is_private_env_key(key: str) -> bool:
    """Whether ``key`` is one of loopsq's own variables, which targets never inherit."""
    return key.startswith(PRIVATE_ENV_PREFIX) or key in PRIVATE_ENV_KEYS


def inherited_env(base: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``base`` (``os.environ`` or the caller's env) without loopsq's own variables."""
    if base is os.environ:
        return _copy_os_environ()
    return {key: value for key, value in base.items() if not is_private_env_key(key)}


def _copy_os_environ() -> dict[str, str]:
    """Copy ``os.environ`` as str, without loopsq's own variables: about 3x faster than ``dict(os.environ)``,
    which decodes through a Python ``__getitem__`` per variable; this is on the per-run hot path."""
    data: dict[bytes, bytes] | None = getattr(os.environ, "_data", None)
    if data is None or os.name != "posix":
        return {key: value for key, value in os.environ.items() if not is_private_env_key(key)}
    enc = _FS_ENCODING
    prefix = PRIVATE_ENV_PREFIX.encode()
    private = {key.encode() for key in PRIVATE_ENV_KEYS}
    return {
        key.decode(enc, "surrogateescape"): value.decode(enc, "surrogateescape")
        for key, value in data.items()
        if not key.startswith(prefix) and key not in private
    }


def compose_env(
    base: Mapping[str, str],
    metadata: RunMetadata,
    *,
    account_env: Mapping[str, str] | None = None,
    target_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Compose a target's environment (§4.2).

    loopsq's own variables (``LOOPSQ_*``, ``REDIS_URL``) are dropped from ``base``: a target never sees the
    Redis URL, its password or the API token unless its own ``env`` names them.

    Args:
        base: the environment to start from (the caller's ``env`` or ``os.environ``).
        metadata: the run identifiers, set as ``LOOPS_*`` variables when truthy.
        account_env: the resolved account env; when given, ``AUTH_ENV_KEYS`` are removed from ``base`` first.
        target_env: the target's own ``env``, overlaid after the account env.

    Returns:
        A new dict; its ``PATH`` is normalised (``loopsq.system.exec_path``).
    """
    env = inherited_env(base)
    if account_env is not None:
        for key in AUTH_ENV_KEYS:
            env.pop(key, None)
        env.update(account_env)
    if target_env:
        env.update({str(k): str(v) for k, v in target_env.items()})
    env["PATH"] = normalize_execution_path(env)  # reference 0.3.1: the common bin dirs appended, de-duplicated
    env.update(metadata.env())
    return env


#: Turns a target's ``account`` into the variables of its profile (``resolve_account_env``'s signature).
AccountResolver = Callable[[Mapping[str, Any], str | None, Mapping[str, str]], dict[str, str]]


def build_spec(
    target: Mapping[str, Any], metadata: RunMetadata, *, env: Mapping[str, str] | None = None,
    resolve_account: AccountResolver = resolve_account_env,
) -> CommandSpec:
    """Build the command spec of a command or agent target, resolving its account.

    Args:
        target: a validated ``command`` or ``agent`` target (camelCase keys).
        metadata: the run identifiers for the ``LOOPS_*`` variables.
        env: the base environment; ``os.environ`` when None.
        resolve_account: how the account becomes variables (the ``accounts`` CLI; ``digest`` runs nothing).

    Returns:
        The spec.

    Raises:
        ExecutionError: when the account cannot be resolved (the §6 messages).
        ValidationError: when the target type or provider is unknown.
    """
    kind = target.get("type")
    base: Mapping[str, str] = os.environ if env is None else env
    target_env: Mapping[str, str] | None = target.get("env")
    timeout_ms: int | None = target.get("timeoutMs", DEFAULT_TIMEOUT_MS)
    idle_timeout_ms: int | None = target.get("idleTimeoutMs") or None
    cwd: str | None = target.get("cwd") or None
    account: Mapping[str, Any] | None = target.get("account")
    stdin_text: str | None = None
    if kind == "command":
        command = str(target.get("command", ""))
        args = tuple(str(arg) for arg in target.get("args") or [])
        shell = target.get("shell") is True
        tool_hint = None  # command targets never infer a tool (§4.1)
    elif kind == "agent":
        provider = str(target.get("provider"))
        if provider not in PROVIDER_EXECUTABLES:
            raise ValidationError(f"unknown agent provider: {provider!r}")
        prompt = target.get("prompt")
        problem = prompt_problem(prompt) if isinstance(prompt, str) else "is missing"
        if problem is not None:
            # A stored target the create-time check did not see (stored before it, or written by hand): fail the
            # run rather than start an agent with nothing to do (OpenLoops 0.4.40).
            raise ExecutionError(f"agent prompt {problem}; nothing was started")
        command = PROVIDER_EXECUTABLES[provider]
        args = tuple(agent_args(target))
        shell = False
        tool_hint = account_tool_for_provider(provider)
        if not prompt_on_argv(target):
            stdin_text = str(target.get("prompt", ""))
    else:
        raise ValidationError(f"target type cannot be executed as a process: {kind!r}")

    account_env = None
    account_profile = account_tool = None
    if account:
        # The accounts CLI runs with the caller's env (§6), but never with loopsq's own variables.
        account_env = resolve_account(account, tool_hint, inherited_env(base))
        account_profile = account_env["LOOPS_ACCOUNT_PROFILE"]
        account_tool = account_env["LOOPS_ACCOUNT_TOOL"]
    full_env = compose_env(base, metadata, account_env=account_env, target_env=target_env)
    argv = (SHELL, "-c", " ".join((command, *args))) if shell else (command, *args)
    return CommandSpec(
        command=command,
        args=args,
        argv=argv,
        cwd=cwd,
        shell=shell,
        env=full_env,
        timeout_ms=timeout_ms,
        idle_timeout_ms=idle_timeout_ms,
        stdin_text=stdin_text,
        account_profile=account_profile,
        account_tool=account_tool,
        codewith_exec=kind == "agent" and target.get("provider") == "codewith",
        secrets=secret_values(target_env),
    )


def find_executable(spec: CommandSpec) -> str | None:
    """Locate the spec's executable as ``commandExists`` does (§4.3), with the composed env's ``PATH``.

    A command containing ``/`` must exist (relative to the spec's cwd, where the child resolves it); otherwise it
    must be an executable file on ``PATH``.

    Returns:
        The path to execute, or None when the executable is missing.
    """
    command = spec.command
    if not command:
        return None
    if "/" in command:
        path = os.path.join(spec.cwd, command) if spec.cwd and not os.path.isabs(command) else command
        # Returned as given: the child resolves a relative path itself, after changing to its cwd.
        return command if os.path.exists(path) else None
    access, x_ok = os.access, os.X_OK  # one syscall per PATH entry: this is on the per-run hot path
    for directory in spec.env.get("PATH", "").split(os.pathsep):
        # A pure PATH scan (0.3.1): empty entries are skipped (a normalised PATH has none). A relative entry
        # resolves against our cwd, not the child's: the path is made absolute before the child changes directory.
        if not directory:
            continue
        path = f"{directory}/{command}"
        if access(path, x_ok) and not os.path.isdir(path):
            return path if path[0] == "/" else os.path.abspath(path)
    return None


def check_executable(spec: CommandSpec) -> str | None:
    """Return the path to execute (None for shell specs, which ``/bin/sh`` resolves).

    Raises:
        ExecutionError: ``Executable not found in PATH: <cmd>. Effective PATH=<PATH|(empty)>`` (0.3.1) when a
            non-shell executable is missing.
    """
    if spec.shell:
        return None
    path = find_executable(spec)
    if path is None:
        raise ExecutionError(not_found_message(spec.command, spec.env))
    return path
