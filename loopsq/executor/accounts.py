"""Account routing (reference §6): ask the external ``accounts`` CLI for a profile's environment.

``accounts env <profile> --tool <tool>`` prints ``export NAME=value`` lines; the tool's profile directory must be
among them (or be the first export) and must exist. The messages are the reference's, verbatim.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any

from loopsq.errors import ExecutionError

# Credentials and config locations a target could inherit from the worker's own environment. They are removed
# before the account env is overlaid, so that a routed target never runs with the worker's own identity.
AUTH_ENV_KEYS: tuple[str, ...] = (
    "CLAUDE_CONFIG_DIR",
    "CODEWITH_HOME",
    "CODEX_HOME",
    "CURSOR_CONFIG_DIR",
    "OPENCODE_CONFIG_DIR",
    "AICOPILOT_CONFIG_DIR",
    "ANTHROPIC_API_KEY",
    "OPENAI_API_KEY",
    "OPENROUTER_API_KEY",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
)

# The variable holding each tool's profile directory; other tools fall back to the first export.
PROFILE_DIR_VARS: dict[str, str] = {
    "claude": "CLAUDE_CONFIG_DIR",
    "codex": "CODEX_HOME",
    "codex-app": "CODEX_HOME",
    "cursor": "CURSOR_CONFIG_DIR",
    "opencode": "OPENCODE_CONFIG_DIR",
    "codewith": "CODEWITH_HOME",
    "aicopilot": "AICOPILOT_CONFIG_DIR",
}

# The reference runs `accounts env` with no time limit; a hung CLI would then hang the run before it starts.
ACCOUNTS_TIMEOUT_S = 60.0

_EXPORT = re.compile(r"^export\s+([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_QUOTES = "'\""


def account_tool_for_provider(provider: str | None) -> str | None:
    """Return the accounts tool id of an agent provider: the provider name itself (reference §6)."""
    return provider or None


def _reject_constant(name: str) -> Any:
    # JSON.parse knows no NaN/Infinity; Python's json does. Refuse them so such values take the quote-strip path.
    raise ValueError(name)


def parse_export_value(raw: str) -> str:
    """Decode the value of one ``export NAME=value`` line as the reference does.

    ``JSON.parse`` first: a JSON string gives its content; any other JSON value (number, boolean, null, array,
    object) gives its JSON text, since environment values are strings. When the text is not JSON, one leading and
    one trailing quote (``'`` or ``"``) are stripped.

    Args:
        raw: everything after the ``=``.

    Returns:
        The value as a string.
    """
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        text = raw
        if text[:1] in _QUOTES:
            text = text[1:]
        if text[-1:] in _QUOTES:
            text = text[:-1]
        return text
    if isinstance(value, str):
        return value
    return raw.strip()


def parse_exports(stdout: str) -> list[tuple[str, str]]:
    """Return the ``(name, value)`` pairs of every ``export`` line of ``stdout``, in order (duplicates kept).

    Args:
        stdout: the output of ``accounts env``.
    """
    pairs: list[tuple[str, str]] = []
    for line in stdout.splitlines():
        match = _EXPORT.match(line.strip())
        if match:
            pairs.append((match.group(1), parse_export_value(match.group(2))))
    return pairs


def _run_accounts_env(profile: str, tool: str, env: Mapping[str, str]) -> str:
    """Run ``accounts env <profile> --tool <tool>`` with ``env`` and return its stdout."""
    label = f"{profile}/{tool}"
    executable = shutil.which("accounts", path=env.get("PATH", os.defpath))
    if executable is None:
        raise ExecutionError(f"failed to run accounts env for {label}: accounts: not found in PATH")
    try:
        proc = subprocess.run(
            [executable, "env", profile, "--tool", tool],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=dict(env),
            timeout=ACCOUNTS_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        message = f"timed out after {int(ACCOUNTS_TIMEOUT_S * 1000)}ms"
        raise ExecutionError(f"failed to run accounts env for {label}: {message}") from exc
    except OSError as exc:
        raise ExecutionError(f"failed to run accounts env for {label}: {exc}") from exc
    if proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", "replace").strip()
        suffix = f": {stderr}" if stderr else ""
        raise ExecutionError(f"accounts env failed for {label}{suffix}")
    return proc.stdout.decode("utf-8", "replace")


def resolve_account_env(
    account: Mapping[str, Any], tool_hint: str | None, env: Mapping[str, str]
) -> dict[str, str]:
    """Resolve an account reference into the environment variables of its profile.

    Args:
        account: the target's ``{"profile": str, "tool"?: str}``.
        tool_hint: the tool to use when the account names none (an agent's provider; None for commands).
        env: the environment to run ``accounts`` with; ``accounts`` is looked up on its ``PATH``.

    Returns:
        Every exported variable plus ``LOOPS_ACCOUNT_PROFILE`` and ``LOOPS_ACCOUNT_TOOL``.

    Raises:
        ExecutionError: with the reference's message when no tool is known, ``accounts`` cannot run or fails, or
            the profile directory is missing from its output or from the disk.
    """
    profile = str(account.get("profile", ""))
    tool = account.get("tool")
    if tool is None:
        tool = tool_hint
    if not tool:
        raise ExecutionError("account.tool is required when no provider tool can be inferred")
    tool = str(tool)
    label = f"{profile}/{tool}"

    pairs = parse_exports(_run_accounts_env(profile, tool, env))
    exports = dict(pairs)
    dir_var = PROFILE_DIR_VARS.get(tool)
    profile_dir = exports.get(dir_var) if dir_var is not None else None
    if profile_dir is None and pairs:
        profile_dir = pairs[0][1]
    if not profile_dir:
        raise ExecutionError(f"accounts env returned no profile directory for {label}")
    if not os.path.exists(profile_dir):
        raise ExecutionError(f"account profile directory does not exist for {label}: {profile_dir}")
    exports["LOOPS_ACCOUNT_PROFILE"] = profile
    exports["LOOPS_ACCOUNT_TOOL"] = tool
    return exports
