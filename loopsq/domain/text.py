"""How error messages quote a bad value: escaped, so that no control, format or bidi character reaches a
terminal or a log, and cut to a short prefix, so that a 1 MB value yields a one-line message."""

from __future__ import annotations

import unicodedata

#: How many characters of a bad value an error message quotes at most.
QUOTE_LIMIT = 64


def _escape(ch: str) -> str:
    if ch in ('"', "\\"):
        return "\\" + ch
    if unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    return ch


def shown(value: str, limit: int = QUOTE_LIMIT) -> str:
    """``value`` as an error message shows it (without the quotes around it): at most ``limit`` characters,
    escaped, with ``… (N more characters)`` when it was cut."""
    head = "".join(_escape(ch) for ch in value[:limit])
    rest = len(value) - limit
    return head + (f"… ({rest} more characters)" if rest > 0 else "")
