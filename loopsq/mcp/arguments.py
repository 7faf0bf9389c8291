"""Checking a tool call: the mutation gate, then the arguments against the tool's published JSON schema.

Every refusal is a ``ValidationError`` with one line naming the argument and quoting the value, in the words
loopsq's own validation uses (``catchUpLimit must be a positive integer, got 0``), so a field that the domain
checks too reads the same either way. The gate comes first and carries the reference's text (§11.3), with
loopsq's variable named. There is no ``confirm`` literal any more (OpenLoops 0.4.0: LLM clients fill in
required literals themselves, so they confirmed nothing): the server's environment alone decides.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema import ValidationError as SchemaError

from loopsq.domain.loop_spec import show
from loopsq.domain.text import shown
from loopsq.errors import ValidationError
from loopsq.mcp.context import ALLOW_MUTATIONS_ENV, ALLOW_TOOLS_ENV

MUTATIONS_REFUSED = f"MCP mutation tools require {ALLOW_MUTATIONS_ENV}=true"
#: An argument that older clients send and that no longer means anything (the removed ``confirm`` literal).
IGNORED_ARGUMENTS = ("confirm",)
#: How much of a schema library message a refusal quotes at most (its messages embed the value).
MAX_DETAIL = 200

_TYPE_WORDS = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "a boolean",
               "object": "an object", "array": "an array", "null": "null"}


def check_gates(tool: str, allowed: bool, allowed_tools: Collection[str] | None) -> None:
    """The gate of a mutation tool: ``LOOPSQ_MCP_ALLOW_MUTATIONS``, then ``LOOPSQ_MCP_ALLOW_TOOLS`` when set.

    Raises:
        ValidationError: ``MCP mutation tools require LOOPSQ_MCP_ALLOW_MUTATIONS=true``, or
            ``MCP tool <name> is not in LOOPSQ_MCP_ALLOW_TOOLS (<the names it holds>)``.
    """
    if not allowed:
        raise ValidationError(MUTATIONS_REFUSED)
    if allowed_tools is not None and tool not in allowed_tools:
        raise ValidationError(f"MCP tool {tool} is not in {ALLOW_TOOLS_ENV} ({', '.join(sorted(allowed_tools))})")


def parse_allowed_tools(text: str | None, mutation_tools: Sequence[str]) -> frozenset[str] | None:
    """``LOOPSQ_MCP_ALLOW_TOOLS`` (comma-separated mutation tool names) as a set; None when unset or blank.

    Raises:
        ValidationError: ``LOOPSQ_MCP_ALLOW_TOOLS must name mutation tools (<names>), got '<name>'``.
    """
    names = [name.strip() for name in (text or "").split(",") if name.strip()]
    if not names:
        return None
    for name in names:
        if name not in mutation_tools:
            value = "'" + shown(name).replace("'", "\\'") + "'"
            raise ValidationError(f"{ALLOW_TOOLS_ENV} must name mutation tools ({', '.join(mutation_tools)}), "
                                  f"got {value}")
    return frozenset(names)


def without_ignored(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``arguments`` without ``IGNORED_ARGUMENTS`` (an older client's ``confirm`` changes nothing)."""
    return {key: value for key, value in arguments.items() if key not in IGNORED_ARGUMENTS}


def schema_errors(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[SchemaError]:
    """The schema's complaints about ``arguments``, in a fixed order (by the argument's place in the schema)."""
    order = {name: i for i, name in enumerate(schema.get("properties", {}))}
    errors = list(Draft202012Validator(schema).iter_errors(arguments))

    def position(error: SchemaError) -> tuple[int, int, str]:
        path = list(error.absolute_path)
        head = str(path[0]) if path else _unknown_key(error) or ""
        return (order.get(head, len(order)), len(path), error.message)

    return sorted(errors, key=position)


def check_schema(schema: Mapping[str, Any], arguments: Mapping[str, Any], *, skip: Iterable[str] = ()) -> None:
    """Refuse ``arguments`` that break ``schema``, on the first problem (arguments in ``skip`` are left for
    later: the domain checks them with its own messages).

    Raises:
        ValidationError: one line naming the argument and quoting the value.
    """
    deferred = set(skip)
    for error in schema_errors(schema, arguments):
        path = list(error.absolute_path)
        head = str(path[0]) if path else _unknown_key(error)
        if head in deferred:
            continue
        raise ValidationError(describe(error))


def describe(error: SchemaError) -> str:
    """One line for a schema error: the argument's path, what it must be, and the value given."""
    where = _path(error.absolute_path)
    # jsonschema types these as unions with its Unset marker; on a reported error they are set.
    value: Any = error.instance
    kind: Any = error.validator
    expected: Any = error.validator_value
    schema: Any = error.schema
    if kind == "oneOf" and error.context:
        branch = _matching_branch(error)
        if branch is not None:
            return describe(branch)
        return f"{where} must be one of its documented shapes, got {show(value)}"
    if kind == "type":
        words = [_TYPE_WORDS.get(str(t), str(t)) for t in (expected if isinstance(expected, list) else [expected])]
        return f"{where} must be {' or '.join(words)}, got {show(value)}"
    if kind == "enum":
        return f"{where} must be one of {', '.join(str(v) for v in expected)}, got {show(value)}"
    if kind == "const":
        return f"{where} must be exactly {show(expected)}, got {show(value)}"
    if kind in ("minimum", "maximum"):
        return f"{where} must be {_range(schema)}, got {show(value)}"
    if kind == "minLength":
        return f"{where} must be a non-empty string, got {show(value)}"
    if kind == "maxLength":
        return f"{where} must be at most {expected} characters, got {show(value)}"
    if kind == "maxItems":
        return f"{where} must have at most {expected} items, got {len(value)}"
    if kind == "maxProperties":
        return f"{where} must have at most {expected} entries, got {len(value)}"
    if kind == "pattern":
        return f"{where} must match {expected}, got {show(value)}"
    if kind == "required":
        missing = next(name for name in expected if name not in value)
        return f"{_path([*error.absolute_path, missing])} is required"
    if kind == "additionalProperties":
        extra = _unknown_key(error)
        allowed = ", ".join(schema.get("properties", {}))
        if not error.absolute_path:
            return f"unknown argument {show(extra)} (expected one of: {allowed})"
        return f"unknown field {show(extra)} in {where} (expected one of: {allowed})"
    return f"{where} is invalid: {shown(error.message, MAX_DETAIL)}"


def _matching_branch(error: SchemaError) -> SchemaError | None:
    """Of a tagged union's failed branches, the first complaint of the branch whose tag the value carries."""
    value: Any = error.instance
    tag = value.get("type") if isinstance(value, dict) else None
    branches: Any = error.validator_value
    for index, branch in enumerate(branches):
        if branch.get("properties", {}).get("type", {}).get("const") == tag:
            inside = [e for e in error.context or () if e.relative_schema_path and e.relative_schema_path[0] == index]
            return min(inside, key=lambda e: len(e.absolute_path), default=None)
    return None


def _range(schema: Mapping[str, Any]) -> str:
    low, high = schema.get("minimum"), schema.get("maximum")
    noun = "an integer" if schema.get("type") == "integer" else "a number"
    if low == 1 and high is None and noun == "an integer":
        return "a positive integer"
    if low is not None and high is not None:
        return f"{noun} from {low} to {high}"
    return f"{noun} >= {low}" if low is not None else f"{noun} <= {high}"


def _unknown_key(error: SchemaError) -> str | None:
    if error.validator != "additionalProperties" or not isinstance(error.instance, dict):
        return None
    schema: Any = error.schema
    known = schema.get("properties", {})
    return next((str(k) for k in error.instance if k not in known), None)


def _path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "arguments"
