"""Secret scrubbing: known secret shapes, and the values a loop passes in its own ``env``, replaced by
``[SCRUBBED]`` in whatever loopsq stores of a run (OpenLoops 0.4.0: stored output leaked keys). Pure.

The shapes (``PATTERNS``): Anthropic keys (``sk-ant-…``), OpenAI-style keys (``sk-…``, ``sk-proj-…``), AWS access
key ids (``AKIA…``, ``ASIA…``), GitHub tokens (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_``, ``github_pat_``),
Slack tokens (``xoxa-``, ``xoxb-``, ``xoxp-``, …), PEM private-key blocks (``-----BEGIN … PRIVATE KEY-----`` and
the base64 lines after it, to its ``END`` line when there is one; also with ``\\n`` escapes, as inside JSON), and
the token of ``Bearer <token>`` (also ``bearer``, ``BEARER``; the word is kept). A token must start a word: ``task-…`` holds no
``sk-`` key.

Every pattern is linear: literal prefixes, bounded or single-class repetitions, no nested quantifiers, so a megabyte
scrubs in one pass however it is made (``bench/scrub.py`` prints the figures). A loop's env values are replaced
as literals, longest first, when they are at least ``MIN_SECRET_LENGTH`` characters long (shorter ones would eat
ordinary words).

``Scrubber`` works on text and on bytes; ``StreamScrubber`` on a stream of chunks (a child's stdout), holding back
what a secret could still continue: the unfinished last line, an open PEM block.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REPLACEMENT = "[SCRUBBED]"
#: A loop's env values shorter than this are not scrubbed.
MIN_SECRET_LENGTH = 8
#: What ``StreamScrubber`` holds back at most (an unfinished line, an open PEM block) before it lets it through.
MAX_HOLD_BYTES = 65_536

_TOKEN = "A-Za-z0-9_-"
_SEP = r"(?:\r?\n|(?:\\r)?\\n)"  # a line break, or the two characters \n of a JSON string
_PEM_HEADER = r"-----BEGIN (?:[A-Z0-9]{1,12} ){0,4}PRIVATE KEY-----"
#: (name, regex): the secret is the ``secret`` group where there is one, else the whole match.
PATTERNS: tuple[tuple[str, str], ...] = (
    ("anthropic", rf"sk-ant-[{_TOKEN}]{{20,}}"),
    # at least 20 token characters, a digit among them (checked on the match): a key, not a word such as
    # sk-learn-compatible-estimators
    ("openai", rf"(?P<openai>sk-[{_TOKEN}]{{20,}})"),
    ("aws-access-key-id", r"(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ("github", r"(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"),
    ("slack", r"xox[abeoprs]-[A-Za-z0-9-]{10,}"),
    # the header, an encrypted key's header lines (and the blank line after them), the base64 lines, and the END
    # line if it came (a blank line or any other text ends a block that has none)
    ("pem-private-key", rf"{_PEM_HEADER}(?:[\t ]*{_SEP}[A-Za-z][A-Za-z-]{{0,31}}:[^\r\n\\]{{0,256}})*"
                        rf"(?:[\t ]*{_SEP}(?=[\t ]*{_SEP}[\t ]*[A-Za-z0-9+/=]))?"
                        rf"(?:[\t ]*{_SEP}[\t ]*[A-Za-z0-9+/=]+)*"
                        rf"(?:[\t ]*{_SEP}[\t ]*-----END (?:[A-Z0-9]{{1,12}} ){{0,4}}PRIVATE KEY-----)?"),
    ("bearer", r"(?:Bearer|bearer|BEARER)[\t ]+(?P<secret>[A-Za-z0-9._~+/-]{8,}=*)"),
)
#: A shape holds one of these characters (single-character scans run at memory speed): text without any, a
#: binary flood say, is done with at once.
_FIRST_SIEVE = ("-", "_", "I", "r", "R")
#: And one of these strings (each one scan; the GitHub ones only where "gh" is): text holding none of them cannot
#: hold a shape, and the regex is not run.
_MARKERS = ("sk-", "IA", "xox", "-----BEGIN ", "earer", "EARER")
_GITHUB_MARKERS = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")
_FIRST_SIEVE_BYTES = tuple(marker.encode() for marker in _FIRST_SIEVE)
_MARKER_BYTES = tuple(marker.encode() for marker in _MARKERS)
_GITHUB_MARKER_BYTES = tuple(marker.encode() for marker in _GITHUB_MARKERS)


def _may_hold_shape(value: Any, sieve: tuple[Any, ...], markers: tuple[Any, ...], gh: Any,
                    github: tuple[Any, ...]) -> bool:
    if not any(mark in value for mark in sieve):
        return False
    if any(marker in value for marker in markers):
        return True
    return gh in value and any(marker in value for marker in github)


_ALTERNATION = "|".join(f"(?:{regex})" for _name, regex in PATTERNS)
_TEXT_RE = re.compile(_ALTERNATION)
_BYTES_RE = re.compile(_ALTERNATION.encode())
_REPLACEMENT_BYTES = REPLACEMENT.encode()
_PEM_OPEN = re.compile(rb"-----BEGIN [A-Z0-9 ]{0,52}PRIVATE KEY-----")
_PEM_END = b"-----END "
_DIGIT = re.compile("[0-9]")
_DIGIT_BYTES = re.compile(b"[0-9]")
_WORD_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
_WORD_BYTES = frozenset(_WORD_CHARS.encode())
_TOKEN_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+/=.")


# A shape must start a word (``task-…`` holds no ``sk-`` key). That is checked here rather than with a lookbehind
# in the pattern, which would cost the regex engine its fast scan for the patterns' first characters (8x slower).
def _text_sub(match: re.Match[str]) -> str:
    start = match.start()
    if start and match.string[start - 1] in _WORD_CHARS:
        return match.group(0)
    if match.start("openai") >= 0 and not _DIGIT.search(match.group(0)):
        return match.group(0)
    secret = match.start("secret")
    return REPLACEMENT if secret < 0 else match.group(0)[: secret - start] + REPLACEMENT


def _bytes_sub(match: re.Match[bytes]) -> bytes:
    start = match.start()
    if start and match.string[start - 1] in _WORD_BYTES:
        return match.group(0)
    if match.start("openai") >= 0 and not _DIGIT_BYTES.search(match.group(0)):
        return match.group(0)
    secret = match.start("secret")
    return _REPLACEMENT_BYTES if secret < 0 else match.group(0)[: secret - start] + _REPLACEMENT_BYTES


def secret_values(env: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The values of a target's own ``env`` worth scrubbing: strings of at least ``MIN_SECRET_LENGTH``
    characters, longest first (so that a value containing another is replaced whole)."""
    if not isinstance(env, Mapping):
        return ()
    found = {value for value in env.values() if isinstance(value, str) and len(value) >= MIN_SECRET_LENGTH}
    return tuple(sorted(found, key=lambda value: (-len(value), value)))


class Scrubber:
    """Replaces the secret shapes and ``secrets`` (literal values, e.g. ``secret_values(env)``)."""

    __slots__ = ("_secret_bytes", "secrets")

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        ordered = sorted({s for s in secrets if s}, key=lambda value: (-len(value), value))
        self.secrets = tuple(ordered)
        self._secret_bytes = tuple(s.encode("utf-8", "surrogateescape") for s in ordered)

    def text(self, value: str) -> str:
        """``value`` scrubbed."""
        if not value:
            return value
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, REPLACEMENT)
        if not _may_hold_shape(value, _FIRST_SIEVE, _MARKERS, "gh", _GITHUB_MARKERS):
            return value
        return _TEXT_RE.sub(_text_sub, value)

    def data(self, value: bytes) -> bytes:
        """``value`` (bytes) scrubbed."""
        if not value:
            return value
        for secret in self._secret_bytes:
            if secret in value:
                value = value.replace(secret, _REPLACEMENT_BYTES)
        if not _may_hold_shape(value, _FIRST_SIEVE_BYTES, _MARKER_BYTES, b"gh", _GITHUB_MARKER_BYTES):
            return value
        return _BYTES_RE.sub(_bytes_sub, value)

    def optional(self, value: str | None) -> str | None:
        """``text`` for a value that may be None."""
        return None if value is None else self.text(value)

    def tree(self, value: Any) -> Any:
        """Every string inside ``value`` (dicts, lists, strings) scrubbed; anything else as it is."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {key: self.tree(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.tree(item) for item in value]
        return value


#: The shapes alone (no env values): for what has no loop at hand.
SHAPES = Scrubber()


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the secret shapes and ``secrets`` replaced by ``[SCRUBBED]``."""
    return (Scrubber(secrets) if secrets else SHAPES).text(text)


class StreamScrubber:
    """Scrubs a byte stream chunk by chunk without cutting a secret in two: ``feed`` returns what is safe to pass
    on (up to the last line break, and not from an open PEM block on), ``finish`` the rest.

    What is held back is bounded by ``max_hold``: past it, the held bytes go through up to the last character that
    cannot belong to a token (or whole, if there is none).
    """

    __slots__ = ("_held", "max_hold", "scrubber")

    def __init__(self, scrubber: Scrubber, max_hold: int = MAX_HOLD_BYTES) -> None:
        self.scrubber = scrubber
        self.max_hold = max_hold
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """The scrubbed bytes that ``chunk`` (after what was held) lets through; possibly none."""
        data = self._held + chunk if self._held else chunk
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        opened = data.rfind(b"-----BEGIN ", 0, cut)
        if opened >= 0 and _PEM_OPEN.match(data, opened) and data.find(_PEM_END, opened, cut) < 0:
            cut = opened  # a private key block goes through whole, once its END line came
        if len(data) - cut > self.max_hold:
            cut = _safe_cut(data, len(data) - self.max_hold // 2)
        self._held = data[cut:]
        return self.scrubber.data(data[:cut]) if cut else b""

    def finish(self) -> bytes:
        """The scrubbed rest, at the end of the stream."""
        rest, self._held = self._held, b""
        return self.scrubber.data(rest)


def _safe_cut(data: bytes, limit: int) -> int:
    """A cut at or before ``limit`` just after a byte that no token contains (``limit`` when there is none
    within 4 KiB of it)."""
    for index in range(limit - 1, max(-1, limit - 4096), -1):
        if data[index] not in _TOKEN_BYTES:
            return index + 1
    return limit
