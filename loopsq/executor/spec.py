"""Turn a command or agent target into a ``CommandSpec``: argv, cwd, timeouts, stdin and the composed env (§4.1-4.3).

Targets arrive as validated camelCase dicts. Building a spec resolves the target's account (which runs the
``accounts`` CLI and may raise ``ExecutionError``) but starts nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loopsq.errors import ExecutionError, ValidationError
from loopsq.executor.accounts import AUTH_ENV_KEYS, account_tool_for_provider, resolve_account_env

DEFAULT_TIMEOUT_MS = 1_800_000

PROVIDER_EXECUTABLES: dict[str, str] = {
    "claude": "claude",
    "cursor": "cursor-agent",
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

    def env(self) -> dict[str, str]:
        """Return the ``LOOPS_*`` variables of the set fields."""
        pairs = (
            ("LOOPS_ATTEMPT", str(self.attempt) if self.attempt else None),
            ("LOOPS_LOOP_ID", self.loop_id),
            ("LOOPS_LOOP_NAME", self.loop_name),
            ("LOOPS_RUN_ID", self.run_id),
            ("LOOPS_SCHEDULED_FOR", self.scheduled_for),
            ("LOOPS_WORKFLOW_ID", self.workflow_id),
            ("LOOPS_WORKFLOW_NAME", self.workflow_name),
            ("LOOPS_WORKFLOW_RUN_ID", self.workflow_run_id),
            ("LOOPS_WORKFLOW_STEP_ID", self.workflow_step_id),
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


def _opt(flag: str, value: Any) -> list[str]:
    # The reference adds an optional flag only when its value is truthy (an empty model is no model).
    return [flag, str(value)] if value else []


def agent_args(target: Mapping[str, Any]) -> list[str]:
    """Return the argv after the provider executable for an agent target, as the table of §4.1.

    The prompt is the last element, unless ``promptVia`` is ``"stdin"`` (0.3.3), in which case it is left out.

    Args:
        target: a validated agent target.

    Returns:
        The argument list.

    Raises:
        ValidationError: when the provider is unknown.
    """
    provider = target.get("provider")
    safe = (target.get("configIsolation") or "safe") == "safe"
    cwd = target.get("cwd")
    model = _opt("--model", target.get("model"))
    agent = _opt("--agent", target.get("agent"))
    extra = [str(arg) for arg in target.get("extraArgs") or []]
    if provider == "claude":
        isolation = ["--safe-mode", "--setting-sources", "local", "--no-session-persistence"] if safe else []
        args = [*isolation, "-p", "--output-format", "json", *model, *agent, *extra]
    elif provider == "cursor":
        args = ["-p", *model, *agent, *extra]
    elif provider in ("codewith", "codex"):
        args = [
            "exec",
            "--json",
            "--ephemeral",
            "--ask-for-approval",
            "never",
            "--sandbox",
            "workspace-write",
        ]
        if safe:
            args.append("--ignore-rules")
        args += [*_opt("--cd", cwd), *model]
        if provider == "codewith":
            args += agent
        args += extra
    elif provider in ("aicopilot", "opencode"):
        args = [
            "run",
            "--format",
            "json",
            *(["--pure"] if safe else []),
            *_opt("--dir", cwd),
            *model,
            *agent,
            *extra,
        ]
    else:
        raise ValidationError(f"unknown agent provider: {provider!r}")
    if target.get("promptVia") != "stdin":
        args.append(str(target.get("prompt", "")))
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
        A new dict.
    """
    env = inherited_env(base)
    if account_env is not None:
        for key in AUTH_ENV_KEYS:
            env.pop(key, None)
        env.update(account_env)
    if target_env:
        env.update({str(k): str(v) for k, v in target_env.items()})
    env.update(metadata.env())
    return env


def build_spec(
    target: Mapping[str, Any], metadata: RunMetadata, *, env: Mapping[str, str] | None = None
) -> CommandSpec:
    """Build the command spec of a command or agent target, resolving its account.

    Args:
        target: a validated ``command`` or ``agent`` target (camelCase keys).
        metadata: the run identifiers for the ``LOOPS_*`` variables.
        env: the base environment; ``os.environ`` when None.

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
        command = PROVIDER_EXECUTABLES[provider]
        args = tuple(agent_args(target))
        shell = False
        tool_hint = account_tool_for_provider(provider)
        if target.get("promptVia") == "stdin":
            stdin_text = str(target.get("prompt", ""))
    else:
        raise ValidationError(f"target type cannot be executed as a process: {kind!r}")

    account_env = None
    account_profile = account_tool = None
    if account:
        # The accounts CLI runs with the caller's env (§6), but never with loopsq's own variables.
        account_env = resolve_account_env(account, tool_hint, inherited_env(base))
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
    for directory in spec.env.get("PATH", os.defpath).split(os.pathsep):
        # An empty entry means the current directory, as for execvp. A relative entry resolves against our cwd,
        # not the child's: the path is made absolute before the child changes directory.
        path = f"{directory or os.curdir}/{command}"
        if access(path, x_ok) and not os.path.isdir(path):
            return path if path[0] == "/" else os.path.abspath(path)
    return None


def check_executable(spec: CommandSpec) -> str | None:
    """Return the path to execute (None for shell specs, which ``/bin/sh`` resolves).

    Raises:
        ExecutionError: ``Executable not found in PATH: <cmd>`` when a non-shell executable is missing.
    """
    if spec.shell:
        return None
    path = find_executable(spec)
    if path is None:
        raise ExecutionError(f"Executable not found in PATH: {spec.command}")
    return path
