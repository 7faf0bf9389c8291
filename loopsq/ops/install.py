"""``loopsq install``: service files for the scheduler, a worker and the web app (systemd user units or launchd
agents), the commands that enable them, and running those commands.

Adapted from the reference's ``daemon install`` (§3.12), with its defects fixed: ExecStart is quoted as systemd
parses it (an interpreter path with a space used to break the unit), units are not ordered ``After`` the target
that wants them (an ordering cycle), and every file is mode 0600, as it may hold a Redis password.
"""

from __future__ import annotations

import plistlib
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loopsq.errors import ValidationError
from loopsq.ops.embedded_redis import write_private

TARGETS = ("systemd", "launchd")
SERVICES = ("scheduler", "worker", "web")

# Characters after which a word can no longer stand bare in a systemd command line.
_SYSTEMD_SPECIAL = set(" \t\n\r\"'\\;")


@dataclass(frozen=True)
class EnableResult:
    """One enable command and how it went."""

    command: list[str]
    status: int
    stdout: str = ""
    stderr: str = ""

    @property
    def line(self) -> str:
        """``<cmd> -> ok`` or ``<cmd> -> exit N``."""
        return f"{shlex.join(self.command)} -> {'ok' if self.status == 0 else f'exit {self.status}'}"


@dataclass
class Installation:
    """What ``install`` wrote and what enables it: commands to run, and notes to print only."""

    target: str
    files: list[Path] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def validate_target(target: str) -> str:
    """``systemd`` or ``launchd``; ValidationError otherwise."""
    if target not in TARGETS:
        raise ValidationError(f"install target must be systemd or launchd, got '{target}'")
    return target


def service_argv(service: str, python: str | None = None) -> list[str]:
    """How a service starts: this interpreter running ``-m loopsq <service>`` (no PATH lookup involved)."""
    return [python or sys.executable, "-m", "loopsq", service]


def default_dir(target: str, home: Path | None = None) -> Path:
    """``~/.config/systemd/user`` or ``~/Library/LaunchAgents``."""
    home = home if home is not None else Path.home()
    return home / ".config/systemd/user" if target == "systemd" else home / "Library/LaunchAgents"


def unit_name(service: str) -> str:
    """``loopsq-<service>.service``."""
    return f"loopsq-{service}.service"


def plist_label(service: str) -> str:
    """``com.loopsq.<service>``."""
    return f"com.loopsq.{service}"


def systemd_quote(arg: str, *, expand: bool = True) -> str:
    """One word for a systemd ``ExecStart=`` (or, with ``expand=False``, an ``Environment=`` assignment).

    ``%`` is doubled (specifiers) and, in command lines, ``$`` too (variable expansion). A word with blanks,
    quotes, backslashes or a ``;`` is double-quoted with C-style escapes, as systemd unquotes it.
    """
    text = arg.replace("%", "%%")
    if expand:
        text = text.replace("$", "$$")
    if text and not (_SYSTEMD_SPECIAL & set(text)):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return '"' + escaped.replace("\r", "\\r") + '"'


def systemd_unit(service: str, argv: Sequence[str], env: Mapping[str, str]) -> str:
    """A systemd user unit running ``argv`` with ``env``, restarted always."""
    lines = [
        "# Written by `loopsq install systemd`.",
        "[Unit]",
        f"Description=loopsq {service}",
        "",
        "[Service]",
        "Type=simple",
        "ExecStart=" + " ".join(systemd_quote(a) for a in argv),
        "Restart=always",
        "RestartSec=5",
        # SIGTERM to the loopsq process alone (a worker finishes or hands back its run), the rest after the timeout.
        "KillMode=mixed",
        "TimeoutStopSec=30",
    ]
    lines += [f"Environment={systemd_quote(f'{k}={v}', expand=False)}" for k, v in env.items()]
    lines += ["", "[Install]", "WantedBy=default.target", ""]
    return "\n".join(lines)


def launchd_plist(service: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> bytes:
    """A launchd agent running ``argv`` with ``env``, at load and kept alive, logging to ``log_path``."""
    return plistlib.dumps({
        "Label": plist_label(service),
        "ProgramArguments": list(argv),
        "EnvironmentVariables": dict(env),
        "RunAtLoad": True,
        "KeepAlive": True,
        "StandardOutPath": str(log_path),
        "StandardErrorPath": str(log_path),
    })


def write_services(
    target: str,
    directory: Path,
    env: Mapping[str, str],
    log_dir: Path,
    *,
    python: str | None = None,
    default_location: bool = True,
    service_env: Mapping[str, Mapping[str, str]] | None = None,
) -> Installation:
    """Write one file per service (mode 0600) and return them with the commands that enable them.

    ``service_env`` adds variables to one service's environment (the web app's API token). ``default_location``
    False means ``directory`` is not where systemd looks: the enable command then names the files by path
    (``systemctl --user enable`` links them in).
    """
    validate_target(target)
    directory.mkdir(parents=True, exist_ok=True)
    done = Installation(target)
    for service in SERVICES:
        argv = service_argv(service, python)
        full_env = {**env, **(service_env or {}).get(service, {})}
        if target == "systemd":
            path = directory / unit_name(service)
            write_private(path, systemd_unit(service, argv, full_env))
        else:
            path = directory / f"{plist_label(service)}.plist"
            write_private(path, launchd_plist(service, argv, full_env, log_dir / f"{service}.log"))
        done.files.append(path)
    if target == "systemd":
        units = [unit_name(s) for s in SERVICES] if default_location else [str(p) for p in done.files]
        done.commands = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", *units]]
        done.notes = ["loginctl enable-linger $USER"]
    else:
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        done.commands = [["launchctl", "load", "-w", str(p)] for p in done.files]
    return done


def run_commands(commands: Sequence[Sequence[str]], timeout: float = 120.0) -> list[EnableResult]:
    """Run each command (no shell); a missing program is ``exit 127``, as a shell reports it."""
    results = []
    for command in commands:
        try:
            done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
            results.append(EnableResult(list(command), done.returncode, done.stdout, done.stderr))
        except FileNotFoundError as exc:
            results.append(EnableResult(list(command), 127, "", str(exc)))
        except subprocess.TimeoutExpired:
            results.append(EnableResult(list(command), 124, "", f"timed out after {timeout:g}s"))
    return results
