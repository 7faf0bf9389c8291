"""Human durations (``30s``, ``5m``, ``1.5h``) to and from integer milliseconds, as the reference's ``parseDuration``."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from loopsq.domain.text import shown
from loopsq.errors import ValidationError

MS_PER_UNIT: dict[str, int] = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

#: The largest duration loopsq accepts anywhere (100 years of 365 days); beyond it datetime arithmetic overflows.
MAX_DURATION_MS = 100 * 365 * MS_PER_UNIT["d"]

# ASCII only: without it ``\d`` also matches other scripts' digits, which the reference's JS regex rejects.
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?", re.ASCII)

# Longer duration texts are refused unread: no valid duration needs them.
_MAX_TEXT = 64

# Units from largest to smallest, for ``format_duration``.
_FORMAT_UNITS = ("d", "h", "m", "s")


def parse_duration(text: str) -> int:
    """Parse a human duration into milliseconds.

    The trimmed text must be a non-negative decimal number with an optional unit (``ms``, ``s``, ``m``, ``h``,
    ``d``; none means ms). The result is rounded half up, as JS ``Math.round`` does, so ``"2.5ms"`` is 3.

    Args:
        text: The duration as the user gave it, e.g. ``"30s"`` or ``"1.5h"``.

    Returns:
        The duration in whole milliseconds.

    Raises:
        ValidationError: ``invalid duration: <text>`` for anything else, including compound forms (``1h30m``),
            negatives, exponents and values over 100 years.
    """
    match = _DURATION.fullmatch(text.strip()) if len(text) <= _MAX_TEXT else None
    if match is None:
        raise ValidationError(f"invalid duration: {shown(text)}")
    number, unit = match.group(1), match.group(2) or "ms"
    try:
        # Decimal, not float: float turns "0.0005s" into 0.49999… ms, which then rounds the wrong way.
        exact = Decimal(number) * MS_PER_UNIT[unit]
        if exact > MAX_DURATION_MS:
            raise ValidationError(f"invalid duration: {shown(text)}")
        return int(exact.quantize(Decimal(1), rounding=ROUND_HALF_UP))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only plain decimals
        raise ValidationError(f"invalid duration: {shown(text)}") from exc


def format_duration(ms: int) -> str:
    """Format milliseconds compactly in the largest unit that divides them exactly.

    Args:
        ms: A duration in milliseconds.

    Returns:
        ``"0ms"``, ``"1500ms"``, ``"90s"``, ``"5m"``, ``"1h"``, ``"1d"`` and so on.
    """
    if ms == 0:
        return "0ms"
    for unit in _FORMAT_UNITS:
        size = MS_PER_UNIT[unit]
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def duration_setting(env: Mapping[str, str], name: str, default_ms: int, example: str) -> int:
    """The duration a setting ``name`` holds in ``env`` (e.g. ``30s``), in ms; ``default_ms`` when unset or empty.

    Raises:
        ValidationError: anything but a duration above zero, naming the setting and quoting the value
            (``<name> must be a duration greater than zero such as <example>, got '<value>'``).
    """
    text = env.get(name)
    if text is None or text == "":
        return default_ms
    try:
        ms = parse_duration(text)
    except ValidationError:
        ms = 0
    if ms <= 0:
        raise ValidationError(f"{name} must be a duration greater than zero such as {example}, got '{text}'")
    return int(ms)


def describe_ms(ms: int) -> str:
    """A duration as the logs and messages show it: ``2.5s``, ``30s``, ``500ms`` (the same figure everywhere, so
    a worker that announces a 2.5 s grace never says 2 s or 3 s when it applies it)."""
    return f"{ms / 1000:g}s" if ms >= 1000 else f"{ms}ms"
