"""The PATH every target runs with (reference 0.3.1 ``normalizeExecutionPath``), and the not-found message.

The common user and system bin directories are APPENDED to the PATH a target inherits (the reference's README
says "prepend"; its code appends, and so does loopsq), and the whole list is de-duplicated with empty entries
dropped, so a service manager's bare PATH still finds ``~/.local/bin/claude``. The executor, preflight, doctor
and the generated service files all use this one function.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Mapping

#: Appended after the inherited PATH, in this order (``~`` is the target's ``HOME``); then de-duplicated.
HOME_BIN_DIRS = (".local/bin", ".bun/bin", ".cargo/bin", ".npm-global/bin", "bin")
SYSTEM_BIN_DIRS = ("/opt/homebrew/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin")


def _home(env: Mapping[str, str]) -> str:
    home = env.get("HOME")
    if home:
        return home
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:  # pragma: no cover - a uid without a passwd entry
        return os.path.expanduser("~")


def common_executable_dirs(env: Mapping[str, str]) -> list[str]:
    """The directories appended to every target's PATH, in order, for the environment ``env``.

    ``~/.local/bin ~/.bun/bin ~/.cargo/bin ~/.npm-global/bin ~/bin $BUN_INSTALL/bin $PNPM_HOME
    $NPM_CONFIG_PREFIX/bin /opt/homebrew/bin /usr/local/bin /usr/bin /bin /usr/sbin /sbin``; a variable that is not
    set contributes nothing.
    """
    home = _home(env)
    dirs = [os.path.join(home, sub) for sub in HOME_BIN_DIRS]
    if env.get("BUN_INSTALL"):
        dirs.append(os.path.join(env["BUN_INSTALL"], "bin"))
    if env.get("PNPM_HOME"):
        dirs.append(env["PNPM_HOME"])
    if env.get("NPM_CONFIG_PREFIX"):
        dirs.append(os.path.join(env["NPM_CONFIG_PREFIX"], "bin"))
    return [*dirs, *SYSTEM_BIN_DIRS]


def normalize_execution_path(env: Mapping[str, str]) -> str:
    """``env``'s PATH with the common directories appended: entries trimmed, empty ones dropped, each kept once
    (its first occurrence wins, so the inherited order is never changed)."""
    seen: dict[str, None] = {}
    for part in [*env.get("PATH", "").split(os.pathsep), *common_executable_dirs(env)]:
        entry = part.strip()
        if entry:
            seen.setdefault(entry, None)
    return os.pathsep.join(seen)


def not_found_message(command: str, env: Mapping[str, str]) -> str:
    """``Executable not found in PATH: <cmd>. Effective PATH=<PATH|(empty)>`` (reference 0.3.1)."""
    return f"Executable not found in PATH: {command}. Effective PATH={env.get('PATH') or '(empty)'}"
