"""Agent usage: input and output tokens and cost, parsed per provider from the JSON the provider CLI prints.

Each provider's headless JSON output (the flags ``executor.spec`` passes) carries usage differently:

- ``claude -p --output-format json``: one result object (``{"type": "result", "usage": {"input_tokens",
  "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}, "total_cost_usd"}``); with
  stream output, the last ``result`` line;
- ``codex exec --json``: JSON lines; ``turn.completed`` events carry ``usage`` (``input_tokens``,
  ``cached_input_tokens``, ``output_tokens``), summed over the turns; no cost;
- ``codewith exec --json``: the same events, but its ``turn.completed`` carries the thread's running total: the
  last one counts;
- ``opencode run --format json`` (and ``aicopilot``): JSON lines; ``step_finish`` events carry
  ``part.tokens`` (``input``, ``output``, ``reasoning``, ``cache.read``, ``cache.write``) and ``part.cost``,
  summed over the steps;
- anything else (``cursor``): the last JSON object with a ``usage`` object or a cost field.

Cached input counts as input. Output that carries none of these gives None. No I/O.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: Stop looking after this much output (the executor keeps a bounded tail anyway).
MAX_SCAN_CHARS = 4 * 1024 * 1024
_COST_KEYS = ("total_cost_usd", "cost_usd", "costUsd", "totalCostUsd", "cost")


@dataclass(frozen=True)
class Usage:
    """What one run used."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None

    def to_fields(self) -> dict[str, Any]:
        """The run fields (``input_tokens``, ``output_tokens``, ``cost_usd``)."""
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost_usd": None if self.cost_usd is None else round(self.cost_usd, 6)}


def json_objects(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects in ``text``: the whole text as one, else one per line."""
    text = text[-MAX_SCAN_CHARS:]
    stripped = text.strip()
    if not stripped:
        return
    try:
        whole = json.loads(stripped)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        yield whole
        return
    if isinstance(whole, list):
        yield from (item for item in whole if isinstance(item, dict))
        return
    for line in stripped.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            yield value


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) \
        and value >= 0 else 0


def _cost(obj: Mapping[str, Any]) -> float | None:
    for key in _COST_KEYS:
        value = obj.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return float(value)
    return None


def _claude(objects: list[dict[str, Any]]) -> Usage | None:
    results = [o for o in objects if o.get("type") == "result" or "total_cost_usd" in o]
    if not results:
        return None
    last = results[-1]
    usage = _dict(last.get("usage"))
    inputs = sum(_int(usage.get(k)) for k in ("input_tokens", "cache_read_input_tokens",
                                              "cache_creation_input_tokens"))
    return Usage(inputs, _int(usage.get("output_tokens")), _cost(last))


def _codex(objects: list[dict[str, Any]]) -> Usage | None:
    turns = [o["usage"] for o in objects if o.get("type") == "turn.completed" and isinstance(o.get("usage"), dict)]
    if not turns:
        return None
    # cached_input_tokens is a part of input_tokens in codex's accounting.
    return Usage(sum(_int(u.get("input_tokens")) for u in turns), sum(_int(u.get("output_tokens")) for u in turns))


def _codewith(objects: list[dict[str, Any]]) -> Usage | None:
    turns = [o["usage"] for o in objects if o.get("type") == "turn.completed" and isinstance(o.get("usage"), dict)]
    if not turns:
        return None
    return Usage(_int(turns[-1].get("input_tokens")), _int(turns[-1].get("output_tokens")))


def _opencode(objects: list[dict[str, Any]]) -> Usage | None:
    parts = [o["part"] for o in objects if o.get("type") == "step_finish" and isinstance(o.get("part"), dict)]
    if not parts:
        return None
    inputs = outputs = 0
    cost = 0.0
    costed = False
    for part in parts:
        tokens = _dict(part.get("tokens"))
        cache = _dict(tokens.get("cache"))
        inputs += _int(tokens.get("input")) + _int(cache.get("read")) + _int(cache.get("write"))
        outputs += _int(tokens.get("output")) + _int(tokens.get("reasoning"))
        part_cost = _cost(part)
        if part_cost is not None:
            cost += part_cost
            costed = True
    return Usage(inputs, outputs, cost if costed else None)


def _generic(objects: list[dict[str, Any]]) -> Usage | None:
    for obj in reversed(objects):
        usage = obj.get("usage")
        cost = _cost(obj)
        if isinstance(usage, dict) or cost is not None:
            usage = usage if isinstance(usage, dict) else {}
            inputs = _int(usage.get("input_tokens", usage.get("inputTokens")))
            outputs = _int(usage.get("output_tokens", usage.get("outputTokens")))
            return Usage(inputs, outputs, cost)
    return None


_PARSERS = {"claude": _claude, "codex": _codex, "codewith": _codewith, "opencode": _opencode, "aicopilot": _opencode}


def parse_usage(provider: str, stdout: str) -> Usage | None:
    """The usage an agent run of ``provider`` reported on stdout, or None when it reported none."""
    objects = list(json_objects(stdout or ""))
    if not objects:
        return None
    return _PARSERS.get(provider, _generic)(objects) or _generic(objects)
