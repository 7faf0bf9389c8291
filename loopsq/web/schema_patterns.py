"""The character rules of the create-body schemas (``body_schemas``) as ECMA-262 patterns, built from the sets of
code points the validators use (``checks.INVISIBLE_CATEGORIES``, compatibility forms, Python's and JavaScript's
whitespace). Patterns use Unicode semantics (JSON Schema's ``u`` flag), as Python's ``re`` reads them too:
characters outside the BMP appear as themselves.
"""

from __future__ import annotations

import functools
import unicodedata
from typing import Any

from loopsq.domain import limits
from loopsq.domain.checks import INVISIBLE_CATEGORIES, is_compatibility_form
from loopsq.domain.cron import MACROS
from loopsq.domain.labels import LABEL_PATTERN
from loopsq.domain.targets import is_js_whitespace

# Control and format characters exist only in planes 0, 1 and 14 (surrogates are in plane 0), compatibility forms
# in planes 0 and 1: scanning those is exact and six times faster than scanning all 1.1 million code points.
SCANNED = (range(0, 0x20000), range(0xE0000, 0xF0000))


def code_points(predicate: Any) -> list[int]:
    # Lone surrogates are left out: no regex engine of a JSON Schema validator can name them (Rust's cannot
    # compile such a class at all), and no valid Unicode string holds one. The server refuses them all the same.
    return [cp for span in SCANNED for cp in span if not 0xD800 <= cp <= 0xDFFF and predicate(chr(cp))]


@functools.cache
def character_sets() -> dict[str, frozenset[int]]:
    return {
        "bad": frozenset(code_points(lambda ch: unicodedata.category(ch) in INVISIBLE_CATEGORIES)),
        "py_ws": frozenset(code_points(str.isspace)),
        "js_ws": frozenset(cp for cp in range(0x10000) if is_js_whitespace(chr(cp))),
        # Characters with a compatibility form (fullwidth, styled, ligatures): refused in loop names.
        "compat": frozenset(code_points(is_compatibility_form)),  # planes 0 and 1 only, as controls
    }


def literal(text: str) -> str:
    """``text`` as a regex matching only itself: ECMA-262's syntax characters escaped (in its ``u`` mode no other
    character may be)."""
    return "".join("\\" + ch if ch in "^$\\.*+?()[]{}|" else ch for ch in text)


def _escape(cp: int) -> str:
    return f"\\u{cp:04x}" if cp < 0x10000 else chr(cp)


def char_class(code_points: frozenset[int], *, negate: bool = False) -> str:
    """A regex character class of ``code_points`` (or of everything else), as ranges."""
    ranges: list[tuple[int, int]] = []
    for cp in sorted(code_points):
        if ranges and cp == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    body = "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in ranges)
    return f"[{'^' if negate else ''}{body}]"


def name_pattern(ws: frozenset[int], extra_bad: frozenset[int] = frozenset()) -> str:
    """A name: whitespace around it is trimmed; the rest is not empty and has no invisible character (nor one of
    ``extra_bad``)."""
    bad = character_sets()["bad"] | extra_bad
    edge, inner, space = char_class(ws | bad, negate=True), char_class(bad, negate=True), char_class(ws)
    return f"^{space}*{edge}(?:{inner}*{edge})?{space}*$"


def visible_text_pattern(*, non_blank: bool = False) -> str:
    """Text without a control, format, bidi or zero-width character (``checks.INVISIBLE_CATEGORIES``): empty too,
    or with ``non_blank`` holding a character that is not whitespace (Python's ``str.strip``)."""
    sets = character_sets()
    inner = char_class(sets["bad"], negate=True)
    if not non_blank:
        return f"^{inner}*$"
    return f"^{inner}*{char_class(sets['bad'] | sets['py_ws'], negate=True)}{inner}*$"


@functools.cache
def patterns() -> dict[str, str]:
    """The patterns of the create bodies, by name (also what ``tests/unit/test_body_schemas.py`` checks)."""
    sets = character_sets()
    js_ws = sets["js_ws"]
    no_nul = "[^\\u0000]"
    solid = char_class(js_ws | {0}, negate=True)
    minute, hour, dom, month, dow = (r"[1-5]?[0-9]", r"1?[0-9]|2[0-3]", r"[1-9]|[12][0-9]|3[01]",
                                     r"[1-9]|1[0-2]", r"[0-7]")
    step = r"(?:/[1-9][0-9]{0,2})?"

    def field(value: str) -> str:
        part = f"(?:\\*|{value}){step}"
        return f"{part}(?:,{part})*"

    macros = "|".join(name.lstrip("@") for name in MACROS)
    return {
        # A loop name also has no character with a compatibility form inside (around it, whitespace is trimmed).
        "loopName": name_pattern(sets["py_ws"], sets["compat"]),
        "workspaceKey": name_pattern(sets["py_ws"]),
        "workflowName": name_pattern(js_ws),
        "noNul": f"^{no_nul}*$",
        "nonBlank": f"^{no_nul}*{solid}{no_nul}*$",
        # Blank as Python's str.strip sees it (the server's own checks of an opencode model and of a gate).
        "pyNonBlank": f"^{no_nul}*{char_class(sets['py_ws'] | {0}, negate=True)}{no_nul}*$",
        "noWhitespace": f"^{solid}+$",
        # An agent prompt (``agent_output.prompt_problem``): a visible character (neither whitespace nor invisible),
        # no NUL, and not a redacted copy as ``show`` prints one.
        "prompt": (f"^(?!(?:{no_nul}{{0,80}}\\.\\.\\. )?\\[redacted [0-9]+ chars\\](?!{no_nul})){no_nul}*"
                   f"{char_class(sets['bad'] | sets['py_ws'] | {0}, negate=True)}{no_nul}*$"),
        # Not blank (JavaScript's trim), NUL allowed: the later agent options' check (``targets._non_empty``).
        "nonBlankAny": f"^(?:[^\\u0000]|\\u0000)*{char_class(js_ws, negate=True)}(?:[^\\u0000]|\\u0000)*$",
        "cron": f"^(?:@(?:{macros})|{' '.join(field(v) for v in (minute, hour, dom, month, dow))})$",
        "stepId": f"^{limits.STEP_ID_PATTERN}$",
        "envKey": f"^{limits.ENV_KEY_PATTERN}$",
        "label": f"^{LABEL_PATTERN}$",
    }
