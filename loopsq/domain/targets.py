"""Validation of loop and workflow-step targets (command, agent, workflow): pure checks, no I/O.

The reference's own checks (OpenLoops 0.3 §5.2 step 6) run first, in its order and with its exact messages. loopsq's
extra type checks follow; each names the field and quotes the offending value. As with the reference's ``??``, an
optional field given as ``null`` counts as absent and is dropped from the result, except ``timeoutMs``, where
``null`` means "no timeout" (0.3.55) and is kept, and ``idleTimeoutMs``, where ``null`` means "no idle timeout"
(kept: a new agent target without one gets the default, ``agent_options.with_creation_defaults``). A field that
is not one of its type's is refused (the reference kept it, stored and shown back as if it meant something).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from loopsq.domain import agent_options, limits
from loopsq.domain.agent_output import prompt_problem
from loopsq.domain.checks import check_length, check_text, whole
from loopsq.domain.text import quoted, shown
from loopsq.errors import ValidationError

PROVIDERS = ("claude", "cursor", "codewith", "aicopilot", "opencode", "codex")
CONFIG_ISOLATIONS = ("safe", "none")
PROMPT_VIAS = ("argv", "stdin")

# JavaScript's whitespace (what ``String.prototype.trim`` and ``/\s/`` use), which differs from ``str.isspace``.
_JS_WS = "\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
_JS_WS_RE = re.compile(f"[{_JS_WS}]")
_JS_TRIM_RE = re.compile(f"\\A[{_JS_WS}]+|[{_JS_WS}]+\\Z")
_ENV_KEY_RE = re.compile(limits.ENV_KEY_PATTERN, re.ASCII)


def is_js_whitespace(ch: str) -> bool:
    """Whether the character ``ch`` is JavaScript whitespace (what the reference's ``trim`` removes)."""
    return _JS_WS_RE.fullmatch(ch) is not None


def js_trim(text: str) -> str:
    """Trims a string the way JavaScript's ``String.prototype.trim`` does.

    Args:
        text: The string to trim.

    Returns:
        ``text`` without leading and trailing JavaScript whitespace.
    """
    return _JS_TRIM_RE.sub("", text)


def is_non_empty_string(value: Any) -> bool:
    """Tells whether ``value`` is a string with something besides whitespace in it."""
    return isinstance(value, str) and js_trim(value) != ""


def short_repr(value: Any) -> str:
    """Renders a value for an error message (``text.quoted``): a short, escaped prefix of its JSON.

    Args:
        value: Any value; values JSON cannot encode fall back to ``repr``.

    Returns:
        For example ``"x"`` (with quotes), ``5`` or ``null``.
    """
    return quoted(value)


def is_positive_int(value: Any) -> bool:
    """Tells whether ``value`` is an ``int`` (not a ``bool``) greater than zero."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


_Check = Callable[[Any, str, str], Any]


def _is_array(value: Any) -> bool:
    return isinstance(value, list | tuple)


def _fail(label: str, field: str, expected: str, value: Any) -> ValidationError:
    return ValidationError(f"{label}.{field} must be {expected}, got {short_repr(value)}")


def validate_timeout_ms(value: Any, label: str) -> None:
    """Checks a ``timeoutMs`` value: a positive integer, or ``None`` meaning no timeout.

    Args:
        value: The value found under ``timeoutMs``.
        label: The path of the object holding it, e.g. ``workflow.steps[0]``.

    Raises:
        ValidationError: ``<label>.timeoutMs must be a positive integer or null, got <value>``.
    """
    if value is not None and not is_positive_int(value):
        raise _fail(label, "timeoutMs", "a positive integer or null", value)
    if value is not None and value > limits.MAX_MS:
        raise _fail(label, "timeoutMs", f"at most {limits.MAX_MS} (100 years)", value)


def validate_account(value: Any, label: str) -> dict[str, Any]:
    """Checks an account reference ``{profile, tool?}``.

    Args:
        value: The value found under ``account`` (not ``None``).
        label: The path of the object holding it, e.g. ``target``.

    Returns:
        A shallow copy, without ``tool`` when it was ``null``; other keys are kept.

    Raises:
        ValidationError: If it is not an object, or ``profile``/``tool`` is not a non-empty string.
    """
    if not isinstance(value, Mapping):
        raise _fail(label, "account", "an object with a profile", value)
    account = dict(value)
    if not is_non_empty_string(account.get("profile")):
        raise _fail(label, "account.profile", "a non-empty string", account.get("profile"))
    check_text(account["profile"], f"{label}.account.profile", limits.MAX_WORD_LENGTH)
    if account.get("tool") is None:
        account.pop("tool", None)
    elif not is_non_empty_string(account["tool"]):
        raise _fail(label, "account.tool", "a non-empty string", account["tool"])
    else:
        check_text(account["tool"], f"{label}.account.tool", limits.MAX_WORD_LENGTH)
    return account


def validate_env(value: Any, label: str, field: str = "env") -> dict[str, str]:
    """Checks an environment map: at most ``MAX_ENV_ENTRIES`` entries, keys matching ``ENV_KEY_PATTERN`` (at most
    ``MAX_ENV_KEY_LENGTH`` characters), string values of at most ``MAX_ENV_VALUE_LENGTH`` characters without NUL.

    Args:
        value: The value found under ``field``.
        label: The path of the object holding it, e.g. ``target``.
        field: The field's name (``env``).

    Returns:
        A copy of the map.

    Raises:
        ValidationError: naming the key or the value, e.g. ``target.env key must match [A-Za-z_][A-Za-z0-9_]*,
            got "A=B"`` or ``target.env.X must not contain NUL characters, got "a\\x00"``.
    """
    env = _string_map(value, label, field)
    for key, item in env.items():
        if len(key) > limits.MAX_ENV_KEY_LENGTH or not _ENV_KEY_RE.fullmatch(key):
            raise ValidationError(
                f"{label}.{field} key must match {limits.ENV_KEY_PATTERN} (at most {limits.MAX_ENV_KEY_LENGTH} "
                f"characters), got {quoted(key)}"
            )
        check_text(item, f"{label}.{field}.{key}", limits.MAX_ENV_VALUE_LENGTH)
    return env


def _string_list(value: Any, label: str, field: str) -> list[str]:
    if not _is_array(value) or not all(isinstance(item, str) for item in value):
        raise _fail(label, field, "an array of strings", value)
    if len(value) > limits.MAX_ARGS:
        raise _fail(label, field, f"an array of at most {limits.MAX_ARGS} strings", value)
    for index, item in enumerate(value):
        check_text(item, f"{label}.{field}[{index}]", limits.MAX_ARG_LENGTH)
    return list(value)


def _string_map(value: Any, label: str, field: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise _fail(label, field, "an object of string values", value)
    if len(value) > limits.MAX_ENV_ENTRIES:
        raise _fail(label, field, f"an object of at most {limits.MAX_ENV_ENTRIES} entries", value)
    for key, item in value.items():
        if not isinstance(item, str):
            raise _fail(label, f"{field}.{key}", "a string", item)
    return dict(value)


#: What a variable name in a target's ``env`` may be (POSIX shell names).
ENV_KEY_PATTERN = limits.ENV_KEY_PATTERN


def is_env_key(key: str) -> bool:
    """Whether ``key`` can name an environment variable in a target's ``env``."""
    return _ENV_KEY_RE.fullmatch(key) is not None


def _input_map(value: Any, label: str, field: str) -> dict[str, str]:
    result = _string_map(value, label, field)
    for key, item in result.items():
        check_length(key, f"{label}.{field} key", limits.MAX_ENV_KEY_LENGTH)
        check_length(item, f"{label}.{field}.{key}", limits.MAX_ENV_VALUE_LENGTH)
    return result


def _env(value: Any, label: str, field: str) -> dict[str, str]:
    return validate_env(value, label, field)


def _non_empty(value: Any, label: str, field: str) -> str:
    if not is_non_empty_string(value):
        raise _fail(label, field, "a non-empty string", value)
    return str(value)


def _string(value: Any, label: str, field: str) -> str:
    if not isinstance(value, str):
        raise _fail(label, field, "a string", value)
    return value


def _bounded(limit: int, inner: _Check | None = None) -> _Check:
    """A check that runs ``inner`` (if any), then bounds the string's length and refuses NUL."""

    def check(value: Any, label: str, field: str) -> Any:
        if inner is not None:
            value = inner(value, label, field)
        if isinstance(value, str):
            check_text(value, f"{label}.{field}", limit)
        return value

    return check


def _boolean(value: Any, label: str, field: str) -> bool:
    if not isinstance(value, bool):
        raise _fail(label, field, "a boolean", value)
    return value


def _one_of(choices: tuple[str, ...]) -> _Check:
    expected = " or ".join(f'"{choice}"' for choice in choices)

    def check(value: Any, label: str, field: str) -> str:
        if not isinstance(value, str) or value not in choices:
            raise _fail(label, field, expected, value)
        return value

    return check


def _timeout(value: Any, label: str, _field: str) -> Any:
    validate_timeout_ms(value, label)
    return value


def _idle_timeout(value: Any, label: str, field: str) -> int | None:
    if value is None:
        return None
    if not is_positive_int(value):
        raise _fail(label, field, "a positive integer or null", value)
    if value > limits.MAX_MS:
        raise _fail(label, field, f"at most {limits.MAX_MS} (100 years)", value)
    return int(value)


def _prompt(value: Any, label: str, field: str) -> Any:
    """An agent prompt (already a non-empty string, the reference's check) must say something (0.4.40)."""
    problem = prompt_problem(value) if isinstance(value, str) else None
    if problem is not None:
        raise ValidationError(f"{label}.{field} {problem}, got {short_repr(value)}")
    return value


def _account(value: Any, label: str, _field: str) -> dict[str, Any]:
    return validate_account(value, label)


# -- the later 0.3.x agent options (agent_options), prompt sources and per-run preflight -----------------------
def _dir_list(value: Any, label: str, field: str) -> list[str]:
    dirs = _string_list(value, label, field)
    for index, item in enumerate(dirs):
        if not is_non_empty_string(item):
            raise _fail(label, f"{field}[{index}]", "a non-empty string", item)
    return dirs


def _prompt_source(value: Any, label: str, field: str) -> dict[str, Any]:
    if (not isinstance(value, Mapping) or value.get("type") != "file"
            or not is_non_empty_string(value.get("path"))):
        raise _fail(label, field, 'an object {"type": "file", "path": "<file>"}', value)
    return dict(value)


def _preflight(value: Any, label: str, field: str) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not isinstance(value.get("beforeRun", False), bool):
        raise _fail(label, field, 'an object {"beforeRun": true|false}', value)
    return dict(value)


def _check_agent_options(target: Mapping[str, Any], label: str) -> None:
    """The provider x option rules of 0.3.60 (``agent_options.option_problem``), once the types are right."""
    problem = agent_options.option_problem(target)
    if problem is None:
        return
    got = (f"provider {short_repr(target.get('provider'))}" if problem.by_provider
           else short_repr(problem.value))
    raise ValidationError(f"{label}.{problem.field} {problem.reason}, got {got}")


def _refuse_unread_prompt_file(target: Mapping[str, Any], label: str) -> None:
    """``promptFile`` is read where the file is (the CLI, the SDK, a spec file's directory): it never reaches
    validation itself, so a body that still carries it (the HTTP API) is refused with what to send instead."""
    if "promptFile" in target:
        raise ValidationError(
            f"{label}.promptFile is read only by the CLI, the SDK and spec files; send the text as "
            f"{label}.prompt, got {short_repr(target['promptFile'])}"
        )


# loopsq's extra checks per target type, in the order they run.
_EXTRA_CHECKS: dict[str, tuple[tuple[str, _Check], ...]] = {
    "command": (
        ("command", _bounded(limits.MAX_COMMAND_LENGTH)),
        ("args", _string_list),
        ("cwd", _bounded(limits.MAX_CWD_LENGTH, _non_empty)),
        ("shell", _boolean),
        ("env", _env),
        ("timeoutMs", _timeout),
        ("idleTimeoutMs", _idle_timeout),
        ("account", _account),
        ("preflight", _preflight),
    ),
    "agent": (
        ("prompt", _bounded(limits.MAX_PROMPT_LENGTH, _prompt)),
        ("cwd", _bounded(limits.MAX_CWD_LENGTH, _non_empty)),
        ("model", _bounded(limits.MAX_WORD_LENGTH, _string)),
        ("agent", _bounded(limits.MAX_WORD_LENGTH, _string)),
        ("extraArgs", _string_list),
        ("timeoutMs", _timeout),
        ("idleTimeoutMs", _idle_timeout),
        ("configIsolation", _one_of(CONFIG_ISOLATIONS)),
        ("promptVia", _one_of(PROMPT_VIAS)),
        ("account", _account),
        # loopsq addition (the reference has no env on agent targets): how a loop hands an agent a secret.
        ("env", _env),
        ("variant", _non_empty),
        ("permissionMode", _one_of(agent_options.PERMISSION_MODES)),
        ("sandbox", _one_of(agent_options.SANDBOXES)),
        ("addDirs", _dir_list),
        ("authProfile", _non_empty),
        ("promptSource", _prompt_source),
        ("preflight", _preflight),
    ),
    "workflow": (("workflowId", _bounded(limits.MAX_WORD_LENGTH)), ("input", _input_map), ("timeoutMs", _timeout),
                 ("preflight", _preflight)),
}


# The fields the reference's own checks read, per type (``_check_reference_rules``).
_REFERENCE_FIELDS: dict[str, tuple[str, ...]] = {"command": ("command",), "agent": ("provider", "prompt"),
                                                 "workflow": ("workflowId",)}

# Fields where ``null`` is kept: it means "none" (no timeout, no idle timeout), not "the default".
_NULL_MEANS_NONE = frozenset({"timeoutMs", "idleTimeoutMs"})

# Integer fields: a whole float (``60000.0``) counts as the integer it holds.
_INTEGER_FIELDS = frozenset({"timeoutMs", "idleTimeoutMs"})


def _check_reference_rules(target: Mapping[str, Any], label: str, allow_workflow: bool) -> str:
    """Runs the reference's checks (§5.2 step 6), in its order, with its exact messages; returns the type."""
    kind = target.get("type")
    if kind == "command":
        command = target.get("command")
        if not isinstance(command, str) or not js_trim(command):
            raise ValidationError(f"{label}.command must be a non-empty string")
        if target.get("shell") is not True and _JS_WS_RE.search(js_trim(command)):
            raise ValidationError(
                f"{label}.command must be an executable without spaces when shell is false; "
                "put flags in args or set shell true"
            )
    elif kind == "agent":
        provider = target.get("provider")
        if not is_non_empty_string(provider):
            raise ValidationError(f"{label}.provider must be a non-empty string")
        if not is_non_empty_string(target.get("prompt")):
            raise ValidationError(f"{label}.prompt must be a non-empty string")
        if provider not in PROVIDERS:
            raise ValidationError(f"{label}.provider must be one of {', '.join(PROVIDERS)}")
    elif kind == "workflow" and allow_workflow:
        # Not in the reference (the CLI builds workflow targets itself); loopsq checks what a body may carry.
        if not is_non_empty_string(target.get("workflowId")):
            raise _fail(label, "workflowId", "a non-empty string", target.get("workflowId"))
    elif allow_workflow:
        raise ValidationError(f"{label}.type must be command, agent or workflow")
    else:
        raise ValidationError(f"{label}.type must be command or agent")
    return str(kind)


def _validate(target: Any, label: str, allow_workflow: bool) -> dict[str, Any]:
    if not isinstance(target, Mapping):
        raise ValidationError(f"{label} must be an object")
    if target.get("type") == "agent":
        _refuse_unread_prompt_file(target, label)
    kind = _check_reference_rules(target, label, allow_workflow)
    known = {"type", *_REFERENCE_FIELDS[kind], *(field for field, _ in _EXTRA_CHECKS[kind])}
    unknown = next((field for field in target if field not in known), None)
    if unknown is not None:
        # Stored, it would be shown back as if it meant something (a misspelt "timeoutMS" silently ignored).
        raise ValidationError(f"{label}.{shown(str(unknown))} is not a known field of a {kind} target")
    result = dict(target)
    for field, check in _EXTRA_CHECKS[kind]:
        if field not in result:
            continue
        if result[field] is None and field not in _NULL_MEANS_NONE:
            del result[field]
        else:
            result[field] = check(whole(result[field]) if field in _INTEGER_FIELDS else result[field], label, field)
    if kind == "agent":
        _check_agent_options(result, label)
    return result


def validate_executable_target(target: Any, label: str) -> dict[str, Any]:
    """Validates a command or agent target, as a workflow step or a loop needs it.

    Args:
        target: The decoded JSON value.
        label: The path used in messages, e.g. ``workflow.steps[0].target`` or ``target``.

    Returns:
        A shallow copy of the target: known optional fields that were ``null`` are dropped.

    Raises:
        ValidationError: On the first failed check; the reference's checks come first, in its order.
    """
    return _validate(target, label, allow_workflow=False)


def validate_target(target: Any, label: str = "target") -> dict[str, Any]:
    """Validates any loop target: command, agent, or ``{type: "workflow", workflowId, input?, timeoutMs?}``.

    Args:
        target: The decoded JSON value.
        label: The path used in messages.

    Returns:
        A shallow copy of the target, as :func:`validate_executable_target` returns it.

    Raises:
        ValidationError: On the first failed check.
    """
    return _validate(target, label, allow_workflow=True)
