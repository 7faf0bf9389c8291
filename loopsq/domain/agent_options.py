"""Agent target options of the reference's later 0.3.x (to 0.3.60): which provider takes which option, the
defaults a new target gets, and the rule that keeps a prompt on argv from being read as an option. Pure rules.

Options (each optional): ``variant`` (reasoning effort), ``permissionMode`` (``default|plan|auto|bypass``),
``sandbox`` (``read-only|workspace-write|danger-full-access`` for codex and codewith, ``enabled|disabled`` for
cursor), ``addDirs`` (codex and codewith), ``authProfile`` (codewith only). ``loopsq.executor.spec.agent_args``
turns them into each provider's argv. codewith runs as one ``codewith exec --json`` process, as codex does
(OpenLoops 0.4.9 dropped 0.3.60's durable ``agent start`` + polling); a target stored for the durable mode (its
prompt on argv) loads and runs the same way.

**End of options.** A prompt passed on argv always follows ``--`` where the provider's CLI takes it as the end of
its options (claude and cursor: commander; codex and codewith: clap; opencode: yargs, which joins what follows
``--`` into the message). aicopilot is not known to, so there a prompt on argv must not begin with ``-``
(``promptVia: "stdin"`` passes any prompt safely).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PERMISSION_MODES = ("default", "plan", "auto", "bypass")
CODEX_SANDBOXES = ("read-only", "workspace-write", "danger-full-access")
CURSOR_SANDBOXES = ("enabled", "disabled")
SANDBOXES = (*CODEX_SANDBOXES, *CURSOR_SANDBOXES)
CODEX_LIKE = ("codex", "codewith")
#: Providers whose CLI ends its options at ``--``: a prompt on argv is passed after it.
SEPARATOR_PROVIDERS = frozenset({"claude", "cursor", "codewith", "codex", "opencode"})
#: What a codewith target's ``extraArgs`` may not hold (0.3.60's list, still refused): a subcommand or a stray
#: positional, or a flag that loopsq's ``exec --json --ephemeral`` passes itself or that would change its output.
CODEWITH_FORBIDDEN_EXTRA_ARGS = (
    "e", "exec", "agent", "start", "--ephemeral", "--ignore-rules", "--skip-git-repo-check", "--json",
    "--output-last-message", "-o", "--output-schema", "--dangerously-bypass-approvals-and-sandbox",
)
OPENCODE_MODEL_HINT = "pass a provider/model id such as openrouter/google/gemini-2.5-flash"
#: The timeout a new agent target gets when none is given: none (0.3.55). Command targets get 30 minutes.
AGENT_DEFAULT_TIMEOUT_MS: int | None = None
COMMAND_DEFAULT_TIMEOUT_MS = 1_800_000
#: The idle timeout (no stdout or stderr for that long) a new agent target gets when it is given neither a timeout
#: nor an idle timeout (OpenLoops 0.4.0's idle watchdog): 30 minutes for a provider whose CLI, as loopsq runs it,
#: writes while it works; 4 hours for one that prints nothing until it ends, where half an hour of silence is an
#: ordinary long run, not a hang.
AGENT_IDLE_TIMEOUT_MS = 1_800_000
BUFFERED_AGENT_IDLE_TIMEOUT_MS = 14_400_000
#: The providers that write while they work: ``codex exec --json`` and ``codewith exec --json`` (OpenLoops 0.4.9's
#: one-shot mode, which loopsq runs) stream their events. The others print their result at the end: ``claude -p
#: --output-format json``, ``cursor -p`` (text), ``opencode``/``aicopilot run --format json`` (as OpenLoops 0.4.0
#: counts them).
STREAMING_PROVIDERS = frozenset({"codex", "codewith"})


def default_prompt_via(provider: str) -> str:
    """How a new target of ``provider`` passes its prompt when nothing is said: on stdin (0.3.3), codewith too
    now that it runs ``exec`` (0.3.60's ``agent start`` took it on argv). A stored target without ``promptVia``
    uses argv."""
    return "stdin"


def prompt_on_argv(target: Mapping[str, Any]) -> bool:
    """Whether the target's prompt goes on argv (unless ``promptVia`` is stdin)."""
    return target.get("promptVia") != "stdin"


def codex_like_sandbox(target: Mapping[str, Any]) -> str:
    """The ``--sandbox`` of a codex or codewith target: its own, else ``danger-full-access`` when bypassing
    permissions, else ``workspace-write``."""
    sandbox = target.get("sandbox")
    if sandbox:
        return str(sandbox)
    return "danger-full-access" if target.get("permissionMode") == "bypass" else "workspace-write"


def default_idle_timeout_ms(provider: str) -> int:
    """The idle timeout a new agent target of ``provider`` gets (``AGENT_IDLE_TIMEOUT_MS`` for the
    ``STREAMING_PROVIDERS``, else ``BUFFERED_AGENT_IDLE_TIMEOUT_MS``)."""
    return AGENT_IDLE_TIMEOUT_MS if provider in STREAMING_PROVIDERS else BUFFERED_AGENT_IDLE_TIMEOUT_MS


def with_creation_defaults(target: Mapping[str, Any]) -> dict[str, Any]:
    """A new (validated) command or agent target with the defaults it is created with written into it, so that the
    stored target keeps them whatever later versions default to: ``timeoutMs`` (agents: ``null``, no timeout;
    commands: 30 min), an agent's ``promptVia`` (``default_prompt_via``) and, on an agent given neither
    ``timeoutMs`` nor ``idleTimeoutMs``, the idle timeout (``default_idle_timeout_ms``; a target given
    ``idleTimeoutMs: null``, or a timeout of its own, has none, as in OpenLoops 0.4.0). A target stored before
    keeps what it has: no idle timeout. Other targets are returned as they are."""
    out = dict(target)
    kind = out.get("type")
    if kind == "command":
        out.setdefault("timeoutMs", COMMAND_DEFAULT_TIMEOUT_MS)
    elif kind == "agent":
        if "timeoutMs" not in out and "idleTimeoutMs" not in out:
            out["idleTimeoutMs"] = default_idle_timeout_ms(str(out.get("provider")))
        out.setdefault("timeoutMs", AGENT_DEFAULT_TIMEOUT_MS)
        out.setdefault("promptVia", default_prompt_via(str(out.get("provider"))))
    return out


@dataclass(frozen=True)
class OptionProblem:
    """An agent option its provider does not take: the camelCase field, what is wrong with it (words that follow
    the field's name) and the offending value; ``by_provider``: the value is fine, the provider is what refuses
    it (the message then quotes the provider)."""

    field: str
    reason: str
    value: Any
    by_provider: bool = False


def option_problem(target: Mapping[str, Any], *, cli: bool = False) -> OptionProblem | None:
    """The first agent option that ``target``'s provider does not take (0.3.60's rules), or None.

    Args:
        target: an agent target whose fields have the right types.
        cli: word the reasons for the command line (``--provider``, ``--prompt-via``) instead of the JSON fields.
    """
    provider = str(target.get("provider"))
    p = f"--provider {provider}" if cli else f"provider {provider}"

    def has(field: str) -> bool:
        return target.get(field) not in (None, "", [], ())

    def refused(field: str, reason: str) -> OptionProblem:
        return OptionProblem(field, reason, target.get(field), by_provider=True)

    if has("authProfile") and provider != "codewith":
        return refused("authProfile", "is currently supported only for " + ("--provider codewith" if cli
                                                                             else "provider codewith"))
    if has("variant") and provider == "cursor":
        return refused("variant", f"is not supported for {p}")
    if has("addDirs") and provider not in CODEX_LIKE:
        return refused("addDirs", "is currently supported only for codewith or codex")
    if has("agent") and provider in CODEX_LIKE:
        return refused("agent", f"is not supported for {p}")
    if provider == "opencode" and not str(target.get("model") or "").strip():
        return OptionProblem("model", f"is required for {p}; {OPENCODE_MODEL_HINT}", target.get("model"))
    mode = target.get("permissionMode")
    if mode == "auto" and provider == "cursor":
        return OptionProblem("permissionMode", f"auto is not supported for {p}; use provider-specific extraArgs "
                             "for Cursor auto-review", mode)
    if mode in ("plan", "auto") and provider not in ("claude", "cursor"):
        return OptionProblem("permissionMode", f"supports only default or bypass for {p}", mode)
    sandbox = target.get("sandbox")
    if has("sandbox"):
        if provider in CODEX_LIKE and sandbox not in CODEX_SANDBOXES:
            return OptionProblem("sandbox", f"must be read-only, workspace-write, or danger-full-access for {p}",
                                 sandbox)
        if provider == "cursor" and sandbox not in CURSOR_SANDBOXES:
            return OptionProblem("sandbox", f"must be enabled or disabled for {p}", sandbox)
        if provider not in (*CODEX_LIKE, "cursor"):
            return refused("sandbox", f"is not supported for {p}")
    if provider == "codewith":
        bad = next((arg for arg in target.get("extraArgs") or [] if arg in CODEWITH_FORBIDDEN_EXTRA_ARGS), None)
        if bad is not None:
            return OptionProblem("extraArgs", f"cannot include {bad} for {p}; loopsq runs codewith exec --json "
                                 "--ephemeral with its own flags", bad)
    prompt = target.get("prompt")
    if (prompt_on_argv(target) and provider not in SEPARATOR_PROVIDERS and isinstance(prompt, str)
            and prompt.startswith("-")):
        via = "--prompt-via stdin" if cli else 'promptVia "stdin"'
        return OptionProblem("prompt", f'must not begin with "-" when passed on argv to {p} (its CLI takes no '
                             f"end-of-options separator); use {via}", prompt)
    return None
