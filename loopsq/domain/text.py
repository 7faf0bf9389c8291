"""How error messages quote a bad value: escaped, so that no control, format or bidi character reaches a
terminal or a log, and cut to a short prefix, so that a 1 MB value yields a one-line message."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

#: How many characters of a bad value an error message quotes at most.
QUOTE_LIMIT = 64


def _escape(ch: str, quotes: bool = True) -> str:
    if quotes and ch in ('"', "\\"):
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


def quoted(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """Any user value as an error message quotes it: a string in double quotes (``shown``), anything else as its
    JSON (``repr`` when JSON cannot encode it), cut to ``limit`` characters and escaped the same way.

    Only the prefix is encoded, so quoting a huge list costs no more than quoting a short one.
    """
    if isinstance(value, str):
        return f'"{shown(value, limit)}"'
    chunks: list[str] = []
    size = 0
    cut = False
    try:
        for chunk in json.JSONEncoder(ensure_ascii=False).iterencode(value):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                cut = True
                break
        text = "".join(chunks)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
        cut = len(text) > limit
    # JSON text has its quotes escaped already; only invisible characters are escaped here.
    head = "".join(_escape(ch, quotes=False) for ch in text[:limit])
    return head + "…" if cut or len(text) > limit else head
