"""Tags: ``key: value`` pairs on loops and workflows, to group and filter them (``--tag team:data``).

Bounded so that a definition stays small: at most ``MAX_TAGS`` pairs, a key of 1 to ``MAX_KEY_LENGTH`` and a value
of 1 to ``MAX_VALUE_LENGTH`` characters, both of ``TAG_CHARS`` (letters, digits, ``_ . - /``): no ``:`` (the flag's
separator), no space, nothing that needs quoting in a URL's query. A filter is a set of pairs that must all match
(AND).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from loopsq.domain.text import quoted
from loopsq.errors import ValidationError

MAX_TAGS = 20
MAX_KEY_LENGTH = 64
MAX_VALUE_LENGTH = 128
#: The characters of a tag's key and value (a regex class).
TAG_CHARS = "[A-Za-z0-9_./-]"
KEY_PATTERN = f"^{TAG_CHARS}{{1,{MAX_KEY_LENGTH}}}$"
VALUE_PATTERN = f"^{TAG_CHARS}{{1,{MAX_VALUE_LENGTH}}}$"
_KEY = re.compile(KEY_PATTERN.removeprefix("^").removesuffix("$"))
_VALUE = re.compile(VALUE_PATTERN.removeprefix("^").removesuffix("$"))
#: How a tag is written on the command line and in a query: ``KEY:VALUE``.
TAG_FORMAT = (f"KEY:VALUE, each of {TAG_CHARS} (key at most {MAX_KEY_LENGTH}, value at most {MAX_VALUE_LENGTH} "
              "characters)")


def validate_tags(value: Any, field: str = "tags") -> dict[str, str] | None:
    """A definition's ``tags``: an object of at most ``MAX_TAGS`` ``key: value`` strings (None or ``{}``: none).

    Raises:
        ValidationError: ``tags must be an object of at most 20 key: value strings, got …``, or a key or value
            outside ``TAG_CHARS`` or its length (``tags key must be …``).
    """
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) > MAX_TAGS:
        got = f"{len(value)} tags" if isinstance(value, Mapping) else quoted(value)
        raise ValidationError(f"{field} must be an object of at most {MAX_TAGS} key: value strings, got {got}")
    out: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or _KEY.fullmatch(key) is None:
            raise ValidationError(f"{field} key must be 1 to {MAX_KEY_LENGTH} characters of {TAG_CHARS}, got "
                                  f"{quoted(key)}")
        if not isinstance(item, str) or _VALUE.fullmatch(item) is None:
            raise ValidationError(f"{field}.{key} must be 1 to {MAX_VALUE_LENGTH} characters of {TAG_CHARS}, got "
                                  f"{quoted(item)}")
        out[key] = item
    return dict(sorted(out.items())) or None


def check_tag_value(value: Any, field: str) -> str:
    """A tag value on its own (e.g. an apply's owner).

    Raises:
        ValidationError: ``<field> must be 1 to 128 characters of [A-Za-z0-9_./-], got …``.
    """
    if not isinstance(value, str) or _VALUE.fullmatch(value) is None:
        raise ValidationError(f"{field} must be 1 to {MAX_VALUE_LENGTH} characters of {TAG_CHARS}, got "
                              f"{quoted(value)}")
    return value


def parse_tag(text: str, flag: str, quote: Any = quoted) -> tuple[str, str]:
    """One ``KEY:VALUE`` (a flag's or a query's).

    Raises:
        ValidationError: ``<flag> must be KEY:VALUE, each of [A-Za-z0-9_./-] (…), got '<text>'``.
    """
    key, sep, value = text.partition(":")
    if not sep or _KEY.fullmatch(key) is None or _VALUE.fullmatch(value) is None:
        raise ValidationError(f"{flag} must be {TAG_FORMAT}, got {quote(text)}")
    return key, value


#: What a filter wants of a key it was given two values of (``parse_tags(filtering=True)``): a value no tag has, so
#: that nothing matches, as the AND of the two asks.
NO_MATCH = "\x00"
#: A query's ``tag``, as the OpenAPI document states it.
TAG_PATTERN = f"^{TAG_CHARS}{{1,{MAX_KEY_LENGTH}}}:{TAG_CHARS}{{1,{MAX_VALUE_LENGTH}}}$"


def parse_tags(texts: Iterable[str], flag: str, quote: Any = quoted, *, filtering: bool = False) -> dict[str, str]:
    """Several ``KEY:VALUE`` (a repeated flag): a key given twice or more than ``MAX_TAGS`` pairs is refused.

    ``filtering``: an API query's filter, where a key given two values is the AND it says (nothing matches: the key
    wants ``NO_MATCH``) rather than a refusal the query's schema could not state."""
    out: dict[str, str] = {}
    for text in texts:
        key, value = parse_tag(text, flag, quote)
        if key in out and out[key] != value:
            if not filtering:
                raise ValidationError(f"{flag} gives {key} twice, got {quote(text)}")
            value = NO_MATCH
        out[key] = value
    if len(out) > MAX_TAGS:
        raise ValidationError(f"{flag} may be given at most {MAX_TAGS} times, got {len(out)}")
    return out


def matches(tags: Mapping[str, Any] | None, wanted: Mapping[str, str]) -> bool:
    """Whether ``tags`` has every pair of ``wanted`` (AND; an empty filter matches everything)."""
    have = tags if isinstance(tags, Mapping) else {}
    return all(have.get(key) == value for key, value in wanted.items())
