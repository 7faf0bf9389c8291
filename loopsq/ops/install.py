"""``loopsq install``: service files for the scheduler, a worker and the web app (systemd user units or launchd
agents), the commands that enable them, and running those commands.

Adapted from the reference's ``daemon install`` (§3.12), with its defects fixed: ExecStart is quoted as systemd
parses it (an interpreter path with a space used to break the unit), units are not ordered ``After`` the target
that wants them (an ordering cycle), and every file is mode 0600 in a directory created 0700.

Secrets (the Redis URL with its password, the web app's API token) are in no unit, plist or environment: each is
a file of its own next to the unit (``loopsq-<service>.redis-url``, ``loopsq-web.api-token``, mode 0600) that the
service reads through the ``*_FILE`` variables (``system.secrets``). systemd hands it over as a credential
(``LoadCredential=``: the service reads its own copy in ``$CREDENTIALS_DIRECTORY``, ``%d`` in the unit); launchd,
which has no credentials, names the file itself.

The web app and the scheduler are sandboxed (``systemd-analyze security`` rates them "OK"); the worker only as
far as running the user's commands and agents in the user's repositories allows (see ``WORKER_HARDENING``).
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
from loopsq.system.secrets import FILE_SUFFIX

TARGETS = ("systemd", "launchd")
SERVICES = ("scheduler", "worker", "web")
#: Variables whose value goes to a 0600 file of its own (named by the credential), never into a unit, a plist or
#: an environment: the service is given ``<KEY>_FILE`` instead.
SECRET_KEYS = {"LOOPSQ_REDIS_URL": "redis-url", "LOOPSQ_API_TOKEN": "api-token"}
#: systemd's stop timeout in the units, and the kill timeout a worker derives its grace from (``ops.shutdown``).
SYSTEMD_STOP_TIMEOUT_S = 30
#: launchd's default ``ExitTimeOut``: SIGKILL this long after SIGTERM.
LAUNCHD_EXIT_TIMEOUT_S = 20

#: The web app and the scheduler talk to Redis and write the data dir, nothing more: a full sandbox.
#: ``ReadWritePaths=`` (the data dir) and ``PrivateTmp=`` (unless the data dir is under /tmp) are added per unit.
SANDBOX_HARDENING = (
    "NoNewPrivileges=yes",
    "PrivateDevices=yes",
    "DevicePolicy=closed",
    "PrivateUsers=yes",
    "ProtectSystem=strict",
    "ProtectHome=read-only",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "ProtectProc=invisible",
    "ProcSubset=pid",
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
    "RestrictNamespaces=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "MemoryDenyWriteExecute=yes",
    "RemoveIPC=yes",
    "KeyringMode=private",
    "SystemCallArchitectures=native",
    "SystemCallFilter=@system-service",
    "SystemCallFilter=~@privileged @resources",
    "SystemCallErrorNumber=EPERM",
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
    "UMask=0077",
)
#: The worker runs the user's commands and agent CLIs, in the user's repositories, so it keeps what they may
#: need: writes anywhere the user may write (no ProtectSystem/ProtectHome/ReadWritePaths), the user's /tmp and
#: devices (sockets of an SSH agent, GPUs: no PrivateTmp/PrivateDevices), setuid helpers such as sudo (no
#: NoNewPrivileges, no CapabilityBoundingSet), JITs such as node's, which the agent CLIs run on (no
#: MemoryDenyWriteExecute), sandboxes built on namespaces, which agent CLIs use (no RestrictNamespaces or
#: PrivateUsers), any system call and address family (no SystemCallFilter or RestrictAddressFamilies), and the
#: user's umask. What a command never needs is still taken away:
WORKER_HARDENING = (
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "KeyringMode=private",
    "SystemCallArchitectures=native",
)

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


def secret_file_name(service: str, credential: str) -> str:
    """``loopsq-<service>.<credential>`` (``loopsq-web.api-token``)."""
    return f"loopsq-{service}.{credential}"


def secret_text(key: str, value: str) -> str:
    """The content of a secret's file: the value and a newline (``system.secrets`` strips it when it reads it).

    Raises:
        ValidationError: the value holds a line break or a NUL (it would not read back as written).
    """
    if any(ch in value for ch in "\n\r\0"):
        # The value is a secret: named, never shown.
        raise ValidationError(f"{key} must not contain a line break or NUL (its value is not shown: a secret)")
    return value + "\n"


def _in_tmp(path: Path) -> bool:
    return any(path == Path(t) or Path(t) in path.parents for t in ("/tmp", "/var/tmp"))


def hardening(service: str, data_dir: Path | None) -> list[str]:
    """The sandboxing directives of one service's unit (see ``SANDBOX_HARDENING`` and ``WORKER_HARDENING``)."""
    if service == "worker":
        return list(WORKER_HARDENING)
    lines = list(SANDBOX_HARDENING)
    if data_dir is None or not _in_tmp(data_dir):
        lines.insert(0, "PrivateTmp=yes")  # a data dir under /tmp must stay the real one
    if data_dir is not None:
        lines.append(f"ReadWritePaths={systemd_quote(str(data_dir), expand=False)}")
    return lines


def systemd_unit(service: str, argv: Sequence[str], env: Mapping[str, str], *,
                 credentials: Mapping[str, Path] | None = None, data_dir: Path | None = None) -> str:
    """A systemd user unit running ``argv`` with ``env``, restarted always, with the service's hardening
    directives; ``credentials`` maps a secret's variable (``LOOPSQ_REDIS_URL``) to its file, loaded as a credential
    (``LoadCredential=``) that the service finds through ``<KEY>_FILE=%d/<credential>``."""
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
        f"TimeoutStopSec={SYSTEMD_STOP_TIMEOUT_S}",
    ]
    for key, path in (credentials or {}).items():
        # A path, taken as it stands (no quotes): only specifiers are expanded.
        lines.append(f"LoadCredential={SECRET_KEYS[key]}:{str(path).replace('%', '%%')}")
        lines.append(f"Environment={key}{FILE_SUFFIX}=%d/{SECRET_KEYS[key]}")
    lines += [f"Environment={systemd_quote(f'{k}={v}', expand=False)}" for k, v in env.items()]
    lines += hardening(service, data_dir)
    lines += ["", "[Install]", "WantedBy=default.target", ""]
    return "\n".join(lines)


def launchd_plist(service: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                  credentials: Mapping[str, Path] | None = None) -> bytes:
    """A launchd agent running ``argv`` with ``env``, at load and kept alive, logging to ``log_path``;
    ``credentials`` maps a secret's variable to its file, named by ``<KEY>_FILE`` (launchd has no credentials)."""
    files = {f"{key}{FILE_SUFFIX}": str(path) for key, path in (credentials or {}).items()}
    return plistlib.dumps({
        "Label": plist_label(service),
        "ProgramArguments": list(argv),
        "EnvironmentVariables": {**env, **files},
        "RunAtLoad": True,
        "KeepAlive": True,
        "ExitTimeOut": LAUNCHD_EXIT_TIMEOUT_S,
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
    data_dir: Path | None = None,
) -> Installation:
    """Write one file per service, and one file per secret of a service (all mode 0600, in ``directory``, created
    0700), and return them with the commands that enable them.

    ``service_env`` adds variables to one service's environment (the web app's API token). ``data_dir`` is the
    one directory the sandboxed services may write. ``default_location`` False means ``directory`` is not where
    systemd looks: the enable command then names the files by path (``systemctl --user enable`` links them in).

    Raises:
        ValidationError: a secret is empty or holds a line break or a NUL (before anything is written).
    """
    validate_target(target)
    kill_timeout = SYSTEMD_STOP_TIMEOUT_S if target == "systemd" else LAUNCHD_EXIT_TIMEOUT_S
    plans = []
    for service in SERVICES:
        full_env = {**env, **(service_env or {}).get(service, {})}
        if service == "worker":
            full_env["LOOPSQ_KILL_TIMEOUT"] = f"{kill_timeout}s"  # its grace ends before the SIGKILL
        secrets = {k: secret_text(k, v) for k, v in full_env.items() if k in SECRET_KEYS}
        public = {k: v for k, v in full_env.items() if k not in SECRET_KEYS}
        plans.append((service, public, secrets))
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    done = Installation(target)
    for service, public, secrets in plans:
        argv = service_argv(service, python)
        files = {key: directory / secret_file_name(service, SECRET_KEYS[key]) for key in secrets}
        if target == "systemd":
            path = directory / unit_name(service)
            write_private(path, systemd_unit(service, argv, public, credentials=files, data_dir=data_dir))
        else:
            path = directory / f"{plist_label(service)}.plist"
            write_private(path, launchd_plist(service, argv, public, log_dir / f"{service}.log", files))
        done.files.append(path)
        for key, file in files.items():
            write_private(file, secrets[key])
            done.files.append(file)
    if target == "systemd":
        unit_files = [p for p in done.files if p.suffix == ".service"]
        units = [unit_name(s) for s in SERVICES] if default_location else [str(p) for p in unit_files]
        done.commands = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", *units]]
        done.notes = ["loginctl enable-linger $USER"]
    else:
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        done.commands = [["launchctl", "load", "-w", str(p)] for p in done.files if p.suffix == ".plist"]
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
