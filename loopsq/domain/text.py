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


#: Every C0 control but tab and newline, DEL and every C1 control, shown as ``\xNN``.
_TERMINAL_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if code not in (0x09, 0x0A)}
#: The controls ``json.dumps`` leaves as they are (it escapes C0 itself), as JSON escapes of the same value.
_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in (0x7F, *range(0x80, 0xA0))}


def terminal_safe(text: str) -> str:
    """``text`` (a run's output, say) as a terminal or a page may show it: ESC and every other C0 control but
    newline and tab, DEL and the C1 controls are shown escaped (``\\x1b``), so that nothing in it can move the
    cursor, retitle the window or write the clipboard (OSC 52: ``\\x1b]52;c;…\\x07``)."""
    return text.translate(_TERMINAL_ESCAPES)


def json_terminal_safe(dumped: str) -> str:
    """JSON text (``json.dumps`` output) with DEL and the C1 controls, which ``json.dumps(ensure_ascii=False)``
    leaves raw, as ``\\u00NN`` escapes: the same JSON value, and nothing a terminal acts on."""
    return dumped.translate(_JSON_ESCAPES)
