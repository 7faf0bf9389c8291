"""What a worker can run, as it publishes it in its liveness record, and whether a target fits a worker.

A worker probes once, at start: its targets' ``PATH`` (the inherited one with the common bin directories appended,
``system.exec_path.normalize_execution_path``, exactly as the executor builds it), which provider CLIs and whether the
``accounts`` CLI are on it, and their ``--version`` lines (in a background thread: a slow CLI must not hold the
worker up; the versions appear in the record when known). A CLI installed later is seen after a restart.

``judge`` tells whether one target could start on one worker, from that record: an agent needs its provider CLI,
an account-routed target the accounts CLI, a command target without a shell its executable (looked up on the
worker's ``PATH``, which can only be done on the worker's own host: elsewhere the answer is "cannot tell").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loopsq.errors import LoopsqError
from loopsq.executor.spec import PROVIDER_EXECUTABLES, RunMetadata, build_spec, find_executable, inherited_env
from loopsq.system.exec_path import normalize_execution_path

VERSION_TIMEOUT_S = 5.0
_VERSION_CHARS = 80

CAN = "yes"
CANNOT = "no"
UNKNOWN = "unknown"


def _version(path: str, env: Mapping[str, str]) -> str | None:
    """The first line ``<path> --version`` prints, or None when it fails or says nothing."""
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, env=dict(env), errors="replace")
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0].strip()[:_VERSION_CHARS] if lines else None


def probe(env: Mapping[str, str] | None = None, *, versions: bool = True) -> dict[str, Any]:
    """What this process's targets can find: ``{"path", "tools": {cmd: {"path", "version"?}}, "accounts"}``.

    ``tools`` holds each provider CLI found on ``PATH`` (keyed by its executable name, e.g. ``cursor-agent``);
    ``accounts`` is the accounts CLI's entry, or None. With ``versions`` each entry gets its ``--version`` line.
    """
    base = inherited_env(os.environ if env is None else env)
    # The PATH a target really runs with: the inherited one plus ~/.local/bin and the other common directories,
    # so a CLI its installer put in ~/.local/bin is published (and judged) as the executor will find it.
    path = normalize_execution_path({**base, "PATH": base.get("PATH", os.defpath)})
    base["PATH"] = path
    tools: dict[str, dict[str, str]] = {}
    for command in dict.fromkeys((*PROVIDER_EXECUTABLES.values(), "accounts")):
        found = shutil.which(command, path=path)
        if found:
            tools[command] = {"path": found}
            if versions:
                version = _version(found, base)
                if version:
                    tools[command]["version"] = version
    accounts = tools.pop("accounts", None)
    return {"path": path, "tools": tools, "accounts": accounts}


class Published:
    """This process's capabilities for its liveness record: the quick part at once, the versions when known."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value: dict[str, Any] | None = None
        self._started = False

    def current(self) -> dict[str, Any]:
        """The capabilities as known now (the first call probes PATH and starts the version probe)."""
        with self._lock:
            if not self._started:
                self._started = True
                self._value = probe(versions=False)
                threading.Thread(target=self._complete, name="loopsq-capabilities", daemon=True).start()
            assert self._value is not None
            return self._value

    def _complete(self) -> None:
        full = probe(versions=True)
        with self._lock:
            self._value = full


_PUBLISHED = Published()


def published() -> dict[str, Any]:
    """What this process publishes (see ``Published``)."""
    return _PUBLISHED.current()


@dataclass(frozen=True)
class Verdict:
    """Whether a target can start on one worker: ``yes``, ``no`` or ``unknown``, and why (not for ``yes``)."""

    status: str
    reason: str | None = None


def _without_account(target: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in target.items() if k != "account"}


def judge(target: Mapping[str, Any], can: Mapping[str, Any] | None, *, same_host: bool) -> Verdict:
    """Whether ``target`` (a command or agent target) could start on a worker that published ``can``.

    Args:
        target: a validated command or agent target.
        can: the worker's published capabilities (``probe``'s shape), None for a worker that published none.
        same_host: the worker runs on this host, so its ``PATH`` can be searched here.
    """
    if can is None:
        return Verdict(UNKNOWN, "the worker does not publish what it can run (an older loopsq)")
    if target.get("account") and not can.get("accounts"):
        return Verdict(CANNOT, "accounts CLI is not on the worker's PATH")
    own_path = (target.get("env") or {}).get("PATH")
    path = own_path or str(can.get("path") or os.defpath)
    if target.get("type") == "agent" and own_path is None:
        command = PROVIDER_EXECUTABLES.get(str(target.get("provider")), str(target.get("provider")))
        if command in (can.get("tools") or {}):
            return Verdict(CAN)
        return Verdict(CANNOT, f"Executable not found in PATH: {command}")
    if target.get("type") == "command" and target.get("shell") is True:
        return Verdict(CAN)  # /bin/sh finds the command at run time
    if not same_host:
        return Verdict(UNKNOWN, "its executable can only be looked up on the worker's host")
    try:
        spec = build_spec(_without_account(target), RunMetadata(), env={"PATH": path})
    except LoopsqError as exc:
        return Verdict(CANNOT, exc.message)
    if find_executable(spec) is None:
        return Verdict(CANNOT, f"Executable not found in PATH: {spec.command}")
    return Verdict(CAN)


def judge_all(targets: list[Mapping[str, Any]], can: Mapping[str, Any] | None, *, same_host: bool) -> Verdict:
    """One worker's verdict on several targets that must all start there (a workflow's steps): the first
    ``no``, else the first ``unknown``, else ``yes``."""
    verdicts = [judge(t, can, same_host=same_host) for t in targets]
    for status in (CANNOT, UNKNOWN):
        found = next((v for v in verdicts if v.status == status), None)
        if found is not None:
            return found
    return Verdict(CAN)
