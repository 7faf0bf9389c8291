"""Checks of user-given strings against loopsq's bounds (``limits``), one message shape per problem.

Each check names the field and quotes a short escaped prefix of the value (``text.quoted``, or the caller's own
quoting, such as the CLI's single quotes).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable
from typing import Any

from loopsq.domain.text import quoted
from loopsq.errors import ValidationError

#: Unicode categories a name may not contain: controls (``Cc``: C0, DEL, C1), format characters (``Cf``: bidi
#: embeddings, overrides and isolates, zero-width space, joiners, the BOM...), surrogates, and the line and
#: paragraph separators.
INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

Quote = Callable[[str], str]


def first_invisible(text: str) -> int | None:
    """The index of the first character of ``text`` in ``INVISIBLE_CATEGORIES``, or None."""
    for index, ch in enumerate(text):
        if unicodedata.category(ch) in INVISIBLE_CATEGORIES:
            return index
    return None


def is_compatibility_form(ch: str) -> bool:
    """Whether ``ch`` is, or canonically decomposes into, a character with a compatibility decomposition
    (fullwidth A U+FF21, mathematical bold A U+1D400, the fi ligature U+FB01, superscript two, the no-break space,
    the en quad U+2000 that stands for the en space...): a character that looks like, or stands for, another. Judged
    on the canonical decomposition, so that a text has one if and only if one of its characters is one, whatever
    its normalisation form."""
    return any(unicodedata.decomposition(part).startswith("<") for part in unicodedata.normalize("NFD", ch))


def first_compatibility_form(text: str) -> int | None:
    """The index of the first character of ``text`` that is a compatibility form (``is_compatibility_form``)."""
    for index, ch in enumerate(text):
        if is_compatibility_form(ch):
            return index
    return None


def has_visible_text(text: str) -> bool:
    """Whether ``text`` holds a character that is neither whitespace nor invisible (``INVISIBLE_CATEGORIES``): a
    prompt of spaces, newlines and zero-width characters only says nothing."""
    return any(not ch.isspace() and unicodedata.category(ch) not in INVISIBLE_CATEGORIES for ch in text)


def check_length(value: str, field: str, limit: int, quote: Quote = quoted) -> str:
    """``value`` when it has at most ``limit`` characters; else ``<field> must be at most <limit> characters``."""
    if len(value) > limit:
        raise ValidationError(f"{field} must be at most {limit} characters, got {quote(value)}")
    return value


def check_no_nul(value: str, field: str, quote: Quote = quoted) -> str:
    """``value`` when it holds no NUL character (which no argv, env or path can carry)."""
    if "\x00" in value:
        raise ValidationError(f"{field} must not contain NUL characters, got {quote(value)}")
    return value


def check_visible(value: str, field: str, quote: Quote = quoted) -> str:
    """``value`` when it has no control, format, bidi or zero-width character (``INVISIBLE_CATEGORIES``)."""
    index = first_invisible(value)
    if index is not None:
        code = ord(value[index])
        raise ValidationError(
            f"{field} must not contain control, format, bidi or zero-width characters "
            f"(U+{code:04X} at position {index + 1}), got {quote(value)}"
        )
    return value


def check_text(value: str, field: str, limit: int, *, quote: Quote = quoted) -> str:
    """``value`` when it is at most ``limit`` characters long and free of NUL."""
    return check_no_nul(check_length(value, field, limit, quote), field, quote)


def whole(value: Any) -> Any:
    """``value`` as an ``int`` when it is a float holding a whole number (JSON's ``1.0`` is the integer 1, as JSON
    Schema's ``integer`` says); anything else unchanged, for the caller's own check to judge."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value
