"""What a command or agent target will run, resolved and fingerprinted for ``show``, the API's loop detail and the
dashboard (OpenLoops 0.5.5's ``commandDigest``): the command line and a digest of it, both from
``spec.build_spec``, the very code that builds the process of every run, so the digest changes exactly when what
runs changes.

The digest is ``cmd:sha256:<hex>``, the SHA-256 of the canonical JSON (keys sorted, no spaces, UTF-8) of::

    {"account": [<profile>, <tool>] or null, "argv": [...], "cwd": <dir or null>, "envKeys": [...],
     "stdin": <the prompt sent on stdin, or null>}

- ``argv``: the argv the process gets, whole (a shell target's ``/bin/sh -c <line>``; an agent's executable,
  provider options, extra arguments and a prompt passed on argv). A value that differs per run takes a fixed
  placeholder (``PLACEHOLDERS``: the run id, slot, loop id and name, attempt 1), as in codewith's idempotency key.
- ``cwd``, ``stdin`` (the prompt when it goes on standard input: it is part of what runs) and ``account``: the
  accounts profile and tool the run is routed through (names, not secrets).
- ``envKeys``: the names, sorted, of the variables loopsq gives the target on top of what it inherits from its
  worker: the target's own ``env``, ``PATH``, the run's ``LOOPS_*`` variables, and ``LOOPS_ACCOUNT_PROFILE`` and
  ``LOOPS_ACCOUNT_TOOL`` with an account. Values are never hashed (a secret never reaches the digest: a changed
  value leaves it as it was), nor is the worker's own environment (it differs per host), nor what the accounts
  CLI exports when the run starts (nothing is run to compute a digest).

No I/O: the account is not resolved, no executable is looked up.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loopsq.domain.agent_options import prompt_on_argv
from loopsq.domain.redaction import PROMPT_VISIBLE_CHARS, redact
from loopsq.errors import LoopsqError
from loopsq.executor.spec import RunMetadata, build_spec

DIGEST_PREFIX = "cmd:sha256:"
#: The per-run values of the ``LOOPS_*`` variables and of a codewith idempotency key, as the digest sees them.
PLACEHOLDERS = RunMetadata(loop_id="<loop>", loop_name="<name>", run_id="<run>", scheduled_for="<slot>",
                           attempt=1, control_file="<control-file>")


@dataclass(frozen=True)
class ResolvedCommand:
    """A target's command line (its prompt redacted as ``show`` redacts it), the names of the variables it gets and
    the digest of what runs."""

    line: str
    env_keys: tuple[str, ...]
    digest: str

    def to_fields(self) -> dict[str, Any]:
        """The fields ``show``, the API and the dashboard add to a loop."""
        return {"commandLine": self.line, "commandEnvKeys": list(self.env_keys), "commandDigest": self.digest}


def _names_only(account: Mapping[str, Any], tool_hint: str | None, _env: Mapping[str, str]) -> dict[str, str]:
    """The variables loopsq itself adds for an account (the accounts CLI's exports are known only at run time)."""
    return {"LOOPS_ACCOUNT_PROFILE": str(account.get("profile", "")),
            "LOOPS_ACCOUNT_TOOL": str(account.get("tool") or tool_hint or "")}


def resolve_command(target: Mapping[str, Any]) -> ResolvedCommand:
    """The command line and digest of a command or agent target.

    Raises:
        LoopsqError: the target cannot run (an unknown provider, a blank prompt): its run would fail the same way.
    """
    spec = build_spec(target, PLACEHOLDERS, env={}, resolve_account=_names_only)
    account = [spec.account_profile, spec.account_tool] if spec.account_profile is not None else None
    document = {"account": account, "argv": list(spec.argv), "cwd": spec.cwd, "envKeys": sorted(spec.env),
                "stdin": spec.stdin_text}
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = DIGEST_PREFIX + hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    shown = list(spec.argv)
    prompt = target.get("prompt")
    if target.get("type") == "agent" and prompt_on_argv(target) and isinstance(prompt, str) and shown:
        shown[-1] = redact(prompt, PROMPT_VISIBLE_CHARS)  # (the prompt is the last argument)
    return ResolvedCommand(line=shlex.join(shown), env_keys=tuple(sorted(spec.env)), digest=digest)


def command_fields(target: Any) -> dict[str, Any]:
    """``commandLine``, ``commandEnvKeys`` and ``commandDigest`` of a loop's target; ``commandError`` instead when
    it cannot run; nothing for a workflow target (each step is a command of its own)."""
    if not isinstance(target, Mapping) or target.get("type") not in ("command", "agent"):
        return {}
    try:
        return resolve_command(target).to_fields()
    except LoopsqError as exc:
        return {"commandError": exc.message}
